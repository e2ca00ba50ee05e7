package memreg

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// PoolOptions configures a Pool.
type PoolOptions struct {
	BufSize int // bytes per buffer (> 0)
	// Initial is the number of buffers of the first region (> 0).
	Initial int
	// MaxBytes caps the pool's memory (>= BufSize*Initial). Growth stops there.
	MaxBytes int
	// HugePages asks for MAP_HUGETLB regions (see Options).
	HugePages bool
	// OnGrow, if set, is called with every new region (the first one included) before its
	// buffers are handed out: register it with a ring, give it a recycler, ... An error
	// discards the region and fails the growth.
	OnGrow func(r *Region, firstIndex int) error
	// Tag identifies the pool's owner (an engine): Pool.Tag returns it.
	Tag any
	// OnFree, if set, is called (on the releasing goroutine, no lock held) whenever a buffer
	// returns to a free list: someone waiting for a buffer can try again.
	OnFree func()
	// Scrub, if set, runs on every new region's memory and on each buffer's memory as it
	// returns to a free list (with the region's lock held: it must not call into memreg). A
	// debugging aid: fill freed buffers with a poison pattern, check it when they are handed
	// out again.
	Scrub func(mem []byte)
	// KeepMapped keeps the regions' address ranges mapped for the life of the process: when a
	// region would be unmapped its pages are given back to the system instead, so a slice
	// kept past Release writes into nothing instead of faulting. A debugging aid (it costs
	// address space, never memory).
	KeepMapped bool
}

// Pool is a set of regions with buffers of one size that starts small and grows with demand,
// doubling, up to MaxBytes. Buffers keep pointing at their own region, so a buffer returns
// where it came from. Buffers are numbered across the pool (region k's buffer i is
// the pool's buffer first(k)+i, first(k) being the buffers of the regions before it), which is what a provided-buffer ring needs for its 16-bit ids.
type Pool struct {
	opt PoolOptions

	growMu  sync.Mutex // serializes growth (indices are handed out in order)
	mu      sync.Mutex
	regions []*Region
	firsts  []int // first pool-wide index of each region
	bufs    int
	closed  bool
	next    int // region to try first in Get
	// index is regions and firsts as of the last growth, for locate without the lock (a
	// receive completion locates its buffer, a returned receive buffer too: twice per
	// request of an echo). Entries are only ever appended, so a snapshot stays valid.
	index atomic.Pointer[poolIndex]
}

// poolIndex is a snapshot of a pool's regions and their first indices.
type poolIndex struct {
	regions []*Region
	firsts  []int
}

// ErrPoolCap: the pool reached MaxBytes.
var ErrPoolCap = fmt.Errorf("memreg: pool at its size cap: %w", ErrExhausted)

// NewPool creates a pool with its first region.
func NewPool(opt PoolOptions) (*Pool, error) {
	if opt.BufSize <= 0 || opt.Initial <= 0 {
		return nil, &SizeError{What: "pool", BufSize: opt.BufSize, Count: opt.Initial, Reason: "buffer size and initial count must be > 0"}
	}
	if opt.MaxBytes < opt.BufSize*opt.Initial || opt.BufSize*opt.Initial/opt.Initial != opt.BufSize {
		return nil, &SizeError{What: "pool", BufSize: opt.BufSize, Count: opt.Initial, Max: opt.MaxBytes,
			Reason: "the first region does not fit under the pool's cap"}
	}
	p := &Pool{opt: opt}
	if err := p.grow(opt.Initial); err != nil {
		return nil, err
	}
	return p, nil
}

// SizeError says why a region or pool geometry was refused, with the numbers.
type SizeError struct {
	What    string
	BufSize int
	Count   int
	Max     int
	Reason  string
}

func (e *SizeError) Error() string {
	s := fmt.Sprintf("memreg: %s of %d buffers of %d bytes", e.What, e.Count, e.BufSize)
	if e.Max > 0 {
		s += fmt.Sprintf(" (cap %d bytes)", e.Max)
	}
	return s + ": " + e.Reason
}

// Tag returns PoolOptions.Tag.
func (p *Pool) Tag() any { return p.opt.Tag }

// BufSize returns the size of every buffer.
func (p *Pool) BufSize() int { return p.opt.BufSize }

