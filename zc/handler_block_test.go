package zc

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// A handler cannot hang the engine: every call that would wait for its own queue
// returns ErrWouldBlock there, or has a form that completes in the background. Each call is
// made from the three places user code runs on a queue goroutine: the accept function,
// OnData, and a function given to Conn.Post. A 10 s bound per step only detects a hang.

const hangBound = 10 * time.Second

// handlerSites are the places a call is made from.
var handlerSites = []string{"accept", "OnData", "Post"}

// queueSite is what runOnQueue set up: the listener, the client socket (kept open) and the
// accepted connection.
type queueSite struct {
	l *Listener
	s *tcpglue.Socket
	c *Conn
}

// runOnQueue listens on e and runs fn on the queue goroutine of the accepted connection,
// from site; fn gets the listener too. onClose, if not nil, is the connection's OnClose.
// The listener is closed at cleanup.
func runOnQueue(t *testing.T, e *Engine, site string, fn func(l *Listener, c *Conn), onClose func(c *Conn, err error)) queueSite {
	t.Helper()
	conns := make(chan *Conn, 1)
	ready := make(chan struct{}) // l is set
	var l *Listener
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		<-ready
		if site == "accept" {
			fn(l, c)
		}
		conns <- c
		return HandlerFuncs{
			Data: func(c *Conn, d Data) {
				d.Release()
				if site == "OnData" {
					fn(l, c)
				}
			},
			Close: onClose,
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	close(ready)
	t.Cleanup(func() { l.Close() })
	s := dialPlain(t, l.Addr().String())
	c := recvEvent(t, conns, "accept")
	switch site {
	case "OnData":
		if _, err := s.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	case "Post":
		if err := c.Post(func() { fn(l, c) }); err != nil {
			t.Fatal(err)
		}
	}
	return queueSite{l: l, s: s, c: c}
}

func waitHang[T any](t *testing.T, ch <-chan T, what string, dump func() string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangBound):
		state := "" // dump may be nil: the failure then names only what hung
		if dump != nil {
			state = dump()
		}
		t.Fatalf("%s hung\n%s", what, state)
	}
	var zero T
	return zero
}

func TestHandlerCannotHang(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testHandlerCannotHang(t, Config{Backend: b}) })
}

