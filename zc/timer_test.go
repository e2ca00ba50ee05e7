package zc

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
)

// TestAfterFunc: timers run on the connection's queue goroutine, Stop cancels, a closing
// connection's timers never run, misuse is typed.
func TestAfterFunc(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		e := newEngine(t, Config{Queues: 2, Backend: b, NoFallback: true})
		c, _ := dialPeer(t, e, HandlerFuncs{})
		ran := make(chan bool, 1)
		if _, err := c.AfterFunc(time.Millisecond, func() { ran <- c.q.OnLoop() }); err != nil {
			t.Fatal(err)
		}
		if !<-ran {
			t.Fatal("the timer ran off its connection's queue goroutine")
		}
		// Stop before it is due: it never runs (a later timer tells the loop passed it).
		var stoppedRan atomic.Bool
		t1, err := c.AfterFunc(20*time.Millisecond, func() { stoppedRan.Store(true) })
		if err != nil {
			t.Fatal(err)
		}
		if !t1() || t1() {
			t.Fatal("Stop of a pending timer: want true once, then false")
		}
		later := make(chan struct{})
		c.AfterFunc(40*time.Millisecond, func() { close(later) })
		<-later
		if stoppedRan.Load() {
			t.Fatal("a stopped timer ran")
		}
		// Stop on the loop, and a timer set from a timer.
		chain := make(chan struct{})
		c.Post(func() {
			t2, _ := c.AfterFunc(time.Hour, func() { t.Error("stopped on the loop, ran") })
			if !t2() {
				t.Error("Stop on the loop returned false")
			}
			c.AfterFunc(0, func() { close(chain) })
		})
		<-chain
		// Misuse.
		if _, err := c.AfterFunc(time.Second, nil); !errors.Is(err, ErrInvalid) {
			t.Fatalf("nil fn: %v", err)
		}
		var closedRan atomic.Bool
		if _, err := c.AfterFunc(30*time.Millisecond, func() { closedRan.Store(true) }); err != nil {
			t.Fatal(err)
		}
		c.Close()
		<-c.Done()
		if _, err := c.AfterFunc(time.Millisecond, func() {}); !errors.Is(err, ErrClosed) {
			t.Fatalf("AfterFunc after Close: %v", err)
		}
		// Another connection of the same engine outlives the closed one's timer.
		c2, _ := dialPeer(t, e, HandlerFuncs{})
		done2 := make(chan struct{})
		c2.AfterFunc(60*time.Millisecond, func() { close(done2) })
		<-done2
		if closedRan.Load() {
			t.Fatal("a closed connection's timer ran")
		}
		if n := len(c.q.timersOf(c)); n != 0 {
			t.Fatalf("%d timers left for a finished connection", n)
		}
		// A panic in the timer closes the connection with a *PanicError.
		closed := make(chan error, 1)
		c3, _ := dialPeer(t, e, HandlerFuncs{Close: func(_ *Conn, err error) { closed <- err }})
		c3.AfterFunc(0, func() { panic("timer") })
		var pe *PanicError
		if err := <-closed; !errors.As(err, &pe) {
			t.Fatalf("OnClose after a panicking timer: %v", err)
		}
	})
}

// timersOf returns c's pending timers, read on the loop.
func (q *queue) timersOf(c *Conn) []*timer {
	var ts []*timer
	q.Do(func() error {
		for _, h := range q.holds[c] {
			if t, ok := h.(*timer); ok {
				ts = append(ts, t)
			}
		}
		return nil
	})
	return ts
}

// TestWriteContext: a Write blocked by a peer that does not read returns when its context
// ends, with the context's error and what it queued; exactly those bytes arrive.
func TestWriteContext(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		e := newEngine(t, Config{Queues: 1, Backend: b, NoFallback: true, MaxQueuedBytes: 256 << 10,
			SocketOptions: func(s *tcpglue.Socket) error { _, err := s.SetSendBuffer(16 << 10); return err }})
		c, peer := dialPeer(t, e, HandlerFuncs{})
		ctx, cancel := context.WithCancel(context.Background())
		type result struct {
			n   int
			err error
		}
		res := make(chan result, 1)
		p := make([]byte, 16<<20)
		for i := range p {
			p[i] = byte(i * 13)
		}
		go func() {
			n, err := c.WriteContext(ctx, p)
			res <- result{n, err}
		}()
		testutil.Eventually(t, "the writer blocked at MaxQueuedBytes", func() bool { return c.Queued() >= 256<<10 })
		cancel()
		r := <-res
		if !errors.Is(r.err, context.Canceled) || r.n <= 0 || r.n >= len(p) {
			t.Fatalf("WriteContext after cancel = %d, %v", r.n, r.err)
		}
		// The deadline form, with Timeout().
		dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer dcancel()
		n2, err := c.WriteContext(dctx, p[r.n:])
		var ne net.Error
		if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("WriteContext past its deadline = %d, %v", n2, err)
		}
		if _, err := c.WriteContext(dctx, p); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WriteContext with an ended context = %v", err)
		}
		// Exactly what was reported written arrives, in order.
		c.Close()
		got, err := io.ReadAll(peer)
		if err != nil {
			t.Fatal(err)
		}
		want := p[:r.n+n2]
		if len(got) != len(want) {
			t.Fatalf("peer got %d bytes, WriteContext reported %d", len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("byte %d differs", i)
			}
		}
		// On a queue goroutine it never waits.
		c4, _ := dialPeer(t, e, HandlerFuncs{})
		errc := make(chan error, 1)
		c4.Post(func() {
			_, err := c4.WriteContext(context.Background(), make([]byte, 8<<20))
			errc <- err
		})
		if err := <-errc; !errors.Is(err, ErrWouldBlock) {
			t.Fatalf("WriteContext on the loop = %v, want ErrWouldBlock", err)
		}
	})
}
