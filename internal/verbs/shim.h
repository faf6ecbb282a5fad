// C helpers for package verbs. They exist where cgo cannot express the C
// directly: anonymous unions (ibv_wc.imm_data), building a chain of work
// requests with their next pointers in C memory, and static inline calls
// whose out-parameters must live in C memory.
#ifndef RDMACM_GO_SHIM_H
#define RDMACM_GO_SHIM_H

#include <stdint.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

// One work completion, flattened. imm is in host byte order.
struct go_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm;
	uint32_t wc_flags;
	uint32_t qp_num;
	// Unreliable datagram receives: the sender's QP number, LID, service
	// level and path bits (what ibv_create_ah_from_wc reads).
	uint32_t src_qp;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
};

// One send work request; its scatter/gather entries are sge[sge_first ..
// sge_first+num_sge) of the array passed alongside. imm is in host order.
struct go_send_wr {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t compare_add;
	uint64_t swap;
	uint32_t rkey;
	uint32_t opcode;
	uint32_t send_flags;
	uint32_t imm;
	uint32_t sge_first;
	uint32_t num_sge;
	// Unreliable datagram sends: the address handle (0 on connected QPs),
	// the destination QP number and its Q_Key.
	uintptr_t ah;
	uint32_t remote_qpn;
	uint32_t remote_qkey;
};

struct go_recv_wr {
	uint64_t wr_id;
	uint32_t sge_first;
	uint32_t num_sge;
};

// A batch of work requests in C memory: wrs (struct go_send_wr or
// go_recv_wr), their scatter/gather entries, and scratch room to link them
// as ibv_send_wr or ibv_recv_wr. After a failed post, bad is the index of
// the first request not posted, n when a send batch was queued whole but
// the device refused to start it (-1 in a batch that did not fail).
struct go_batch {
	void *wrs;
	struct ibv_sge *sge;
	void *scratch;
	int n;
	int bad;
};

// The hot calls (poll, post) take their C pointers as integers: cgo checks
// every pointer argument for Go memory on each call, which costs more than
// the poll itself under emulation. Every one of them points to C memory.
// go_poll_cq polls up to n completions into out. While the CQ is empty it
// polls up to retries more times before it returns 0: a spinning caller
// then pays one crossing from Go for many polls.
int go_poll_cq(uintptr_t cq, int n, uintptr_t out, int retries);
// go_post posts the receives of recv (to srq when it is not 0, else to qp),
// then the sends of send, so that a batch of both kinds crosses from Go
// into C once. Either batch may be 0. On failure it returns the error and
// sets the failing batch's bad; after failed receives no send is posted.
int go_post(uintptr_t qp, uintptr_t srq, uintptr_t recv, uintptr_t send);
int go_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int go_get_cq_event(struct ibv_comp_channel *ch);

/* go_rdma_connect is rdma_connect with the asynchronous signals blocked on
 * the calling thread, errno kept. On iWARP the kernel makes the TCP
 * connection inside rdma_connect; a signal that arrives meanwhile (the
 * SIGCHLD of a child that exited, the Go runtime's own) interrupts the
 * connect and the kernel restarts the call, and siw then leaves the
 * listener's endpoint on the aborted connection, whose close ends the
 * listener (every later dial to it is refused). Process-directed signals
 * go to another thread meanwhile; signals aimed at this thread wait until
 * it returns. */
int go_rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *param);

#endif
