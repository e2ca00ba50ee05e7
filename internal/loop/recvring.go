package loop

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/uring"
)

// MaxRecvBufs is the most buffers a provided-buffer ring holds (buffer ids are 16 bits and
// the kernel caps a ring at 32768 entries).
const MaxRecvBufs = 32768

// RecvRingConfig configures a provided-buffer ring.
type RecvRingConfig struct {
	Bufs    int  // the most buffers the ring will hold (1..MaxRecvBufs)
	BufSize int  // bytes per buffer
	Bundles bool // use recv bundles (one CQE for several buffers)
	// Grow, when not nil, is asked for more buffers before a receiver waits for returned
	// ones (WaitBuffers) and when a receive left fewer than a quarter of Buffers in the ring;
	// it adds them with Add and reports whether it added any (loop only).
	Grow func() bool
}

// RecvRing is a provided-buffer ring (buffer group 0): the owner of the memory Adds buffers,
// multishot recvs pick them, Received hands them back by id, and buffers the application
// released come back through Add. The ring knows addresses and ids, not who owns the memory.
type RecvRing struct {
	u       *URing
	br      *uring.BufRing
	cfg     RecvRingConfig
	bundles bool
	mask    uint32
	shadow  []uint16 // buffer id at each ring slot (bundles consume consecutive slots)
	rhead   uint32   // ring entries the kernel consumed
	rtail   uint32   // ring entries published
	adds    int      // added since the last publish
	total   int      // distinct buffers the ring was given (Buffers)
	dirty   bool
	waiters []Flusher
	waiting atomic.Bool // len(waiters) > 0, for the recyclers

	empty, mismatch atomic.Int64
}

// NewRecvRing creates the ring (loop only; once per URing).
func (u *URing) NewRecvRing(cfg RecvRingConfig) (*RecvRing, error) {
	if u.recv != nil {
		return nil, fmt.Errorf("loop: a receive ring exists: %w", unix.EEXIST)
	}
	if cfg.Bufs < 1 || cfg.Bufs > MaxRecvBufs || cfg.BufSize < 1 {
		return nil, fmt.Errorf("loop: receive ring of %d buffers of %d bytes: %w", cfg.Bufs, cfg.BufSize, unix.EINVAL)
	}
	entries := uint32(1)
	for int(entries) < cfg.Bufs {
		entries <<= 1
	}
	r := &RecvRing{u: u, cfg: cfg, bundles: cfg.Bundles && u.caps.Has(uring.FeatRecvsendBundle), mask: entries - 1,
		shadow: make([]uint16, entries)}
	var err error
	r.br, err = u.ring.RegisterBufRing(entries, 0, 0)
	if err != nil {
		return nil, err
	}
	u.recv = r
	u.q.SizeBufferIDs(cfg.Bufs) // buffer ids are below Bufs: their returns (PostBuffer) need no task
	return r, nil
}

// Group returns the buffer group for multishot recv.
func (r *RecvRing) Group() uint16 { return 0 }

// Bundles reports whether recv bundles are in use.
func (r *RecvRing) Bundles() bool { return r.bundles }

// MultishotLimit reports whether a multishot receive takes a limit on its total bytes
// (uring.Capabilities.RecvMultishotLimit).
func (r *RecvRing) MultishotLimit() bool { return r.u.caps.RecvMultishotLimit }

// BufSize returns the size of each buffer.
func (r *RecvRing) BufSize() int { return r.cfg.BufSize }

// Add puts buffer bid (BufSize bytes at addr) in the ring (loop only): a new buffer, or one
// the application gave back. The kernel sees it at the next Flush.
func (r *RecvRing) Add(addr uintptr, bid uint16, fresh bool) {
	if fresh {
		r.total++
	}
	r.br.Add(addr, uint32(r.cfg.BufSize), bid, r.adds)
	r.shadow[(r.rtail+uint32(r.adds))&r.mask] = bid
	r.adds++
	if !r.dirty {
		r.dirty = true
		r.u.q.MarkDirty(r)
	}
}

// Waiting reports whether a receiver waits for buffers (any goroutine): whoever gives a
// buffer back then wakes the loop (push first, then look: WaitBuffers sets waiting before
// the loop checks its inbox and sleeps).
func (r *RecvRing) Waiting() bool { return r.waiting.Load() }

// Flush publishes added buffers and wakes the receivers that waited for them.
func (r *RecvRing) Flush(q *Queue) {
	r.dirty = false
	r.publish()
}

func (r *RecvRing) publish() {
	if r.adds == 0 {
		return
	}
	r.rtail += uint32(r.adds)
	r.br.Advance(r.adds)
	r.adds = 0
	if len(r.waiters) > 0 {
		w := r.waiters
		r.waiters = nil
		r.waiting.Store(false)
		for _, f := range w {
			r.u.q.MarkDirty(f)
		}
	}
}

// WaitBuffers calls f.Flush once buffers were added to the ring (loop only). It asks Grow
// first, so a receiver waits only when the owner cannot add buffers now.
func (r *RecvRing) WaitBuffers(f Flusher) {
	r.empty.Add(1)
	if r.grow() {
		r.u.q.MarkDirty(f)
		return
	}
	r.waiters = append(r.waiters, f)
	r.waiting.Store(true)
}

func (r *RecvRing) grow() bool {
	if r.cfg.Grow == nil || !r.cfg.Grow() {
		return false
	}
	r.publish()
	return true
}

// Received hands the buffers a recv CQE consumed to fn, in order, as buffer ids with their
// byte counts (loop only). Call it for every recv CQE with a buffer.
func (r *RecvRing) Received(ev Event, fn func(bid uint16, n int)) {
	if ev.Flags&uring.CQEFBuffer == 0 {
		return
	}
	left := int(ev.Res)
	first := true
	for left > 0 {
		bid := r.shadow[r.rhead&r.mask]
		if first && bid != uint16(ev.Flags>>uring.CQEBufferShift) {
			// The ring order we track disagrees with the kernel: trust the kernel's id.
			r.mismatch.Add(1)
			bid = uint16(ev.Flags >> uring.CQEBufferShift)
		}
		first = false
		r.rhead++
		n := min(left, r.cfg.BufSize)
		left -= n
		fn(bid, n)
	}
	if avail := int(r.rtail - r.rhead); avail < r.total/4 {
		r.grow()
	}
}

// RecvRingStats are the ring's counters.
type RecvRingStats struct {
	Empty    int64 // recvs that found the ring empty
	Mismatch int64 // bundle CQEs whose first id did not match the ring order (0 expected)
}

// Stats returns the ring's counters (any goroutine).
func (r *RecvRing) Stats() RecvRingStats {
	return RecvRingStats{Empty: r.empty.Load(), Mismatch: r.mismatch.Load()}
}

// close runs when the driver closes (the ring is about to go).
func (r *RecvRing) close() { r.br.Close() }
