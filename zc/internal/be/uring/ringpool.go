package uring

import (
	"errors"
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/memregops"
	"github.com/zcnet/zcnet/memreg"
	bc "github.com/zcnet/zcnet/zc/internal/becontract"
)

// ringPool feeds the io_uring backend's provided-buffer ring from a growing memreg.Pool: the
// pool owns the memory (and its lifetime: Data outlives the engine), the ring in
// internal/loop knows only addresses and buffer ids (buffer id = the pool's global index).
// The pool grows, on the loop, when a receiver would wait or fewer than a quarter of its
// buffers are left in the ring.
type ringPool struct {
	q    *loop.Queue
	rr   *loop.RecvRing
	pool *memreg.Pool

	out, grows, growFails atomic.Int64
	lastGrowErr           atomic.Pointer[error]
}

type ringPoolConfig struct {
	BufSize, Initial, MaxBytes int
	Bundles, KeepMapped        bool
	Tag                        any
}

// newRingPool creates the ring and its pool (loop only; once per URing). On error the
// caller closes u, which closes a ring already made.
func newRingPool(u *loop.URing, q *loop.Queue, cfg ringPoolConfig) (*ringPool, error) {
	maxBufs := max(cfg.MaxBytes/max(cfg.BufSize, 1), cfg.Initial)
	if maxBufs > loop.MaxRecvBufs {
		return nil, &memreg.SizeError{What: "receive pool", BufSize: cfg.BufSize, Count: maxBufs, Max: cfg.MaxBytes,
			Reason: fmt.Sprintf("a provided-buffer ring holds at most %d buffers: use larger buffers or a smaller cap", loop.MaxRecvBufs)}
	}
	p := &ringPool{q: q}
	var err error
	p.rr, err = u.NewRecvRing(loop.RecvRingConfig{Bufs: maxBufs, BufSize: cfg.BufSize, Bundles: cfg.Bundles, Grow: p.grow})
	if err != nil {
		return nil, err
	}
	p.pool, err = memreg.NewPool(memreg.PoolOptions{BufSize: cfg.BufSize, Initial: cfg.Initial,
		MaxBytes: maxBufs * cfg.BufSize, Tag: cfg.Tag, OnGrow: p.onGrow, KeepMapped: cfg.KeepMapped})
	if err != nil {
		return nil, err
	}
	q.SetBufferHook(p.returned)
	// The ring is gone when the closers run: the regions close once the application
	// released what it still holds.
	u.OnClose(p.pool.CloseWhenReleased)
	p.rr.Flush(q)
	return p, nil
}

// onGrow feeds a new region's buffers to the ring and routes their releases back to it.
func (p *ringPool) onGrow(reg *memreg.Region, first int) error {
	q := p.q
	memregops.SetRecycler(reg, func(idx int) {
		p.out.Add(-1)
		// After the queue stopped the buffer stays with the closed region. The return does
		// not wake the loop unless a receiver waits for buffers.
		if q.PostBuffer(int32(first+idx)) == nil && p.rr.Waiting() {
			q.Nudge()
		}
	})
	memregops.Provide(reg, reg.Count(), func(l memreg.Loan) { p.rr.Add(reg.Addr(l.Index()), uint16(first+l.Index()), true) })
	return nil
}

// returned runs on the loop for a buffer the application released.
func (p *ringPool) returned(bid int32) {
	if reg, idx, ok := memregops.Locate(p.pool, int(bid)); ok {
		p.rr.Add(reg.Addr(idx), uint16(bid), false)
	}
}

// grow adds a region when the pool may grow; it reports whether it did (loop only).
func (p *ringPool) grow() bool {
	if !p.pool.CanGrow() {
		return false
	}
	if _, err := p.pool.Grow(); err != nil {
		p.growFails.Add(1)
		p.lastGrowErr.Store(&err)
		return false
	}
	p.grows.Add(1)
	return true
}

// received hands the buffers a recv CQE consumed to fn as borrowed buffers (loop only).
func (p *ringPool) received(ev loop.Event, fn func(b memreg.Buf, n int)) {
	p.rr.Received(ev, func(bid uint16, n int) {
		reg, idx, ok := memregops.Locate(p.pool, int(bid))
		if !ok {
			return
		}
		b, err := memregops.Received(reg, idx)
		if err != nil {
			return
		}
		p.out.Add(1)
		fn(b, n)
	})
}

// stats are the ring's and its pool's counters.
func (p *ringPool) stats() bc.RingStats {
	rs := p.rr.Stats()
	s := bc.RingStats{Out: p.out.Load(), Empty: rs.Empty, Mismatch: rs.Mismatch, Grows: p.grows.Load(), GrowFails: p.growFails.Load()}
	if e := p.lastGrowErr.Load(); e != nil {
		s.LastError = *e
	}
	return s
}

// registerFixed installs a send region in u's fixed-buffer table (loop only): the region
// stays mapped while the table refers to it (memregops.HoldForKernel).
func registerFixed(u *loop.URing, r *memreg.Region) error {
	mem := r.Memory()
	if mem == nil {
		return memreg.ErrClosed
	}
	if err := memregops.HoldForKernel(r); err != nil {
		return err
	}
	if _, err := u.RegisterMem(mem, func() { memregops.ReleaseFromKernel(r) }); err != nil {
		memregops.ReleaseFromKernel(r)
		switch {
		case errors.Is(err, unix.ENOMEM):
			return memreg.NewMemlockError(len(mem), err)
		case errors.Is(err, unix.ENOSPC):
			return fmt.Errorf("%v: %w", err, memreg.ErrExhausted)
		case errors.Is(err, unix.EBUSY):
			return fmt.Errorf("%v: %w", err, memreg.ErrBusy)
		}
		return err
	}
	return nil
}