func testHandlerCannotHang(t *testing.T, base Config) {
	base.Queues = 1 // everything on one queue: "its own queue" for every call
	base.NoPin = true
	for _, site := range handlerSites {
		t.Run("Dial/"+site, func(t *testing.T) {
			e := newEngine(t, base)
			target, _ := listenEvents(t, e)
			got := make(chan error, 1)
			runOnQueue(t, e, site, func(_ *Listener, c *Conn) {
				nc, err := e.Dial(context.Background(), "tcp", target.Addr().String(), HandlerFuncs{})
				if nc != nil {
					nc.Close()
				}
				got <- err
			}, nil)
			err := waitHang(t, got, "Engine.Dial from "+site, func() string { return engineDump(e) })
			if !errors.Is(err, ErrWouldBlock) {
				t.Fatalf("Engine.Dial from %s = %v, want ErrWouldBlock", site, err)
			}
			closeEngineBounded(t, e)
		})
		t.Run("DialAsync/"+site, func(t *testing.T) {
			e := newEngine(t, base)
			target, err := e.Listen("tcp", "127.0.0.1:0", echoAccept)
			if err != nil {
				t.Fatal(err)
			}
			defer target.Close()
			k := newCollector(5)
			type result struct {
				c      *Conn
				err    error
				onLoop bool
			}
			got := make(chan result, 1)
			runOnQueue(t, e, site, func(_ *Listener, c *Conn) {
				err := e.DialAsync(context.Background(), "tcp", target.Addr().String(), k.handler(), func(nc *Conn, err error) {
					got <- result{nc, err, e.onAnyLoop()}
				})
				if err != nil {
					got <- result{nil, err, true}
				}
			}, nil)
			r := waitHang(t, got, "DialAsync's callback", func() string { return engineDump(e) })
			if r.err != nil || r.c == nil || !r.onLoop {
				t.Fatalf("DialAsync from %s: conn %v, err %v, callback on a queue goroutine %v", site, r.c, r.err, r.onLoop)
			}
			if _, err := r.c.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			waitHang(t, k.done, "echo over the DialAsync connection", func() string { return engineDump(e) })
			r.c.Close()
			waitHang(t, r.c.Done(), "Close of the DialAsync connection", func() string { return engineDump(e) })
		})
		t.Run("EngineClose/"+site, func(t *testing.T) {
			e, err := New(base)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			closed := make(chan error, 1)
			q := runOnQueue(t, e, site, func(*Listener, *Conn) { got <- e.Close() },
				func(c *Conn, err error) { closed <- err })
			if err := waitHang(t, got, "Engine.Close from "+site, func() string { return "" }); err != nil {
				t.Fatalf("Engine.Close from %s = %v", site, err)
			}
			waitHang(t, e.Done(), "the engine's background close", func() string { return "" })
			waitHang(t, q.c.Done(), "the connection's close", func() string { return "" })
			if site != "accept" {
				// The handler was installed: OnClose ran.
				waitHang(t, closed, "OnClose", func() string { return "" })
			}
			waitHang(t, q.l.Done(), "the listener's close", func() string { return "" })
			if err := e.Close(); !errors.Is(err, ErrClosed) {
				t.Fatalf("second Engine.Close = %v, want ErrClosed", err)
			}
		})
		t.Run("ListenerClose/"+site, func(t *testing.T) {
			e := newEngine(t, base)
			got := make(chan error, 1)
			q := runOnQueue(t, e, site, func(l *Listener, _ *Conn) { got <- l.Close() }, nil)
			if err := waitHang(t, got, "Listener.Close from "+site, func() string { return engineDump(e) }); err != nil {
				t.Fatalf("Listener.Close from %s = %v", site, err)
			}
			waitHang(t, q.l.Done(), "the listener's background close", func() string { return engineDump(e) })
			// The accepted connection stays open and working.
			if _, err := q.c.Write([]byte("still here")); err != nil {
				t.Fatalf("Write on the accepted connection after Listener.Close: %v", err)
			}
			buf := make([]byte, 16)
			if n, err := q.s.Read(buf); string(buf[:n]) != "still here" {
				t.Fatalf("peer read %q, %v", buf[:n], err)
			}
		})
		t.Run("BufferWait/"+site, func(t *testing.T) {
			cfg := base
			cfg.SendBufs, cfg.SendBufSize, cfg.SendPoolMax = 4, 4096, 4*4096 // cannot grow
			e := newEngine(t, cfg)
			type result struct {
				err  error
				held int
			}
			got := make(chan result, 1)
			runOnQueue(t, e, site, func(_ *Listener, c *Conn) {
				var held []memreg.Buf
				defer func() {
					for _, b := range held {
						b.Release()
					}
				}()
				for {
					b, err := c.Buffer()
					if err != nil {
						if !errors.Is(err, memreg.ErrExhausted) {
							got <- result{err, len(held)}
							return
						}
						break
					}
					held = append(held, b)
				}
				_, err := c.BufferWait(0) // would wait forever for a buffer this goroutine holds
				got <- result{err, len(held)}
			}, nil)
			r := waitHang(t, got, "BufferWait from "+site, func() string { return engineDump(e) })
			if r.held != 4 || !errors.Is(r.err, ErrWouldBlock) {
				t.Fatalf("BufferWait from %s with the pool exhausted (%d buffers held) = %v, want ErrWouldBlock", site, r.held, r.err)
			}
			waitSendBuffersBack(t, e)
		})
		t.Run("Write/"+site, func(t *testing.T) {
			cfg := base
			cfg.MaxQueuedBytes = 256 << 10
			e := newEngine(t, cfg)
			type result struct {
				n   int
				err error
			}
			got := make(chan result, 1)
			p := make([]byte, 1<<20)
			runOnQueue(t, e, site, func(_ *Listener, c *Conn) {
				n, err := c.Write(p) // the loop cannot send while we are in it: the bound is hit
				got <- result{n, err}
			}, nil)
			r := waitHang(t, got, "Write from "+site, func() string { return engineDump(e) })
			if !errors.Is(r.err, ErrWouldBlock) || r.n < cfg.MaxQueuedBytes || r.n >= len(p) {
				t.Fatalf("Write of %d bytes over MaxQueuedBytes %d from %s = %d, %v; want ErrWouldBlock after at least the bound",
					len(p), cfg.MaxQueuedBytes, site, r.n, r.err)
			}
		})
		t.Run("ConnClose/"+site, func(t *testing.T) {
			e := newEngine(t, base)
			closed := make(chan error, 2)
			got := make(chan error, 1)
			q := runOnQueue(t, e, site, func(_ *Listener, c *Conn) { got <- c.Close() },
				func(c *Conn, err error) { closed <- err })
			if err := waitHang(t, got, "Conn.Close from "+site, func() string { return engineDump(e) }); err != nil {
				t.Fatalf("Conn.Close from %s = %v", site, err)
			}
			waitHang(t, q.c.Done(), "the connection's close", func() string { return engineDump(e) })
			if err := waitHang(t, closed, "OnClose", func() string { return engineDump(e) }); err != nil {
				t.Fatalf("OnClose after a local Close: %v", err)
			}
			buf := make([]byte, 1)
			if n, err := q.s.Read(buf); n != 0 || err != io.EOF {
				t.Fatalf("peer after Close from %s: %d, %v; want EOF", site, n, err)
			}
		})
	}
}

