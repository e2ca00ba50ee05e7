package loop

import (
	"container/heap"
	"time"
)

// Timer is a loop-only timer made by Queue.After.
type Timer struct {
	when time.Time
	fn   func()
	idx  int // in the heap; -1 when not pending
	q    *Queue
}

// Stop cancels the timer (loop only); it reports whether it was pending.
func (t *Timer) Stop() bool {
	if t == nil || t.idx < 0 {
		return false
	}
	heap.Remove(&t.q.timers, t.idx)
	t.idx = -1
	return true
}

// Pending reports whether the timer has not fired nor been stopped.
func (t *Timer) Pending() bool { return t != nil && t.idx >= 0 }

type timerHeap []*Timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].when.Before(h[j].when) }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *timerHeap) Push(x any) {
	t := x.(*Timer)
	t.idx = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.idx = -1
	return t
}

// After runs fn on the loop after d (loop only).
func (q *Queue) After(d time.Duration, fn func()) *Timer {
	t := &Timer{when: time.Now().Add(d), fn: fn, q: q}
	heap.Push(&q.timers, t)
	return t
}

// nextTimeout returns how long the loop may sleep: -1 forever.
func (q *Queue) nextTimeout() time.Duration {
	if len(q.timers) == 0 {
		return -1
	}
	d := time.Until(q.timers[0].when)
	if d < 0 {
		return 0
	}
	return d
}

func (q *Queue) runTimers() {
	if len(q.timers) == 0 {
		return
	}
	now := time.Now()
	for len(q.timers) > 0 && !q.timers[0].when.After(now) {
		t := heap.Pop(&q.timers).(*Timer)
		t.fn()
	}
}
