package loop

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// forParkKinds runs test with each wait that parks: waitPark and waitHybrid.
func forParkKinds(t *testing.T, test func(t *testing.T, kind driverKind)) {
	for _, k := range []driverKind{kindURingPark, kindURingHybrid} {
		t.Run(k.String(), func(t *testing.T) { test(t, k) })
	}
}

// readFixture makes a socket pair and a page for the ring to read into, released after the
// queue (start the queue after calling it: cleanups run last-in first-out, so the queue
// closes, and its reads end, before the page is unmapped).
func readFixture(t *testing.T) ([2]int, []byte) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	page, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Munmap(page)
		unix.Close(fds[0])
		unix.Close(fds[1])
	})
	return [2]int{fds[0], fds[1]}, page
}

// untilParked waits until the loop has parked more than n times.
func untilParked(t *testing.T, u *URing, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for u.parked.Load() <= n {
		if time.Now().After(deadline) {
			t.Fatal("the loop never parked")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// recvWithin fails the test when nothing arrives on ch for 10 s (a lost wake-up: the loop
// sleeps with its work ready).
func recvWithin[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the loop was not woken", what)
		panic("unreachable")
	}
}

// The parking wait is woken by each of its wakers while the loop is parked: a completion
// that the kernel produces through deferred task work (a read of a socket), a task posted by
// another goroutine, a timer of the loop (the park's deadline), and Close. The loop parks in
// between (its parked count grows), so each wake-up ends a real park.
func TestParkWakers(t *testing.T) { forParkKinds(t, testParkWakers) }

func testParkWakers(t *testing.T, kind driverKind) {
	fds, page := readFixture(t)
	var u *URing
	q := startQueue(t, kind, func(q *Queue, d Driver) error { u = d.(*URing); return nil })
	if !u.Parks() {
		t.Fatal("the driver does not park")
	}
	type read struct {
		b      byte
		parked uint64 // the parks before the completion's dispatch
	}
	got := make(chan read, 1)
	var ud uint64
	arm := func() {
		sqe := u.GetSQE()
		sqe.PrepRead(int32(fds[1]), uintptr(unsafe.Pointer(&page[0])), 1)
		sqe.UserData = ud
	}
	o := &funcOwner{fn: func(q *Queue, ev Event) {
		if ev.Res != 1 {
			t.Errorf("read: res %d", ev.Res)
			return
		}
		b := page[0]
		arm()
		got <- read{b, u.parked.Load()}
	}}
	var parked uint64
	q.Do(func() error { ud = q.NewOp(o, 1); arm(); parked = u.parked.Load(); return nil })

	for i := range 30 {
		untilParked(t, u, parked) // the byte's completion ends a park
		unix.Write(fds[0], []byte{byte(i)})
		r := recvWithin(t, got, fmt.Sprintf("completion %d", i))
		if r.b != byte(i) {
			t.Fatalf("read %d, want %d", r.b, i)
		}
		parked = r.parked
	}
	for i := range 30 {
		untilParked(t, u, parked)
		ran := make(chan struct{}, 1)
		if err := q.Post(func() { parked = u.parked.Load(); ran <- struct{}{} }); err != nil {
			t.Fatal(err)
		}
		recvWithin(t, ran, fmt.Sprintf("post %d", i))
	}
	for i := range 10 {
		fired := make(chan struct{}, 1)
		q.Post(func() { q.After(time.Duration(i)*time.Millisecond, func() { fired <- struct{}{} }) })
		recvWithin(t, fired, fmt.Sprintf("timer %d", i))
	}
	// A park with a deadline, then one without: the cleared deadline must not end it.
	q.Post(func() { q.After(time.Millisecond, func() {}) })
	time.Sleep(5 * time.Millisecond)
	before := u.parked.Load()
	time.Sleep(20 * time.Millisecond)
	if n := u.parked.Load(); n > before+2 {
		t.Errorf("an idle loop without timers parked %d times in 20 ms: the park's deadline was not cleared", n-before)
	}
	q.Do(func() error { q.FreeOp(ud); u.CancelOp(ud); parked = u.parked.Load(); return nil })

	untilParked(t, u, parked)
	closed := make(chan error, 1)
	go func() { closed <- q.Close() }()
	if err := recvWithin(t, closed, "Close"); err != nil {
		t.Fatal(err)
	}
}

// No lost wake-up: a goroutine and the loop hand a turn back and forth many times, by a
// posted task and by a socket byte whose read completes on the loop, so the loop goes to
// sleep between turns at every point of its way into the park (before it sets sleeping,
// between the look and the park, parked) while the turn's two wakers race it. Each turn
// must reach the loop.
func TestParkNoLostWakeup(t *testing.T) { forParkKinds(t, testParkNoLostWakeup) }

func testParkNoLostWakeup(t *testing.T, kind driverKind) {
	fds, page := readFixture(t)
	var u *URing
	q := startQueue(t, kind, func(q *Queue, d Driver) error { u = d.(*URing); return nil })
	turn := make(chan int, 2)
	var ud uint64
	arm := func() {
		sqe := u.GetSQE()
		sqe.PrepRead(int32(fds[1]), uintptr(unsafe.Pointer(&page[0])), 1)
		sqe.UserData = ud
	}
	o := &funcOwner{fn: func(q *Queue, ev Event) {
		if ev.Res != 1 {
			t.Errorf("read: res %d", ev.Res)
			return
		}
		arm()
		turn <- 1
	}}
	q.Do(func() error { ud = q.NewOp(o, 1); arm(); return nil })
	var spin atomic.Int64
	n := 3000
	if testing.Short() {
		n = 500
	}
	for i := range n {
		// Vary the gap so that the wakers land at different points of the loop's way to sleep.
		for j := 0; j < i%64*8; j++ {
			spin.Add(1)
		}
		// Turn kinds: 0 a socket byte alone, 1 a posted task alone, 2 both at once.
		want := 0
		if i%3 != 1 {
			unix.Write(fds[0], []byte{1})
			want++
		}
		if i%3 != 0 {
			q.Post(func() { turn <- 2 })
			want++
		}
		for range want {
			recvWithin(t, turn, fmt.Sprintf("turn %d", i))
		}
	}
	if p := u.parked.Load(); p == 0 {
		t.Fatal("the loop never parked")
	} else {
		t.Logf("%d turns, %d parks", n, p)
	}
	q.Do(func() error { q.FreeOp(ud); u.CancelOp(ud); return nil })
}

// Drain (an AtStop function waiting for completions after the stop request) works with the
// parking wait: the stop request does not count as work, the completion wakes the park.
func TestParkDrain(t *testing.T) { forParkKinds(t, testParkDrain) }

func testParkDrain(t *testing.T, kind driverKind) {
	fds, page := readFixture(t)
	var u *URing
	var done atomic.Bool
	drained := make(chan bool, 1)
	q := startQueue(t, kind, func(q *Queue, d Driver) error {
		u = d.(*URing)
		ud := q.NewOp(&funcOwner{fn: func(q *Queue, ev Event) { done.Store(true) }}, 1)
		sqe := u.GetSQE()
		sqe.PrepRead(int32(fds[1]), uintptr(unsafe.Pointer(&page[0])), 1)
		sqe.UserData = ud
		q.AtStop(func() {
			parked := u.parked.Load()
			go func() {
				// The byte comes once Drain parks: the park must end with its completion.
				for u.parked.Load() == parked {
					time.Sleep(100 * time.Microsecond)
				}
				unix.Write(fds[0], []byte{1})
			}()
			drained <- q.Drain(10*time.Second, done.Load)
		})
		return nil
	})
	untilParked(t, u, 0)
	q.Close()
	if !recvWithin(t, drained, "Drain") {
		t.Fatal("Drain did not see the completion")
	}
}