// closeEngineBounded closes e from the test goroutine and fails if that hangs.
func closeEngineBounded(t *testing.T, e *Engine) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- e.Close() }()
	if err := waitHang(t, done, "Engine.Close", func() string { return "" }); err != nil {
		t.Fatalf("Engine.Close = %v", err)
	}
}

// TestCrossQueueBufferFromHandler: a handler on one queue takes send buffers of a connection
// on another queue while that queue's handler does the same the other way round, and both
// pools must grow: neither queue may wait for the other (that would be two loops waiting on
// each other for good). Buffer from a queue goroutine must never block on another queue.
func TestCrossQueueBufferFromHandler(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testCrossQueueBuffer(t, Config{Backend: b}) })
}

func testCrossQueueBuffer(t *testing.T, cfg Config) {
	cfg.Queues, cfg.NoPin = 2, true
	cfg.SendBufs, cfg.SendBufSize = 2, 4096 // small pools: taking buffers makes them grow
	// Not newEngine: if the queues deadlock, Close would hang the test binary; the leak
	// check reports the abandoned engine instead.
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := e.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return HandlerFuncs{} })
	if err != nil {
		e.Close()
		t.Fatal(err)
	}
	// One dialed connection on each queue.
	var on [2]*Conn
	for i := 0; i < 16 && (on[0] == nil || on[1] == nil); i++ {
		c, err := e.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
		if err != nil {
			e.Close()
			t.Fatal(err)
		}
		if on[c.q.idx] == nil {
			on[c.q.idx] = c
		}
	}
	if on[0] == nil || on[1] == nil {
		e.Close()
		t.Fatal("no connection on one of the queues")
	}
	var ready atomic.Int32
	type result struct {
		held []memreg.Buf
		err  error
	}
	got := make(chan result, 2)
	for i := 0; i < 2; i++ {
		mine, other := on[i], on[1-i]
		mine.Post(func() {
			// Start together: both loops are inside a handler now.
			ready.Add(1)
			for start := time.Now(); ready.Load() < 2 && time.Since(start) < time.Second; {
			}
			var r result
			for k := 0; k < 64; k++ {
				b, err := other.Buffer()
				if err != nil {
					r.err = err
					break
				}
				r.held = append(r.held, b)
			}
			got <- r
		})
	}
	for i := 0; i < 2; i++ {
		select {
		case r := <-got:
			for _, b := range r.held {
				b.Release()
			}
			if r.err != nil && !errors.Is(r.err, memreg.ErrExhausted) && !errors.Is(r.err, ErrWouldBlock) {
				t.Errorf("Buffer of another queue's connection from a handler: %v", r.err)
			}
		case <-time.After(hangBound):
			dumpStacks(t)
			t.Fatal("two queues wait on each other: Buffer of another queue's connection, called from a handler, waits for that queue (pool growth by Queue.Do)")
		}
	}
	l.Close()
	e.Close()
}
