package loop

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
)

// RecvRingConfig configures a provided-buffer ring.
type RecvRingConfig struct {
	BufSize  int  // bytes per receive buffer
	Initial  int  // buffers at start
	MaxBytes int  // the pool grows (doubling) up to this
	Bundles  bool // use recv bundles (one CQE for several buffers)
	Tag      any  // memreg.PoolOptions.Tag
	// KeepMapped: memreg.PoolOptions.KeepMapped (a debugging aid)
	KeepMapped bool
}

// RecvRing is a provided-buffer ring (buffer group 0) fed from a growing memreg.Pool: multishot
// recvs pick buffers from it, the application borrows them, and released buffers come back to
// the ring through the queue's inbox. The pool grows, on the loop, when fewer than a quarter
// of its buffers are left in the ring.
type RecvRing struct {
	u       *URing
	br      *uring.BufRing
	pool    *memreg.Pool
	bundles bool
	mask    uint32
	shadow  []uint16 // buffer id at each ring slot (bundles consume consecutive slots)
	rhead   uint32   // ring entries the kernel consumed
	rtail   uint32   // ring entries published
	adds    int      // added since the last publish
	dirty   bool
	waiters []Flusher
	waiting atomic.Bool // len(waiters) > 0, for the recyclers

	out, empty, mismatch, grows, growFails atomic.Int64
	lastGrowErr                            atomic.Pointer[error]
}

// NewRecvRing creates the ring and its pool (loop only; once per URing).
func (u *URing) NewRecvRing(cfg RecvRingConfig) (*RecvRing, error) {
	if u.recv != nil {
		return nil, fmt.Errorf("loop: a receive ring exists: %w", unix.EEXIST)
	}
	maxBufs := cfg.MaxBytes / max(cfg.BufSize, 1)
	if maxBufs < cfg.Initial {
		maxBufs = cfg.Initial
	}
	if maxBufs > 32768 {
		return nil, &memreg.SizeError{What: "receive pool", BufSize: cfg.BufSize, Count: maxBufs, Max: cfg.MaxBytes,
			Reason: "a provided-buffer ring holds at most 32768 buffers: use larger buffers or a smaller cap"}
	}
	entries := uint32(1)
	for int(entries) < maxBufs {
		entries <<= 1
	}
	r := &RecvRing{u: u, bundles: cfg.Bundles && u.caps.Has(uring.FeatRecvsendBundle), mask: entries - 1,
		shadow: make([]uint16, entries)}
	var err error
	r.br, err = u.ring.RegisterBufRing(entries, 0, 0)
	if err != nil {
		return nil, err
	}
	r.pool, err = memreg.NewPool(memreg.PoolOptions{BufSize: cfg.BufSize, Initial: cfg.Initial,
		MaxBytes: maxBufs * cfg.BufSize, Tag: cfg.Tag, OnGrow: r.onGrow, KeepMapped: cfg.KeepMapped})
	if err != nil {
		r.br.Close()
		return nil, err
	}
	u.q.SetBufferHook(r.returned)
	r.publish()
	u.recv = r
	return r, nil
}

// onGrow feeds a new region's buffers to the ring and routes their releases back here.
func (r *RecvRing) onGrow(reg *memreg.Region, first int) error {
	q := r.u.q
	reg.SetRecycler(func(idx int) {
		r.out.Add(-1)
		// After the queue stopped the buffer stays with the closed region. The return does
		// not wake the loop unless a receiver waits for buffers (push first, then look:
		// WaitBuffers sets waiting before the loop checks its inbox and sleeps).
		if q.PostBuffer(int32(first+idx)) == nil && r.waiting.Load() {
			q.Nudge()
		}
	})
	reg.Provide(reg.Count(), func(l memreg.Loan) { r.addBuf(reg, l.Index(), first+l.Index()) })
	return nil
}

// Pool returns the ring's pool.
func (r *RecvRing) Pool() *memreg.Pool { return r.pool }

