package loop

import (
	"sync"
	"sync/atomic"
)

// task is one unit of work posted to a queue.
type task struct {
	next *task
	fn   func()
	// A task without fn returns receive buffer bid to the buffer ring (the common case, kept
	// closure-free so releasing a buffer does not allocate).
	bid   int32
	owner Flusher
}

var taskPool = sync.Pool{New: func() any { return new(task) }}

// inbox is a lock-free multi-producer single-consumer queue: producers push onto a Treiber
// stack with CAS; the consumer takes the whole stack with one swap and reverses it, so tasks
// run in the order each producer pushed them.
type inbox struct {
	head atomic.Pointer[task]
}

func (b *inbox) push(t *task) {
	for {
		old := b.head.Load()
		t.next = old
		if b.head.CompareAndSwap(old, t) {
			return
		}
	}
}

func (b *inbox) empty() bool { return b.head.Load() == nil }

// takeAll returns the pending tasks in FIFO order.
func (b *inbox) takeAll() *task {
	t := b.head.Swap(nil)
	var rev *task
	for t != nil {
		n := t.next
		t.next = rev
		rev = t
		t = n
	}
	return rev
}
