//go:build !rdmacm_faultinject

package verbs

// Faults are injected only in builds with the rdmacm_faultinject tag
// (fault.go); here the hooks do nothing and compile away.

func (cq *CQ) stashedPoll() (int, bool)                { return 0, false }
func (cq *CQ) injectedFault(n int) (int, error)        { return n, nil }
func (cq *CQ) forgetStash()                            {}
func (ch *CompChannel) injectedFault() error           { return nil }
func (c *EventChannel) injectedFault() error           { return nil }
func (c *Context) injectedAsyncFault() error           { return nil }
func injectedDisconnectFault() error                   { return nil }
func injectedArmFault() error                          { return nil }
func injectedQPMoveFault() error                       { return nil }
func (id *CMID) injectedListenFault() error            { return nil }
func injectedRefusal(nrecv, nsend int) (refusal, bool) { return refusal{}, false }
func injectedCreateFault(Resource) error               { return nil }
func injectedCQSize(cqe int) (int, bool)               { return cqe, false }
func (cq *CQ) markShrunk()                             {}
func noteQPCreated(uintptr)                            {}
func injectedRewrite(ev AsyncEvent) AsyncEvent         { return ev }