// Group returns the buffer group for multishot recv.
func (r *RecvRing) Group() uint16 { return 0 }

// Bundles reports whether recv bundles are in use.
func (r *RecvRing) Bundles() bool { return r.bundles }

// MultishotLimit reports whether a multishot receive takes a limit on its total bytes
// (uring.Capabilities.RecvMultishotLimit).
func (r *RecvRing) MultishotLimit() bool { return r.u.caps.RecvMultishotLimit }

// BufSize returns the size of each buffer.
func (r *RecvRing) BufSize() int { return r.pool.BufSize() }

func (r *RecvRing) addBuf(reg *memreg.Region, idx, bid int) {
	r.br.Add(reg.Addr(idx), uint32(reg.BufSize()), uint16(bid), r.adds)
	r.shadow[(r.rtail+uint32(r.adds))&r.mask] = uint16(bid)
	r.adds++
	if !r.dirty {
		r.dirty = true
		r.u.q.MarkDirty(r)
	}
}

// returned runs on the loop for a buffer the application released.
func (r *RecvRing) returned(bid int32) {
	if reg, idx, ok := r.pool.Locate(int(bid)); ok {
		r.addBuf(reg, idx, int(bid))
	}
}

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

// WaitBuffers calls f.Flush once buffers were returned to the ring (loop only). It grows the
// pool first when it can, so a receiver waits only when the pool is at its cap.
func (r *RecvRing) WaitBuffers(f Flusher) {
	r.empty.Add(1)
	if r.grow() {
		r.u.q.MarkDirty(f)
		return
	}
	r.waiters = append(r.waiters, f)
	r.waiting.Store(true)
}

// grow adds a region when the pool may grow; it reports whether it did.
func (r *RecvRing) grow() bool {
	if !r.pool.CanGrow() {
		return false
	}
	if _, err := r.pool.Grow(); err != nil {
		r.growFails.Add(1)
		r.lastGrowErr.Store(&err)
		return false
	}
	r.grows.Add(1)
	r.publish()
	return true
}

// Received hands the buffers a recv CQE consumed to fn, in order, as borrowed buffers with
// their byte counts (loop only). Call it for every recv CQE with a buffer.
func (r *RecvRing) Received(ev Event, fn func(b memreg.Buf, n int)) {
	if ev.Flags&uring.CQEFBuffer == 0 {
		return
	}
	left := int(ev.Res)
	size := r.pool.BufSize()
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
		n := min(left, size)
		left -= n
		reg, idx, ok := r.pool.Locate(int(bid))
		if !ok {
			continue
		}
		b, err := reg.Received(idx)
		if err != nil {
			continue
		}
		r.out.Add(1)
		fn(b, n)
	}
	if avail := int(r.rtail - r.rhead); avail < r.pool.Buffers()/4 {
		r.grow()
	}
}

// RecvRingStats are the ring's counters.
type RecvRingStats struct {
	Out       int64 // buffers held by the application (or forwarded by a send)
	Empty     int64 // recvs that found the ring empty
	Mismatch  int64 // bundle CQEs whose first id did not match the ring order (0 expected)
	Grows     int64 // regions added
	GrowFails int64
	Bytes     int // memory the pool has mapped
	MaxBytes  int
	LastError error // the last growth failure
}

// Stats returns the ring's counters (any goroutine).
func (r *RecvRing) Stats() RecvRingStats {
	s := RecvRingStats{Out: r.out.Load(), Empty: r.empty.Load(), Mismatch: r.mismatch.Load(), Grows: r.grows.Load(),
		GrowFails: r.growFails.Load(), Bytes: r.pool.Bytes(), MaxBytes: r.pool.MaxBytes()}
	if e := r.lastGrowErr.Load(); e != nil {
		s.LastError = *e
	}
	return s
}

// close runs when the driver closes (the ring is about to go): the buffer ring goes, the
// pool's regions close once the application releases what it still holds.
func (r *RecvRing) close() {
	r.br.Close()
	r.pool.CloseWhenReleased()
}
