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
