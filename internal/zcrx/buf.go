package zcrx

import (
	"sync/atomic"

	"github.com/zcnet/zcnet/internal/uring"
)

// slot records one completion the application holds: where it lies in the area and a
// generation, odd while held. The queue's goroutine fills it before handing it out; a
// releaser only flips the generation and links it into the released list.
type slot struct {
	gen  atomic.Uint32
	next uint64 // released list: next slot index+1, written by the releaser before its CAS
	off  uint64
	n    uint32
}

const (
	chunkBits = 10
	chunkSize = 1 << chunkBits
	maxChunks = 1 << 12 // 4 Mi completions held at once
)

type chunk [chunkSize]slot

// slab holds the slots in chunks that never move, so releasers on other goroutines can reach
// a slot while the queue's goroutine adds chunks. Only the queue's goroutine allocates and
// frees slots.
type slab struct {
	chunks [maxChunks]atomic.Pointer[chunk]
	n      uint32   // slots ever created
	free   []uint32 // free slot indexes (loop only)
}

func (s *slab) at(i uint32) *slot {
	c := s.chunks[i>>chunkBits].Load()
	if c == nil {
		return nil
	}
	return &c[i&(chunkSize-1)]
}

// get returns a free slot (loop only); nil when 4 Mi completions are held already.
func (s *slab) get() (uint32, *slot) {
	if k := len(s.free); k > 0 {
		i := s.free[k-1]
		s.free = s.free[:k-1]
		return i, s.at(i)
	}
	i := s.n
	if i>>chunkBits >= maxChunks {
		return 0, nil
	}
	if i&(chunkSize-1) == 0 {
		s.chunks[i>>chunkBits].Store(new(chunk))
	}
	s.n++
	return i, s.at(i)
}

// put frees a released slot (loop only).
func (s *slab) put(i uint32) { s.free = append(s.free, i) }

// Buf is the handle of one received completion. The zero Buf is invalid.
type Buf struct {
	r   *Receiver
	idx uint32
	gen uint32
}

// Release gives the buffer back to the kernel, from any goroutine, once: later calls (and
// calls on copies of the handle) return ErrStale. The bytes of the view must not be used
// afterwards.
func (b Buf) Release() error {
	r := b.r
	if r == nil {
		return ErrStale
	}
	sl := r.slabs.at(b.idx)
	if sl == nil || b.gen&1 == 0 || !sl.gen.CompareAndSwap(b.gen, b.gen+1) {
		return ErrStale
	}
	held := r.held.Add(-1)
	if r.closing.Load() {
		r.area.out.Add(-1)
		// The queue is gone: the kernel took its buffers back with the ring.
		if held == 0 {
			r.maybeFree()
		}
		return nil
	}
	for {
		old := r.rel.Load()
		sl.next = old
		if r.rel.CompareAndSwap(old, uint64(b.idx)+1) {
			break
		}
	}
	r.schedule()
	return nil
}

// Valid reports whether the handle still owns its buffer.
func (b Buf) Valid() bool {
	if b.r == nil {
		return false
	}
	sl := b.r.slabs.at(b.idx)
	return sl != nil && b.gen&1 == 1 && sl.gen.Load() == b.gen
}

// IsZero reports whether b is the zero Buf (no completion at all, not even a released one).
func (b Buf) IsZero() bool { return b.r == nil }

// Bytes returns the view of the area the completion filled, or nil for a stale handle. A
// caller racing its own Release may get a view just released: release after the last use.
func (b Buf) Bytes() []byte {
	if !b.Valid() {
		return nil
	}
	sl := b.r.slabs.at(b.idx)
	o := sl.off &^ uring.ZcrxAreaMask
	return b.r.mem[o : o+uint64(sl.n) : o+uint64(sl.n)]
}

// Len returns the completion's length (0 for a stale handle).
func (b Buf) Len() int {
	if !b.Valid() {
		return 0
	}
	return int(b.r.slabs.at(b.idx).n)
}

// schedule asks the queue's goroutine to run Flush, once until it ran.
func (r *Receiver) schedule() {
	if r.scheduled.CompareAndSwap(false, true) {
		if err := r.q.Schedule(r); err != nil {
			r.scheduled.Store(false)
		}
	}
}
