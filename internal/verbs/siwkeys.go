package verbs

/*
#include <rdma/siw-abi.h>
#include "shim.h"
*/
import "C"

import "sync"

// siwVendorID is soft-iWARP's vendor id (ASCII "bmt"), which hardware does
// not use.
const siwVendorID = 0x626d74

// soft-iWARP's user library (rdma-core's siw provider) takes the mmap
// offset SIW_INVAL_UOBJ_KEY (page 144) to mean "no key", but the kernel
// hands queue offsets out a page at a time from the lowest free one and
// gives that one out too. A CQ, QP or SRQ whose queue would be mapped
// there is refused with no errno, its pages are freed, and the next queue
// lands there again: with queues of one page every queue beyond the first
// 144 pages fails, with larger ones one now and then does. GuardSiwKeys
// works around it: once per context, before the context's first queue, it
// makes one CQ large enough to span that page, so that no later queue's
// mapping can start on it. The CQ is never destroyed: the context is
// librdmacm's, open for the process's life. It costs siw about 1 MiB of
// kernel memory per process and one CQ in `rdma res`.
var siwGuards sync.Map // Context.Key() -> *siwGuard

type siwGuard struct {
	once sync.Once
	cq   *C.struct_ibv_cq
	err  error
}

// siwGuardEntries is the guard CQ's size: from the context's first page,
// its mapping reaches the refused offset (144 pages). The kernel rounds it
// up to a power of two, 32768 entries or 257 pages, so the guard spans
// that page wherever below it the guard starts.
const siwGuardEntries = C.SIW_INVAL_UOBJ_KEY / C.sizeof_struct_siw_cqe

// GuardSiwKeys makes the context's guard CQ if the device is soft-iWARP
// and has none yet (see siwGuards); on any other device it does nothing.
// It returns the guard's failure, every time (it is made once). NewCQ and
// NewSRQ call it and go on without a guard: their queues then meet siw's
// refusals as before. A test that counts the device's resources calls it
// first, so that the guard is not counted as a test's leak.
func (c *Context) GuardSiwKeys() error {
	attr, err := c.QueryDevice()
	if err != nil || !attr.IWARP || attr.VendorID != siwVendorID {
		return err
	}
	v, ok := siwGuards.Load(c.Key())
	if !ok { // a guard to store only the first time: every queue comes here
		v, _ = siwGuards.LoadOrStore(c.Key(), &siwGuard{})
	}
	g := v.(*siwGuard)
	g.once.Do(func() {
		p, err := C.ibv_create_cq(c.p, C.int(siwGuardEntries), nil, nil, 0)
		if p == nil {
			g.err = callError("ibv_create_cq (soft-iWARP's key guard)", err)
			return
		}
		g.cq = p
	})
	return g.err
}
