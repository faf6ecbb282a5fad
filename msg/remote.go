package msg

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/seam"
)

// One-sided access on a message connection: RDMA WRITE, READ and atomics
// on the peer's memory, over the same queue pair as the messages. The
// owner registers a region on its connection's protection domain
// (bufpool.NewRegion(c.PD(), size, access)) and sends region.Remote(),
// marshalled, as a message; the peer then reads and writes that memory
// without the owner's CPU taking part, and the owner closes the region
// once the peer is done with it (say so in a message).
//
// A one-sided operation that fails on the device (a wrong key, a range
// past the region, access the region was not registered for) ends the
// connection, as every failed work request on an RC queue pair does.

// maxOneSided is how many one-sided operations of a connection may be in
// flight at once; each takes up to two send queue slots beyond those the
// messages need (connOptions), and more callers wait for one.
const maxOneSided = 8

// PD is the connection's protection domain: register the regions the peer
// may access on it (bufpool.NewRegion).
func (c *Conn) PD() *bufpool.PD {
	if !c.made() {
		return nil
	}
	return c.ep.PD()
}

// WriteRemote writes p to the start of the peer's region remote (RDMA
// WRITE) and returns once the bytes are in the peer's memory, on every
// device (on iWARP, where a write completes once TCP took it, a
// zero-length RDMA READ behind it proves that). p is copied into
// registered memory first.
func (c *Conn) WriteRemote(ctx context.Context, remote bufpool.Remote, p []byte) error {
	return c.oneSided(ctx, endpoint.Request{Op: endpoint.OpWrite, Remote: remote}, p, nil)
}

// ReadRemote reads len(p) bytes from the start of the peer's region remote
// into p (RDMA READ).
func (c *Conn) ReadRemote(ctx context.Context, remote bufpool.Remote, p []byte) error {
	return c.oneSided(ctx, endpoint.Request{Op: endpoint.OpRead, Remote: remote}, nil, p)
}

// CompareAndSwap compares the 8-byte word at the start of remote (8-byte
// aligned, in the peer's byte order) with compare and, if they are equal,
// stores swap; it returns the word's old value. Devices without atomics
// (iWARP) refuse it with an error matching endpoint.ErrNoAtomics.
func (c *Conn) CompareAndSwap(ctx context.Context, remote bufpool.Remote, compare, swap uint64) (old uint64, err error) {
	return c.atomic(ctx, endpoint.Request{Op: endpoint.OpCompareAndSwap, Remote: remote, Compare: compare, Swap: swap})
}

// FetchAndAdd adds add to the 8-byte word at the start of remote (8-byte
// aligned) and returns its old value. Devices without atomics refuse it
// with an error matching endpoint.ErrNoAtomics.
func (c *Conn) FetchAndAdd(ctx context.Context, remote bufpool.Remote, add uint64) (old uint64, err error) {
	return c.atomic(ctx, endpoint.Request{Op: endpoint.OpFetchAndAdd, Remote: remote, Add: add})
}

func (c *Conn) atomic(ctx context.Context, r endpoint.Request) (uint64, error) {
	var old [8]byte
	if err := c.oneSided(ctx, r, nil, old[:]); err != nil {
		return 0, err
	}
	return binary.NativeEndian.Uint64(old[:]), nil
}

// oneSided posts r on registered memory holding out (a write's data) or
// of in's length (what a read or atomic brings, copied into in once it
// completed), and waits for its completion. ctx bounds the waits before
// the post; once posted, the call waits for the device, which hands every
// work request back (the connection's end flushes it).
func (c *Conn) oneSided(ctx context.Context, r endpoint.Request, out, in []byte) error {
	if !c.made() {
		return errConnNotMade
	}
	n := len(out) + len(in)
	if n == 0 {
		return fmt.Errorf("msg: a %v of 0 bytes: %w", r.Op, endpoint.ErrInvalid)
	}
	select {
	case c.oneSidedSlots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return c.endedErr()
	}
	defer func() { <-c.oneSidedSlots }()
	// One-sided operations are messages on the wire too: the accepting
	// side waits until the dialer has spoken.
	if err := c.waitFor(ctx, func() bool { return c.mayTalk }); err != nil {
		return err
	}
	c.mu.Unlock()

	// The bytes go through a region of the connection's cache, kept
	// registered from one call to the next (as rendezvous regions are):
	// registering memory for each call would cost more than the call. The
	// local side of an RDMA READ is registered for remote write too: iWARP
	// requires it of a READ's sink. Its key never leaves this side.
	access := bufpool.Access(0)
	if r.Op == endpoint.OpRead {
		access = bufpool.RemoteWrite
	}
	region, err := c.rv.get(n, access)
	if err != nil {
		return fmt.Errorf("msg: registering %d bytes for a %v: %w", n, r.Op, err)
	}
	defer c.rv.put(region, access)
	copy(region.Bytes(), out)

	done := make(chan endpoint.Completion, 2)
	r.Buffer, r.Length, r.Notify = region.Buffer(), n, done
	reqs := []endpoint.Request{r}
	if r.Op == endpoint.OpWrite && seam.SendsCompleteLocally(c.ep) {
		// On iWARP the write's completion says only that TCP took the
		// bytes. A zero-length READ behind it is answered once the peer
		// has placed them, so that the call returns, on every device,
		// once the bytes are in the peer's memory.
		reqs = append(reqs, endpoint.Request{Op: endpoint.OpRead, Buffer: region.Buffer(), Notify: done})
	}
	reads := r.Op != endpoint.OpWrite || len(reqs) > 1
	if reads { // the peer's messages queue behind the reply: not silence
		c.mu.Lock()
		c.reading++
		c.mu.Unlock()
	}
	err = c.ep.PostBatch(reqs)
	posted := len(reqs)
	if err != nil {
		posted = 0
		if pe, ok := errors.AsType[*endpoint.PostError](err); ok {
			posted = pe.Index
		}
	}
	for range posted {
		// This goroutine drives the endpoint while it waits; once the
		// endpoint is closing, the completion goroutine hands it the
		// flushed completion. The wait is the device's: no ctx bounds it.
		comp, ok := driveFor(c, context.Background(), done)
		if !ok {
			comp = <-done
		}
		if err == nil {
			err = comp.Err
		}
	}
	if reads {
		c.mu.Lock()
		c.reading--
		c.mu.Unlock()
	}
	if errors.Is(err, endpoint.ErrClosed) {
		// The connection ended under it: say why, as its other calls do.
		err = c.endError(r.Op.String(), err)
		c.mu.Lock()
		err = c.calledAfterCloseLocked(err)
		c.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("msg: %v of %d bytes: %w", r.Op, n, err)
	}
	copy(in, region.Bytes()) // before the deferred put gives the region back
	return nil
}
