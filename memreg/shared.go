package memreg

import "sync/atomic"

// Shared buffers: one buffer with several owners at once, so that one buffer can be sent on
// many connections (a fan-out) or a received buffer kept by several readers without a copy.
//
// Buf.Share makes a held buffer shared and returns a Ref, a second owner; the Buf handle
// stays an owner too. Every owner lets go on its own: the Buf and each Ref by Release (once:
// a second Release is ErrStale), a Loan by Return. Ref.Lend adds an owner in the kernel's
// hands (a send in flight) without giving up the Ref, so one Ref can feed any number of
// sends; Buf.Lend of a shared buffer's handle turns that handle's ownership into the Loan, as
// it does for a buffer of one owner. The buffer goes back to its free list (or its recycler:
// a receive buffer to its provided-buffer ring) when the last owner let go; the callback
// given to the Share that made the buffer shared runs then. A shared buffer cannot be
// reclaimed (Loan.Reclaim drops the loan and returns ErrStale): someone else may still be
// reading it. The loans of one shared buffer are alike: each must be returned once (a
// second Return is caught only when no loan of the buffer is left).
//
// Shared memory is read-only by convention: a shared buffer may be in several sends at once,
// so nobody may write it. A region closed by its owner (CloseWhenReleased) forgets the
// shared buffers' loans (the rings are gone), but a shared buffer stays mapped while an
// application owner (the Buf or a Ref) holds it.

// share is a shared buffer's owners (under the region's mu).
type share struct {
	owners  int32  // the base handle (while base), Refs not released, loans not returned
	loans   int32  // of the owners, loans (forgotten when the region's owner closes it)
	base    bool   // the Buf handle that was shared is still an owner
	baseGen uint32 // that handle's generation
	onLast  func()
}

// Ref is one owner of a shared buffer (Buf.Share, Ref.Share). Its methods may be called
// from any goroutine.
type Ref struct {
	r    *Region
	idx  int32
	done atomic.Bool
}

// Share makes b's buffer shared (if it is not yet) and returns one more owner of it; b stays
// an owner. onLast, if not nil, runs once the last owner let go (on the goroutine that let
// go, no lock held, after the buffer went back); only the onLast of the Share that made the
// buffer shared is kept. It fails with ErrStale when b does not own its buffer.
func (b Buf) Share(onLast func()) (*Ref, error) {
	if b.r == nil {
		return nil, ErrStale
	}
	r := b.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := b.check(); err != nil {
		return nil, err
	}
	sh := r.shares[b.idx]
	if r.state[b.idx] == Held {
		if r.shares == nil {
			r.shares = map[int32]*share{}
		}
		sh = &share{owners: 1, base: true, baseGen: b.gen, onLast: onLast}
		r.shares[b.idx] = sh
		r.state[b.idx] = Shared
		r.pub(b.idx)
	}
	sh.owners++
	return &Ref{r: r, idx: b.idx}, nil
}

// Shared reports whether b's buffer is shared (Share) and b is one of its owners.
func (b Buf) Shared() bool {
	if b.r == nil {
		return false
	}
	b.r.mu.Lock()
	defer b.r.mu.Unlock()
	return b.check() == nil && b.r.state[b.idx] == Shared
}

// Share returns one more owner of x's buffer; ErrStale after x's Release.
func (x *Ref) Share() (*Ref, error) {
	if x == nil || x.r == nil {
		return nil, ErrStale
	}
	r := x.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if x.done.Load() {
		return nil, ErrStale
	}
	r.shares[x.idx].owners++
	return &Ref{r: r, idx: x.idx}, nil
}

// Lend lends the buffer to the kernel once more (a send of it): the Loan is one more owner,
// until its Return; x stays an owner. It fails with ErrStale after x's Release and with
// ErrClosed once the region is closed.
func (x *Ref) Lend() (Loan, error) {
	if x == nil || x.r == nil {
		return Loan{}, ErrStale
	}
	r := x.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if x.done.Load() {
		return Loan{}, ErrStale
	}
	if r.closed {
		return Loan{}, ErrClosed
	}
	sh := r.shares[x.idx]
	sh.owners++
	sh.loans++
	return Loan{r: r, idx: x.idx, gen: r.gen[x.idx]}, nil
}

// Release lets go of x. The second Release returns ErrStale.
func (x *Ref) Release() error {
	if x == nil || x.r == nil || !x.done.CompareAndSwap(false, true) {
		return ErrStale
	}
	x.r.mu.Lock()
	x.r.dropOwner(x.idx) // unlocks
	return nil
}

// Valid reports whether x is still an owner.
func (x *Ref) Valid() bool { return x != nil && x.r != nil && !x.done.Load() }

// Bytes returns the buffer's memory (read only: others share it), or nil after Release.
func (x *Ref) Bytes() []byte {
	// No lock: an owner keeps the region mapped (it unmaps only after the last owner).
	if !x.Valid() || x.r.gone.Load() {
		return nil
	}
	return x.r.slice(int(x.idx))
}

// Region returns the region of x's buffer.
func (x *Ref) Region() *Region { return x.r }

// Index returns the buffer's index in its region.
func (x *Ref) Index() int { return int(x.idx) }

// Owners returns how many owners buffer idx has (0: not shared), for tests and diagnostics.
func (r *Region) Owners(idx int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sh := r.shares[int32(idx)]; sh != nil {
		return int(sh.owners)
	}
	return 0
}

// dropOwner removes one owner of shared buffer idx; the last one sends the buffer back. It is
// called with mu held and returns with it released.
func (r *Region) dropOwner(idx int32) {
	sh := r.shares[idx]
	sh.owners--
	if sh.owners > 0 {
		r.mu.Unlock()
		return
	}
	delete(r.shares, idx)
	r.gen[idx]++
	r.pub(idx)
	r.held--
	if r.recycle != nil && !r.closed {
		r.state[idx] = Kernel
		r.pub(idx)
		r.lent++
		r.mu.Unlock()
		r.recycle(int(idx))
	} else {
		r.freeLocked(idx)
		r.unmapIfDoneLocked()
		onFree := r.onFree
		r.mu.Unlock()
		if onFree != nil {
			onFree()
		}
	}
	if sh.onLast != nil {
		sh.onLast()
	}
}

// forgetSharedLoansLocked drops the loans of every shared buffer (the rings that held them
// are gone: their Returns will not come, and are stale if they do); buffers left with no
// owner go to the free list. It returns the onLast callbacks to run once mu is released.
func (r *Region) forgetSharedLoansLocked() []func() {
	var last []func()
	for idx, sh := range r.shares {
		if sh.loans == 0 {
			continue
		}
		sh.owners -= sh.loans
		sh.loans = 0
		r.gen[idx]++ // the loans are stale
		r.pub(idx)
		if sh.owners > 0 {
			continue
		}
		delete(r.shares, idx)
		r.gen[idx]++
		r.pub(idx)
		r.held--
		r.state[idx] = Free
		r.pub(idx)
		r.free = append(r.free, idx)
		if sh.onLast != nil {
			last = append(last, sh.onLast)
		}
	}
	return last
}
