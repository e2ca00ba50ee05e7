package loop

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/leakcheck"
	"github.com/zcnet/zcnet/internal/uring"
)

func TestMain(m *testing.M) {
	if os.Getenv(unpinChildEnv) != "" {
		os.Exit(unpinChild())
	}
	os.Exit(leakcheck.Main(m, 0,
		leakcheck.Check{Name: "rings", Open: uring.OpenRings},
		leakcheck.Check{Name: "buffer rings", Open: uring.OpenBufRings},
	))
}

type driverKind int

const (
	kindURing driverKind = iota
	kindEpoll
)

func (k driverKind) String() string { return [...]string{"uring", "epoll"}[k] }

func startQueue(t testing.TB, k driverKind, init func(q *Queue, d Driver) error) *Queue {
	t.Helper()
	return startQueueWith(t, k, URingConfig{}, init)
}

func startQueueWith(t testing.TB, k driverKind, ucfg URingConfig, init func(q *Queue, d Driver) error) *Queue {
	t.Helper()
	q, err := Start(Config{NoPin: true}, func(q *Queue) (Driver, error) {
		var d Driver
		var err error
		if k == kindURing {
			d, err = NewURing(q, ucfg)
		} else {
			d, err = NewEpoll(q)
		}
		if err == nil && init != nil {
			if err = init(q, d); err != nil {
				d.Close()
			}
		}
		return d, err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

func TestPostDoWake(t *testing.T) {
	for _, k := range []driverKind{kindURing, kindEpoll} {
		t.Run(k.String(), func(t *testing.T) {
			q := startQueue(t, k, nil)
			// Posts from many goroutines run in per-producer order, and sleeping queues wake up.
			var mu sync.Mutex
			seen := map[int][]int{}
			var wg sync.WaitGroup
			for g := 0; g < 4; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					for i := 0; i < 500; i++ {
						if err := q.Post(func() { mu.Lock(); seen[g] = append(seen[g], i); mu.Unlock() }); err != nil {
							t.Error(err)
						}
						if i%100 == 0 {
							time.Sleep(time.Millisecond) // let the queue fall asleep
						}
					}
				}(g)
			}
			wg.Wait()
			if err := q.Do(func() error { return nil }); err != nil {
				t.Fatal(err)
			}
			for g := 0; g < 4; g++ {
				if len(seen[g]) != 500 {
					t.Fatalf("producer %d: %d of 500 tasks ran", g, len(seen[g]))
				}
				for i, v := range seen[g] {
					if v != i {
						t.Fatalf("producer %d: task %d ran as %d-th", g, v, i)
					}
				}
			}
			if q.Stats().Wakeups == 0 {
				t.Error("queue never needed a wakeup: the sleep path was not exercised")
			}
			want := errors.New("x")
			if err := q.Do(func() error { return want }); err != want {
				t.Fatalf("Do = %v", err)
			}
			// Do on the loop runs inline instead of deadlocking.
			if err := q.Do(func() error { return q.Do(func() error { return want }) }); err != want {
				t.Fatalf("nested Do = %v", err)
			}
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			if err := q.Close(); !errors.Is(err, ErrClosed) {
				t.Fatalf("second Close = %v", err)
			}
			if err := q.Post(func() {}); !errors.Is(err, ErrClosed) {
				t.Fatalf("Post after Close = %v", err)
			}
			if err := q.Do(func() error { return nil }); !errors.Is(err, ErrClosed) {
				t.Fatalf("Do after Close = %v", err)
			}
		})
	}
}

// A Post that returned nil always runs, even when it races Close: nothing is dropped.
func TestPostRacingClose(t *testing.T) {
	for round := 0; round < 50; round++ {
		q := startQueue(t, driverKind(round%2), nil)
		var accepted, ran atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 200; i++ {
					if q.Post(func() { ran.Add(1) }) == nil {
						accepted.Add(1)
					}
				}
			}()
		}
		time.Sleep(time.Duration(round%5) * 100 * time.Microsecond)
		q.Close()
		wg.Wait()
		if accepted.Load() != ran.Load() {
			t.Fatalf("round %d: %d posts accepted, %d ran", round, accepted.Load(), ran.Load())
		}
	}
}

