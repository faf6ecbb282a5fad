#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <arpa/inet.h>
#include "shim.h"

int go_poll_cq(uintptr_t cq_addr, int n, uintptr_t out_addr, int retries)
{
	struct ibv_cq *cq = (struct ibv_cq *)cq_addr;
	struct go_wc *out = (struct go_wc *)out_addr;
	struct ibv_wc wc[64];
	int total = 0;
	while (total < n) {
		int want = n - total > 64 ? 64 : n - total;
		int got = ibv_poll_cq(cq, want, wc);
		if (got < 0)
			return got;
		if (got == 0 && total == 0 && retries-- > 0)
			continue;
		for (int i = 0; i < got; i++) {
			struct go_wc *o = &out[total + i];
			o->wr_id = wc[i].wr_id;
			o->status = wc[i].status;
			o->opcode = wc[i].opcode;
			o->vendor_err = wc[i].vendor_err;
			o->byte_len = wc[i].byte_len;
			o->imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0;
			o->wc_flags = wc[i].wc_flags;
			o->qp_num = wc[i].qp_num;
			o->src_qp = wc[i].src_qp;
			o->slid = wc[i].slid;
			o->sl = wc[i].sl;
			o->dlid_path_bits = wc[i].dlid_path_bits;
		}
		total += got;
		if (got < want)
			break;
	}
	return total;
}

static int post_sends(struct ibv_qp *qp, struct go_batch *b)
{
	struct go_send_wr *wrs = b->wrs;
	struct ibv_send_wr *scratch = b->scratch;
	struct ibv_send_wr *bad_wr = NULL;
	for (int i = 0; i < b->n; i++) {
		struct ibv_send_wr *w = &scratch[i];
		struct go_send_wr *g = &wrs[i];
		memset(w, 0, sizeof(*w));
		w->wr_id = g->wr_id;
		w->next = i + 1 < b->n ? &scratch[i + 1] : NULL;
		w->sg_list = g->num_sge ? &b->sge[g->sge_first] : NULL;
		w->num_sge = g->num_sge;
		w->opcode = g->opcode;
		w->send_flags = g->send_flags;
		switch (g->opcode) {
		case IBV_WR_SEND_WITH_IMM:
			w->imm_data = htonl(g->imm);
			break;
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			w->imm_data = htonl(g->imm);
			/* fall through */
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_READ:
			w->wr.rdma.remote_addr = g->remote_addr;
			w->wr.rdma.rkey = g->rkey;
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			w->wr.atomic.remote_addr = g->remote_addr;
			w->wr.atomic.rkey = g->rkey;
			w->wr.atomic.compare_add = g->compare_add;
			w->wr.atomic.swap = g->swap;
			break;
		}
		if (g->ah) {
			w->wr.ud.ah = (struct ibv_ah *)g->ah;
			w->wr.ud.remote_qpn = g->remote_qpn;
			w->wr.ud.remote_qkey = g->remote_qkey;
		}
	}
	errno = 0;
	int ret = ibv_post_send(qp, scratch, &bad_wr);
	/* siw's provider returns its doorbell's write(2): -1, errno set. */
	if (ret == -1 && errno)
		ret = errno;
	if (ret) {
		/* rxe's and siw's providers write every request into a queue the
		 * device maps, then ring the kernel's doorbell; a refused doorbell
		 * fails the call with bad_wr NULL, every request queued. Other
		 * providers name the request on every failure. */
		b->bad = bad_wr ? (int)(bad_wr - scratch) : b->n;
	} else if (bad_wr) {
		/* siw's provider returns its doorbell's success over a request it
		 * refused behind ones it queued. */
		b->bad = (int)(bad_wr - scratch);
		ret = EINVAL;
	}
	return ret;
}

static int post_recvs(struct ibv_qp *qp, struct ibv_srq *srq, struct go_batch *b)
{
	struct go_recv_wr *wrs = b->wrs;
	struct ibv_recv_wr *scratch = b->scratch;
	struct ibv_recv_wr *bad_wr = NULL;
	for (int i = 0; i < b->n; i++) {
		struct ibv_recv_wr *w = &scratch[i];
		w->wr_id = wrs[i].wr_id;
		w->next = i + 1 < b->n ? &scratch[i + 1] : NULL;
		w->sg_list = wrs[i].num_sge ? &b->sge[wrs[i].sge_first] : NULL;
		w->num_sge = wrs[i].num_sge;
	}
	int ret = srq ? ibv_post_srq_recv(srq, scratch, &bad_wr) : ibv_post_recv(qp, scratch, &bad_wr);
	if (ret)
		b->bad = bad_wr ? (int)(bad_wr - scratch) : 0;
	return ret;
}

int go_post(uintptr_t qp_addr, uintptr_t srq_addr, uintptr_t recv_addr, uintptr_t send_addr)
{
	struct ibv_qp *qp = (struct ibv_qp *)qp_addr;
	struct go_batch *recv = (struct go_batch *)recv_addr;
	struct go_batch *send = (struct go_batch *)send_addr;
	int ret;
	if (recv)
		recv->bad = -1;
	if (send)
		send->bad = -1;
	if (recv && recv->n > 0) {
		if ((ret = post_recvs(qp, (struct ibv_srq *)srq_addr, recv)))
			return ret;
	}
	if (send && send->n > 0) {
		if ((ret = post_sends(qp, send)))
			return ret;
	}
	return 0;
}

int go_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

int go_get_cq_event(struct ibv_comp_channel *ch)
{
	struct ibv_cq *cq;
	void *ctx;
	return ibv_get_cq_event(ch, &cq, &ctx);
}

int go_rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	sigset_t async, old;
	int ret, saved;

	/* A fault while blocked would kill the process without the runtime's
	 * report: the synchronous signals stay open. */
	sigfillset(&async);
	sigdelset(&async, SIGSEGV);
	sigdelset(&async, SIGBUS);
	sigdelset(&async, SIGFPE);
	sigdelset(&async, SIGILL);
	sigdelset(&async, SIGTRAP);
	pthread_sigmask(SIG_BLOCK, &async, &old);
	ret = rdma_connect(id, param);
	saved = errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	errno = saved;
	return ret;
}
