package loop

import (
	"sync"
	"sync/atomic"
)

// task is one unit of work posted to a queue.
type task struct {
	next *task
	fn   func()
	f    Flusher // Schedule
	// A task without fn and f returns receive buffer arg to the buffer ring (the common case,
	// kept closure-free so releasing a buffer does not allocate).
	arg int32
}

var taskPool = sync.Pool{New: func() any { return new(task) }}

// sealed marks an inbox that accepts nothing more.
var sealed = &task{}

// inbox is a lock-free multi-producer single-consumer queue: producers push onto a Treiber
// stack with CAS; the consumer takes the whole stack with one swap and reverses it, so tasks
// run in the order each producer pushed them. seal makes every later push fail.
type inbox struct {
	head atomic.Pointer[task]
}

// push adds t; false when the inbox is sealed (t was not added).
func (b *inbox) push(t *task) bool {
	for {
		old := b.head.Load()
		if old == sealed {
			return false
		}
		t.next = old
		if b.head.CompareAndSwap(old, t) {
			return true
		}
	}
}

func (b *inbox) empty() bool {
	h := b.head.Load()
	return h == nil || h == sealed
}

// takeAll returns the pending tasks in FIFO order.
func (b *inbox) takeAll() *task {
	for {
		t := b.head.Load()
		if t == nil || t == sealed {
			return nil
		}
		if b.head.CompareAndSwap(t, nil) {
			return reverse(t)
		}
	}
}

// seal takes the pending tasks (FIFO) and refuses every later push.
func (b *inbox) seal() *task {
	t := b.head.Swap(sealed)
	if t == sealed {
		return nil
	}
	return reverse(t)
}

func reverse(t *task) *task {
	var rev *task
	for t != nil {
		n := t.next
		t.next = rev
		rev = t
		t = n
	}
	return rev
}

// idStack is the buffer-return path of PostBuffer: a lock-free multi-producer stack of
// small integer ids threaded through an array indexed by id, so a return allocates nothing
// and needs no task (a sync.Pool get and put and an inbox node per buffer cost more than the
// rest of an echo's user-space work per request on the 2-CPU VM: doc/notes/issue-29-s13-echo29.md).
// Each id is on the stack at most once (a buffer is returned once per loan). The consumer
// takes the whole stack with one swap, so there is no ABA: a popped id is never pushed
// back while a producer still holds its old head.
type idStack struct {
	head atomic.Int64   // top id + 1; 0: empty; -1: sealed
	next []atomic.Int32 // next[id]: the id below it + 1 (0: bottom)
}

// init sizes the stack for ids 0..n-1 (before any push).
func (s *idStack) init(n int) { s.next = make([]atomic.Int32, n) }

// fits reports whether id can go on the stack.
func (s *idStack) fits(id int32) bool { return id >= 0 && int(id) < len(s.next) }

// push adds id (fits(id)); false when the stack is sealed.
func (s *idStack) push(id int32) bool {
	for {
		old := s.head.Load()
		if old < 0 {
			return false
		}
		s.next[id].Store(int32(old))
		if s.head.CompareAndSwap(old, int64(id)+1) {
			return true
		}
	}
}

func (s *idStack) empty() bool { return s.head.Load() <= 0 }

// take removes every id on the stack and returns the top one + 1 (0: none).
func (s *idStack) take() int64 {
	for {
		h := s.head.Load()
		if h <= 0 {
			return 0
		}
		if s.head.CompareAndSwap(h, 0) {
			return h
		}
	}
}

// seal takes what is on the stack (as take) and refuses every later push.
func (s *idStack) seal() int64 {
	if h := s.head.Swap(-1); h > 0 {
		return h
	}
	return 0
}

// each calls fn for every id of a chain that take or seal returned, reading each link
// before fn runs (fn may hand the id to someone who returns it again).
func (s *idStack) each(h int64, fn func(id int32)) {
	for h > 0 {
		id := int32(h - 1)
		h = int64(s.next[id].Load())
		fn(id)
	}
}
