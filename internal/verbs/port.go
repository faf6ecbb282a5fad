package verbs

/*
#include <infiniband/verbs.h>

// ibv_query_port is a macro over a compat symbol that cgo cannot call.
static int go_query_port(struct ibv_context *ctx, uint8_t port, int *state, int *mtu)
{
	struct ibv_port_attr a;
	int ret = ibv_query_port(ctx, port, &a);
	*state = a.state;
	*mtu = a.active_mtu;
	return ret;
}
*/
import "C"

// PortState is libibverbs' enum ibv_port_state: whether a port carries
// traffic (Soft-RoCE's and soft-iWARP's follow their netdev).
type PortState int

// Port states: a port that carries traffic, and one whose link is down.
const (
	PortActive PortState = C.IBV_PORT_ACTIVE
	PortDown   PortState = C.IBV_PORT_DOWN
)

// String is libibverbs' name for the state (ibv_port_state_str), e.g.
// "down".
func (s PortState) String() string {
	return C.GoString(C.ibv_port_state_str(C.enum_ibv_port_state(s)))
}

// queryPort is ibv_query_port's state and active MTU (an enum ibv_mtu).
func (c *Context) queryPort(port int) (state PortState, mtu int, err error) {
	var st, m C.int
	if ret := C.go_query_port(c.p, C.uint8_t(port), &st, &m); ret != 0 {
		return 0, 0, retErrno("ibv_query_port", ret)
	}
	return PortState(st), int(m), nil
}

// PortState is the port's state now.
func (c *Context) PortState(port int) (PortState, error) {
	state, _, err := c.queryPort(port)
	return state, err
}

// ActiveMTU is the port's active MTU in bytes: the largest datagram payload.
func (c *Context) ActiveMTU(port int) (int, error) {
	_, mtu, err := c.queryPort(port)
	if err != nil {
		return 0, err
	}
	return 1 << (mtu + 7), nil
}
