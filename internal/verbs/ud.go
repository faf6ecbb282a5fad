package verbs

/*
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include "shim.h"

// go_sockaddr fills ss with an IPv4 (len 4) or IPv6 (len 16) address and a
// port in host order.
static void go_sockaddr(struct sockaddr_storage *ss, const uint8_t *ip, int len, uint16_t port)
{
	memset(ss, 0, sizeof(*ss));
	if (len == 4) {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		memcpy(&in->sin_addr, ip, 4);
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
		memcpy(&in6->sin6_addr, ip, 16);
	}
}

static int go_bind(struct rdma_cm_id *id, const uint8_t *ip, int len, uint16_t port)
{
	struct sockaddr_storage ss;
	go_sockaddr(&ss, ip, len, port);
	return rdma_bind_addr(id, (struct sockaddr *)&ss);
}

static int go_resolve_from(struct rdma_cm_id *id, const uint8_t *ip, int len, struct sockaddr *dst, int ms)
{
	struct sockaddr_storage ss;
	go_sockaddr(&ss, ip, len, 0);
	return rdma_resolve_addr(id, (struct sockaddr *)&ss, dst, ms);
}

static int go_join(struct rdma_cm_id *id, const uint8_t *ip, int len)
{
	struct sockaddr_storage ss;
	go_sockaddr(&ss, ip, len, 0);
	return rdma_join_multicast(id, (struct sockaddr *)&ss, NULL);
}

static int go_leave(struct rdma_cm_id *id, const uint8_t *ip, int len)
{
	struct sockaddr_storage ss;
	go_sockaddr(&ss, ip, len, 0);
	return rdma_leave_multicast(id, (struct sockaddr *)&ss);
}

static struct ibv_ah *go_ah_from_wc(struct ibv_pd *pd, uint8_t port, uint32_t src_qp, uint16_t slid,
	uint8_t sl, uint8_t path_bits, const uint8_t *grh)
{
	struct ibv_wc wc;
	memset(&wc, 0, sizeof(wc));
	wc.wc_flags = IBV_WC_GRH;
	wc.src_qp = src_qp;
	wc.slid = slid;
	wc.sl = sl;
	wc.dlid_path_bits = path_bits;
	return ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)grh, port);
}

static int go_mcast(struct ibv_qp *qp, struct ibv_ah_attr *a, int attach)
{
	return attach ? ibv_attach_mcast(qp, &a->grh.dgid, a->dlid) : ibv_detach_mcast(qp, &a->grh.dgid, a->dlid);
}

static uint32_t go_qkey(struct ibv_qp *qp, int *err)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	*err = ibv_query_qp(qp, &attr, IBV_QP_QKEY, &init);
	return attr.qkey;
}
*/
import "C"

import (
	"fmt"
	"net"
	"unsafe"
)

// GRHSize is the room at the start of every unreliable datagram receive
// buffer where the device writes the global route header (on RoCE v2 over
// IPv4, the IPv4 header in its last 20 bytes).
const GRHSize = 40

// MulticastQPN is the destination QP number of a datagram sent to a group.
const MulticastQPN = 0xFFFFFF

// ipBytes is ip as 4 bytes when it is IPv4, else 16.
func ipBytes(ip net.IP) []byte {
	if v4 := ip.To4(); v4 != nil {
		return v4
	}
	return ip.To16()
}

// cIP copies ip into C memory for a call that takes it by pointer; free it.
func cIP(ip net.IP) (*C.uint8_t, C.int, func()) {
	b := ipBytes(ip)
	p := C.CBytes(b)
	return (*C.uint8_t)(p), C.int(len(b)), func() { C.free(p) }
}

// BindIP binds the id to ip and port (0: any free port), on the device
// that has ip (rdma_bind_addr).
func (id *CMID) BindIP(ip net.IP, port int) error {
	p, n, free := cIP(ip)
	defer free()
	if ret, err := C.go_bind(id.p, p, n, C.uint16_t(port)); ret != 0 {
		return callError(fmt.Sprintf("rdma_bind_addr %s", net.JoinHostPort(ip.String(), fmt.Sprint(port))), err)
	}
	return nil
}

// ResolveAddrFrom is ResolveAddr from the local address src, so that the
// route leaves from src's device; ADDR_RESOLVED or ADDR_ERROR follows.
func (id *CMID) ResolveAddrFrom(src net.IP, ai *AddrInfo, timeoutMs int) error {
	p, n, free := cIP(src)
	defer free()
	if ret, err := C.go_resolve_from(id.p, p, n, ai.p.ai_dst_addr, C.int(timeoutMs)); ret != 0 {
		return callError("rdma_resolve_addr", err)
	}
	return nil
}