// Close from the loop itself returns at once and stops the loop after the current work.
func TestCloseFromLoop(t *testing.T) {
	q := startQueue(t, kindEpoll, nil)
	done := make(chan error, 1)
	q.Post(func() { done <- q.Close() })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case <-q.Stopped():
	case <-time.After(10 * time.Second):
		t.Fatal("loop did not stop")
	}
}

type recOwner struct {
	evs []Event
}

func (o *recOwner) OnEvent(q *Queue, ev Event) { o.evs = append(o.evs, ev) }

// Operation ids carry a 32-bit generation: an event for a freed operation is stray, even after
// its slot was reused many times.
func TestOpGenerations(t *testing.T) {
	q := startQueue(t, kindEpoll, nil)
	err := q.Do(func() error {
		a := &recOwner{}
		ud := q.NewOp(a, 7)
		q.FreeOp(ud)
		q.FreeOp(ud) // idempotent
		b := &recOwner{}
		var last uint64
		for i := 0; i < 10000; i++ {
			last = q.NewOp(b, 9)
			if uint32(last) != uint32(ud) {
				return fmt.Errorf("slot not reused: %#x vs %#x", last, ud)
			}
			if i < 9999 {
				q.FreeOp(last)
			}
		}
		q.Dispatch(Event{UD: ud, Res: 1})
		q.Dispatch(Event{UD: last, Res: 2})
		if len(a.evs) != 0 || len(b.evs) != 1 || b.evs[0].Tag != 9 || b.evs[0].Res != 2 {
			return fmt.Errorf("a %v b %v", a.evs, b.evs)
		}
		if q.Stats().Stray != 1 {
			return fmt.Errorf("stray %d", q.Stats().Stray)
		}
		if !q.OpLive(last) || q.OpLive(ud) {
			return errors.New("OpLive")
		}
		q.FreeOp(last)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := q.Stats().OpsLive; n != 0 {
		t.Fatalf("%d ops live", n)
	}
}

func TestTimers(t *testing.T) {
	q := startQueue(t, kindURing, nil)
	got := make(chan int, 3)
	q.Post(func() {
		q.After(30*time.Millisecond, func() { got <- 3 })
		q.After(10*time.Millisecond, func() { got <- 1 })
		stop := q.After(20*time.Millisecond, func() { got <- 2 })
		if !stop.Stop() || stop.Stop() {
			t.Error("Stop")
		}
	})
	for _, want := range []int{1, 3} {
		select {
		case v := <-got:
			if v != want {
				t.Fatalf("timer %d fired, want %d", v, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("timer did not fire")
		}
	}
}

// epoll events reach their operation; after the operation is freed and the descriptor closed,
// nothing more arrives.
func TestEpollReadiness(t *testing.T) {
	var ep *Epoll
	q := startQueue(t, kindEpoll, func(q *Queue, d Driver) error { ep = d.(*Epoll); return nil })
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	got := make(chan []byte, 10)
	o := &funcOwner{fn: func(q *Queue, ev Event) {
		buf := make([]byte, 64)
		n, _ := unix.Read(fds[1], buf)
		if n > 0 {
			got <- buf[:n]
		}
	}}
	var ud uint64
	q.Do(func() error {
		ud = q.NewOp(o, 1)
		return ep.Add(fds[1], unix.EPOLLIN, ud)
	})
	unix.Write(fds[0], []byte("hello"))
	select {
	case b := <-got:
		if string(b) != "hello" {
			t.Fatalf("got %q", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no readiness")
	}
	q.Do(func() error { ep.Del(fds[1]); q.FreeOp(ud); return unix.Close(fds[1]) })
}

type funcOwner struct{ fn func(q *Queue, ev Event) }

func (o *funcOwner) OnEvent(q *Queue, ev Event) { o.fn(q, ev) }

// testFeeder owns a receive ring's memory the way zc's pool does: 4 buffers at first, 4 more
// at each Grow up to max.
type testFeeder struct {
	rr     *RecvRing
	mem    []byte
	size   int
	n, max int
	grows  int
}

func newTestFeeder(tb testing.TB, size, max int) *testFeeder {
	mem, err := unix.Mmap(-1, 0, size*max, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Munmap(mem) })
	return &testFeeder{mem: mem, size: size, max: max}
}

func (f *testFeeder) addr(bid uint16) uintptr {
	return uintptr(unsafe.Pointer(&f.mem[int(bid)*f.size]))
}

func (f *testFeeder) bytes(bid uint16, n int) []byte { return f.mem[int(bid)*f.size:][:n] }

func (f *testFeeder) add(k int) bool {
	if f.n >= f.max {
		return false
	}
	for i := 0; i < k && f.n < f.max; i++ {
		f.rr.Add(f.addr(uint16(f.n)), uint16(f.n), true)
		f.n++
	}
	return true
}

func (f *testFeeder) grow() bool {
	if !f.add(4) {
		return false
	}
	f.grows++
	return true
}

// A multishot recv through the provided-buffer ring: its owner gives it 4 buffers and more
// when it asks (Grow) while the receiver holds buffers, up to 64; every byte arrives in order.
func TestRecvRingGrows(t *testing.T) {
	for _, c := range []struct{ bundles, cqe32 bool }{{false, false}, {true, false}, {true, true}} {
		bundles := c.bundles
		t.Run(fmt.Sprintf("bundles=%v,cqe32=%v", bundles, c.cqe32), func(t *testing.T) {
			var u *URing
			var rr *RecvRing
			f := newTestFeeder(t, 4096, 64)
			q := startQueueWith(t, kindURing, URingConfig{CQE32: c.cqe32}, func(q *Queue, d Driver) error {
				u = d.(*URing)
				if u.BigCQE() != c.cqe32 {
					return fmt.Errorf("CQE32 %v, ring posts big CQEs: %v", c.cqe32, u.BigCQE())
				}
				var err error
				rr, err = u.NewRecvRing(RecvRingConfig{Bufs: 64, BufSize: 4096, Bundles: bundles, Grow: f.grow})
				if err != nil {
					return err
				}
				f.rr = rr
				f.add(4)
				rr.Flush(q)
				return nil
			})
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fds[0])
			const size = 2 << 20
			var got bytes.Buffer
			var hold []uint16
			release := func() {
				for _, bid := range hold {
					rr.Add(f.addr(bid), bid, false)
				}
				hold = hold[:0]
			}
			done := make(chan struct{})
			arms := 0
			var o *funcOwner
			var ud uint64
			arm := func() {
				arms++
				sqe := u.GetSQE()
				sqe.PrepRecvMultishot(int32(fds[1]), rr.Group(), 0, rr.Bundles())
				sqe.UserData = ud
			}
			rearm := &flushFunc{fn: arm}
			o = &funcOwner{fn: func(q *Queue, ev Event) {
				if got.Len() >= size {
					return
				}
				switch {
				case ev.Res == -int32(unix.ENOBUFS):
				case ev.Res <= 0:
					t.Errorf("recv: %d", ev.Res)
					close(done)
					return
				default:
					rr.Received(ev, func(bid uint16, n int) {
						got.Write(f.bytes(bid, n))
						hold = append(hold, bid)
					})
					// Hold up to 40 buffers, then give them all back: the ring must ask for
					// more than its 4 first buffers to let that happen.
					if len(hold) >= 40 {
						release()
					}
				}
				if got.Len() >= size {
					release()
					u.CancelOp(ud)
					close(done)
					return
				}
				if ev.Flags&uring.CQEFMore == 0 {
					if ev.Res == -int32(unix.ENOBUFS) {
						release()
						rr.WaitBuffers(rearm)
						return
					}
					arm()
				}
			}}
			q.Do(func() error { ud = q.NewOp(o, 1); arm(); return nil })
			want := make([]byte, size)
			for i := range want {
				want[i] = byte(i*31 + i>>9)
			}
			go func() {
				for off := 0; off < size; {
					n, err := unix.Write(fds[0], want[off:min(size, off+50000)])
					if err != nil {
						return
					}
					off += n
				}
			}()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("timed out: got %d, stats %+v", got.Len(), rr.Stats())
			}
			unix.Close(fds[1])
			var grows, n int
			q.Do(func() error { q.FreeOp(ud); grows, n = f.grows, f.n; return nil })
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatal("received data differs")
			}
			st := rr.Stats()
			if st.Mismatch != 0 || grows == 0 || n <= 4 || n > 64 {
				t.Fatalf("stats %+v, %d grows, %d buffers", st, grows, n)
			}
			t.Logf("%d arms, %d grows to %d buffers, stats %+v", arms, grows, n, st)
		})
	}
}

type flushFunc struct{ fn func() }

func (f *flushFunc) Flush(q *Queue) { f.fn() }

// A buffer received before the queue closed is still its owner's memory after the close (the
// ring never maps or unmaps what it is given), and the buffer ring itself is gone.
func TestRecvBufferOutlivesQueue(t *testing.T) {
	before := uring.OpenBufRings()
	var u *URing
	var rr *RecvRing
	f := newTestFeeder(t, 4096, 4)
	q, err := Start(Config{NoPin: true}, func(q *Queue) (Driver, error) {
		var err error
		u, err = NewURing(q, URingConfig{})
		if err != nil {
			return nil, err
		}
		rr, err = u.NewRecvRing(RecvRingConfig{Bufs: 4, BufSize: 4096})
		if err != nil {
			u.Close()
			return nil, err
		}
		f.rr = rr
		f.add(4)
		rr.Flush(q)
		return u, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if uring.OpenBufRings() != before+1 {
		t.Fatal("no buffer ring open")
	}
	fds, _ := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	unix.Write(fds[0], []byte("payload"))
	type rcv struct {
		bid uint16
		n   int
	}
	got := make(chan rcv, 1)
	q.Do(func() error {
		var ud uint64
		ud = q.NewOp(&funcOwner{fn: func(q *Queue, ev Event) {
			rr.Received(ev, func(bid uint16, n int) { got <- rcv{bid, n} })
			q.FreeOp(ud)
		}}, 1)
		sqe := u.GetSQE()
		sqe.PrepRecvMultishot(int32(fds[1]), 0, 0, false)
		sqe.UserData = ud
		return nil
	})
	r := <-got
	q.Close()
	if b := f.bytes(r.bid, r.n); r.n != 7 || string(b) != "payload" {
		t.Fatalf("got %q", b)
	}
	f.bytes(r.bid, 1)[0] = 'P' // must not fault
	if uring.OpenBufRings() != before {
		t.Fatal("buffer ring left open after Close")
	}
}

// A busy-polling queue still serves posts and timers, and polls instead of sleeping.
func TestBusyPoll(t *testing.T) {
	for _, k := range []driverKind{kindURing, kindEpoll} {
		t.Run(k.String(), func(t *testing.T) {
			q, err := Start(Config{NoPin: true, BusyPoll: 2 * time.Millisecond}, func(q *Queue) (Driver, error) {
				if k == kindURing {
					return NewURing(q, URingConfig{})
				}
				return NewEpoll(q)
			})
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			for i := 0; i < 50; i++ {
				if err := q.Do(func() error { return nil }); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Microsecond)
			}
			fired := make(chan struct{})
			q.Post(func() { q.After(5*time.Millisecond, func() { close(fired) }) })
			select {
			case <-fired:
			case <-time.After(10 * time.Second):
				t.Fatal("timer did not fire")
			}
			if q.Stats().Spins == 0 {
				t.Fatal("never polled")
			}
		})
	}
}

// TestCQE32Events: on a CQE32 ring every completion reaches its owner whole (the reaper
// steps over 32-byte entries), with Event.Big carrying the second half (zero for NOPs);
// OnClose functions run on the loop once the ring is gone.
func TestCQE32Events(t *testing.T) {
	for _, big := range []bool{false, true} {
		var u *URing
		closed := make(chan bool, 1)
		q, err := Start(Config{NoPin: true}, func(q *Queue) (Driver, error) {
			var err error
			u, err = NewURing(q, URingConfig{CQE32: big})
			if err == nil {
				u.OnClose(func() { closed <- q.OnLoop() && errors.Is(u.Ring().Close(), os.ErrClosed) })
			}
			return u, err
		})
		if err != nil {
			t.Fatal(err)
		}
		o := &recOwner{}
		const n = 3000 // more than the CQ holds at once: the reaper wraps around the ring
		var uds []uint64
		err = q.Do(func() error {
			if u.BigCQE() != big {
				return fmt.Errorf("BigCQE %v, want %v", u.BigCQE(), big)
			}
			for i := 0; i < n; i++ {
				ud := q.NewOp(o, uint32(i))
				uds = append(uds, ud)
				sqe := u.GetSQE()
				sqe.PrepNop()
				sqe.UserData = ud
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			var got int
			q.Do(func() error { got = len(o.evs); return nil })
			if got == n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cqe32=%v: %d of %d completions", big, got, n)
			}
			time.Sleep(time.Millisecond)
		}
		q.Do(func() error {
			for i, ev := range o.evs {
				if ev.UD != uds[ev.Tag] || ev.Res != 0 || ev.Big != [2]uint64{} {
					t.Errorf("cqe32=%v: event %d: %+v", big, i, ev)
					break
				}
				q.FreeOp(ev.UD)
			}
			return nil
		})
		if st := q.Stats(); st.Stray != 0 || st.OpsLive != 0 {
			t.Fatalf("cqe32=%v: stats %+v", big, st)
		}
		q.Close()
		select {
		case ok := <-closed:
			if !ok {
				t.Fatal("OnClose did not run on the loop after the ring closed")
			}
		default:
			t.Fatal("OnClose did not run")
		}
	}
}

// TestNestedReap: a handler that reaps from inside the dispatch loop (what GetSQE does when
// the SQ is full and the submit fails) must not reap into the array the outer loop still
// reads: every completion is dispatched exactly once.
func TestNestedReap(t *testing.T) {
	for _, big := range []bool{false, true} {
		var u *URing
		q := startQueueWith(t, kindURing, URingConfig{CQE32: big}, func(q *Queue, d Driver) error { u = d.(*URing); return nil })
		seen := map[uint64]int{}
		done := make(chan struct{})
		const first, second = 8, 8
		nested := false
		var o *funcOwner
		o = &funcOwner{fn: func(q *Queue, ev Event) {
			seen[ev.UD]++
			q.FreeOp(ev.UD)
			if !nested {
				nested = true
				for i := 0; i < second; i++ {
					sqe := u.GetSQE()
					sqe.PrepNop()
					sqe.UserData = q.NewOp(o, 2)
				}
				u.Submit() // NOPs complete at once
				u.reap()   // nested
			}
			if len(seen) == first+second {
				close(done)
			}
		}}
		q.Do(func() error {
			for i := 0; i < first; i++ {
				sqe := u.GetSQE()
				sqe.PrepNop()
				sqe.UserData = q.NewOp(o, 1)
			}
			return nil
		})
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("cqe32=%v: %d completions seen", big, len(seen))
		}
		q.Do(func() error {
			for ud, n := range seen {
				if n != 1 {
					t.Errorf("cqe32=%v: completion %#x dispatched %d times", big, ud, n)
				}
			}
			return nil
		})
		if st := q.Stats(); st.Stray != 0 {
			t.Fatalf("cqe32=%v: %d stray events", big, st.Stray)
		}
	}
}

// OnLoop is true in every place the loop runs other code (a posted task, a timer, an event's
// owner, busy polling included) and false everywhere else, whether the loop sleeps in the
// kernel (no system call is made then) or runs.
func TestOnLoop(t *testing.T) {
	for _, k := range []driverKind{kindURing, kindEpoll} {
		for _, busy := range []time.Duration{0, 50 * time.Millisecond} {
			t.Run(fmt.Sprintf("%v/busy=%v", k, busy), func(t *testing.T) {
				var ep *Epoll
				q, err := Start(Config{NoPin: true, BusyPoll: busy}, func(q *Queue) (Driver, error) {
					if k == kindURing {
						return NewURing(q, URingConfig{})
					}
					d, err := NewEpoll(q)
					ep = d
					return d, err
				})
				if err != nil {
					t.Fatal(err)
				}
				defer q.Close()
				got := make(chan string, 8)
				check := func(where string) {
					if !q.OnLoop() {
						got <- where + ": OnLoop false on the loop"
						return
					}
					got <- ""
				}
				q.Post(func() { check("Post") })
				q.Post(func() { q.After(time.Millisecond, func() { check("timer") }) })
				if k == kindEpoll {
					fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
					if err != nil {
						t.Fatal(err)
					}
					defer unix.Close(fds[0])
					defer unix.Close(fds[1])
					var ud uint64
					o := &funcOwner{fn: func(q *Queue, ev Event) { ep.Del(fds[1]); q.FreeOp(ud); check("event") }}
					q.Do(func() error { ud = q.NewOp(o, 1); return ep.Add(fds[1], unix.EPOLLIN, ud) })
					time.Sleep(5 * time.Millisecond) // the loop waits (or polls) first
					unix.Write(fds[0], []byte("x"))
				} else {
					got <- ""
				}
				for i := 0; i < 3; i++ {
					select {
					case msg := <-got:
						if msg != "" {
							t.Error(msg)
						}
					case <-time.After(10 * time.Second):
						t.Fatal("a check did not run")
					}
				}
				// Elsewhere: while the loop sleeps, and while it is busy with a task.
				for i := 0; i < 100; i++ {
					if q.OnLoop() {
						t.Fatal("OnLoop true off the loop (loop idle)")
					}
				}
				release := make(chan struct{})
				running := make(chan struct{})
				q.Post(func() { close(running); <-release })
				<-running
				if q.OnLoop() || !q.MayBeOnLoop() {
					t.Errorf("while the loop runs a task: OnLoop %v (want false), MayBeOnLoop %v (want true)", q.OnLoop(), q.MayBeOnLoop())
				}
				close(release)
			})
		}
	}
}

// A task that a handler posts while the loop dispatches the completions of a wait runs in the
// loop's next round: it must not write the eventfd to wake the loop, which is not asleep
// (a wasted system call, completion and io_uring_enter per wait under traffic).
func TestPostFromHandlerNoWake(t *testing.T) {
	for _, k := range []driverKind{kindURing, kindEpoll} {
		t.Run(k.String(), func(t *testing.T) {
			var d Driver
			q := startQueue(t, k, func(_ *Queue, dd Driver) error { d = dd; return nil })
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fds[0])
			// io_uring reads into a page of its own (the kernel writes it asynchronously)
			page, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(page)
			ran := make(chan struct{}, 1)
			var ud uint64
			arm := func() {
				sqe := d.(*URing).GetSQE()
				sqe.PrepRead(int32(fds[1]), uintptr(unsafe.Pointer(&page[0])), 64)
				sqe.UserData = ud
			}
			o := &funcOwner{fn: func(q *Queue, ev Event) {
				if k == kindEpoll {
					unix.Read(fds[1], page[:64])
				} else {
					arm()
				}
				if err := q.Post(func() { ran <- struct{}{} }); err != nil {
					t.Error(err)
				}
			}}
			q.Do(func() error {
				ud = q.NewOp(o, 1)
				if k == kindEpoll {
					return d.(*Epoll).Add(fds[1], unix.EPOLLIN, ud)
				}
				arm()
				return nil
			})
			for i := range 20 {
				// Wait until the loop sleeps in the kernel, so that the byte's completion
				// wakes it and the handler posts while the loop dispatches.
				deadline := time.Now().Add(10 * time.Second)
				for q.sleeping.Load() != 1 {
					if time.Now().After(deadline) {
						t.Fatal("the loop never went to sleep")
					}
					time.Sleep(time.Millisecond)
				}
				before := q.Stats().Wakeups
				unix.Write(fds[0], []byte{byte(i)})
				select {
				case <-ran:
				case <-time.After(10 * time.Second):
					t.Fatal("the posted task never ran")
				}
				if w := q.Stats().Wakeups - before; w != 0 {
					t.Fatalf("round %d: a task posted by a handler during dispatch wrote the eventfd %d times", i, w)
				}
			}
			q.Do(func() error {
				if k == kindEpoll {
					d.(*Epoll).Del(fds[1])
				} else {
					d.(*URing).CancelOp(ud)
				}
				return nil
			})
			q.Close()
			unix.Close(fds[1])
		})
	}
}