// MaxBytes returns the cap.
func (p *Pool) MaxBytes() int { return p.opt.MaxBytes }

// Bytes returns the memory the pool has mapped.
func (p *Pool) Bytes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bufs * p.opt.BufSize
}

// Buffers returns the number of buffers over all regions.
func (p *Pool) Buffers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bufs
}

// Regions returns the pool's regions in growth order.
func (p *Pool) Regions() []*Region {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*Region(nil), p.regions...)
}

// Owns reports whether r is one of the pool's regions.
func (p *Pool) Owns(r *Region) bool { return r != nil && r.pool == p }

// firstIndex returns the pool-wide index of r's buffer 0.
func (p *Pool) firstIndex(r *Region) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.regions {
		if x == r {
			return p.firsts[i]
		}
	}
	return -1
}

// locate maps a pool-wide buffer index to its region and the index inside it.
func (p *Pool) locate(idx int) (*Region, int, bool) {
	x := p.index.Load()
	if x == nil {
		return nil, 0, false
	}
	for i := len(x.regions) - 1; i >= 0; i-- {
		if idx >= x.firsts[i] {
			if j := idx - x.firsts[i]; j < x.regions[i].count {
				return x.regions[i], j, true
			}
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// Get hands out a free buffer from any region, or ErrExhausted (it does not grow the pool:
// growing may need the owner's thread, see Grow).
func (p *Pool) Get() (Buf, error) {
	p.mu.Lock()
	regs := p.regions
	start := p.next
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return Buf{}, ErrClosed
	}
	n := len(regs)
	for i := 0; i < n; i++ {
		r := regs[(start+i)%n]
		b, err := r.Get()
		if err == nil {
			if i != 0 {
				p.mu.Lock()
				p.next = (start + i) % n
				p.mu.Unlock()
			}
			return b, nil
		}
	}
	return Buf{}, ErrExhausted
}

// Free returns the free buffers over all regions.
func (p *Pool) Free() int {
	n := 0
	for _, r := range p.Regions() {
		n += r.Free()
	}
	return n
}

// CanGrow reports whether another region fits under the cap.
func (p *Pool) CanGrow() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closed && p.growCountLocked() > 0
}

// growCountLocked: the next region doubles the pool, within the cap.
func (p *Pool) growCountLocked() int {
	room := p.opt.MaxBytes/p.opt.BufSize - p.bufs
	return min(max(p.bufs, 1), room)
}

// Grow adds a region (as many buffers as the pool has, within the cap) and returns how many
// buffers it added; ErrPoolCap at the cap.
func (p *Pool) Grow() (int, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return 0, ErrClosed
	}
	n := p.growCountLocked()
	p.mu.Unlock()
	if n <= 0 {
		return 0, ErrPoolCap
	}
	if err := p.grow(n); err != nil {
		return 0, err
	}
	return n, nil
}

func (p *Pool) grow(n int) error {
	p.growMu.Lock()
	defer p.growMu.Unlock()
	r, err := New(Options{BufSize: p.opt.BufSize, Count: n, HugePages: p.opt.HugePages})
	if err != nil {
		return err
	}
	r.pool = p
	r.onFree = p.opt.OnFree
	r.scrub = p.opt.Scrub
	r.keepMapped = p.opt.KeepMapped
	if r.scrub != nil {
		r.scrub(r.mem)
	}
	p.mu.Lock()
	first := p.bufs
	p.mu.Unlock()
	if p.opt.OnGrow != nil {
		if err := p.opt.OnGrow(r, first); err != nil {
			r.abandon()
			r.Close()
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		r.abandon()
		r.Close()
		return ErrClosed
	}
	p.regions = append(p.regions, r)
	p.firsts = append(p.firsts, first)
	p.index.Store(&poolIndex{regions: p.regions, firsts: p.firsts})
	p.bufs += n
	return nil
}

// CloseWhenReleased closes every region with Region.CloseWhenReleased: buffers the
// application holds stay mapped until released. The caller guarantees the kernel is done with
// the pool's memory (the rings that used it are closed). Idempotent.
func (p *Pool) CloseWhenReleased() {
	p.mu.Lock()
	p.closed = true
	regs := p.regions
	p.mu.Unlock()
	for _, r := range regs {
		r.CloseWhenReleased()
	}
}