// JoinMulticast asks to join the group (an id bound to a local address);
// MULTICAST_JOIN, carrying the group's address handle attributes, or
// MULTICAST_ERROR follows.
func (id *CMID) JoinMulticast(group net.IP) error {
	p, n, free := cIP(group)
	defer free()
	if ret, err := C.go_join(id.p, p, n); ret != 0 {
		return callError("rdma_join_multicast "+group.String(), err)
	}
	return nil
}

// LeaveMulticast leaves a group joined with JoinMulticast.
func (id *CMID) LeaveMulticast(group net.IP) error {
	p, n, free := cIP(group)
	defer free()
	if ret, err := C.go_leave(id.p, p, n); ret != 0 {
		return callError("rdma_leave_multicast "+group.String(), err)
	}
	return nil
}

// PortNum is the device port the id is bound to.
func (id *CMID) PortNum() int { return int(id.p.port_num) }

// QPNum is the number of the id's QP (CreateQP first).
func (id *CMID) QPNum() uint32 { return uint32(id.p.qp.qp_num) }

// QKey is the Q_Key of the id's datagram QP: a datagram is delivered to it
// only if its sender names this key.
func (id *CMID) QKey() (uint32, error) {
	var ret C.int
	k := C.go_qkey(id.p.qp, &ret)
	if ret != 0 {
		return 0, retErrno("ibv_query_qp(QKEY)", ret)
	}
	return uint32(k), nil
}

// AttachMulticast makes the id's QP receive the group's datagrams
// (ibv_attach_mcast), with the group from its MULTICAST_JOIN event.
func (id *CMID) AttachMulticast(group *UDParam) error {
	return retErrno("ibv_attach_mcast", C.go_mcast(id.p.qp, &group.ahAttr, 1))
}

// DetachMulticast undoes AttachMulticast.
func (id *CMID) DetachMulticast(group *UDParam) error {
	return retErrno("ibv_detach_mcast", C.go_mcast(id.p.qp, &group.ahAttr, 0))
}

// AH is an address handle: the path to one datagram destination.
type AH struct{ p *C.struct_ibv_ah }

// CreateAH makes the address handle of a peer or group from its event.
func (pd *PD) CreateAH(ud *UDParam) (*AH, error) {
	if err := injectedCreateFault(AHs); err != nil {
		return nil, callError("ibv_create_ah", err)
	}
	attr := ud.ahAttr
	p, err := C.ibv_create_ah(pd.p, &attr)
	if p == nil {
		return nil, callError("ibv_create_ah", err)
	}
	return &AH{p: p}, nil
}

// Sender is what answering the sender of a received datagram takes: its
// completion's source fields and its GRH, copied so that the address
// handle can be made later (AHTo), when the first reply is sent.
type Sender struct {
	srcQP    uint32
	slid     uint16
	sl       uint8
	pathBits uint8
	grh      [GRHSize]byte
}

// SenderOf copies what AHTo needs from a receive's completion and the
// GRHSize bytes at the start of its buffer.
func SenderOf(wc *WC, grh []byte) *Sender {
	s := &Sender{srcQP: wc.SrcQP, slid: wc.SLID, sl: wc.SL, pathBits: wc.DLIDPathBits}
	copy(s.grh[:], grh)
	return s
}

// AHTo makes the address handle that answers s (ibv_create_ah_from_wc).
func (pd *PD) AHTo(port int, s *Sender) (*AH, error) {
	if err := injectedCreateFault(AHs); err != nil {
		return nil, callError("ibv_create_ah_from_wc", err)
	}
	p, err := C.go_ah_from_wc(pd.p, C.uint8_t(port), C.uint32_t(s.srcQP), C.uint16_t(s.slid),
		C.uint8_t(s.sl), C.uint8_t(s.pathBits), (*C.uint8_t)(unsafe.Pointer(&s.grh[0])))
	if p == nil {
		return nil, callError("ibv_create_ah_from_wc", err)
	}
	return &AH{p: p}, nil
}

// Destroy frees the address handle; no posted send may still name it. A
// nil or zero AH has nothing to free.
func (ah *AH) Destroy() error {
	if ah == nil || ah.p == nil {
		return nil
	}
	return retErrno("ibv_destroy_ah", C.ibv_destroy_ah(ah.p))
}

// WCGRH is set in WC.Flags when the receive buffer starts with a GRH.
const WCGRH = C.IBV_WC_GRH
