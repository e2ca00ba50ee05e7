package zc

import (
	"sync/atomic"
	"time"

	"github.com/zcnet/zcnet/internal/loop"
)

// timer is a function scheduled on a connection's queue goroutine by Conn.AfterFunc.
type timer struct {
	c     *Conn
	fn    func()
	state atomic.Int32 // timerPending, timerFired, timerStopped
	lt    *loop.Timer  // the loop's timer (loop only)
}

const (
	timerPending int32 = iota
	timerFired
	timerStopped
)

// AfterFunc runs fn on the connection's queue goroutine after d, serialized with its handler
// methods: a per-connection timer (an idle timeout, a request deadline, a retry) without a
// goroutine or a hand-off. fn does not run once the connection is closing, and the timer goes
// away with the connection. A panic in fn closes the connection with a *PanicError, as a
// handler's does. Call it from any goroutine; it fails with ErrClosed once the connection is
// closing, and with ErrInvalid for a nil fn.
//
// stop cancels the timer (as context.AfterFunc's stop does): it reports whether it stopped
// it, false when fn already ran (or runs now) or the timer was stopped before. Call it from
// any goroutine; on the connection's queue goroutine the loop forgets the timer at once,
// elsewhere when it was due.
func (c *Conn) AfterFunc(d time.Duration, fn func()) (stop func() bool, err error) {
	if fn == nil {
		return nil, c.opErr("afterfunc", ErrInvalid)
	}
	if c.isClosing() {
		return nil, c.opErr("afterfunc", ErrClosed)
	}
	t := &timer{c: c, fn: fn}
	arm := func() {
		if c.inClose() || t.state.Load() != timerPending {
			t.state.CompareAndSwap(timerPending, timerStopped)
			return
		}
		t.lt = c.q.After(max(d, 0), t.fire)
		c.q.addHold(c, t)
	}
	if c.q.OnLoop() {
		arm()
		return t.stop, nil
	}
	if err := c.q.Post(arm); err != nil {
		return nil, c.opErr("afterfunc", ErrClosed)
	}
	return t.stop, nil
}

// fire runs on the loop when the timer is due.
func (t *timer) fire() {
	t.c.q.dropHold(t.c, t)
	if !t.state.CompareAndSwap(timerPending, timerFired) {
		return
	}
	if t.c.inClose() {
		return
	}
	t.c.callPosted(t.fn)
}

// stop is AfterFunc's stop.
func (t *timer) stop() bool {
	if t == nil || !t.state.CompareAndSwap(timerPending, timerStopped) {
		return false
	}
	if t.c.q.OnLoop() && t.lt != nil {
		t.lt.Stop()
		t.c.q.dropHold(t.c, t)
	}
	return true
}

// connEnded makes a pending timer a connHold: it goes with its connection (loop only).
func (t *timer) connEnded() {
	t.state.CompareAndSwap(timerPending, timerStopped)
	if t.lt != nil {
		t.lt.Stop()
	}
}
