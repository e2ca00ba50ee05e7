package zc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc"
)

// The rule these tests check: a call that refuses a connection a send buffer on a queue
// goroutine (Buffer's ErrExhausted, Write's and BufferWait's ErrWouldBlock) owes it an
// OnWritable when a buffer is free for it, whoever returns the buffer.

// smallBufs makes the kernel's socket buffers small, so the send pool (not the kernel)
// holds what the peers have not read.
func smallBufs(s *tcpglue.Socket) error {
	if _, err := s.SetSendBuffer(32 << 10); err != nil {
		return err
	}
	_, err := s.SetRecvBuffer(32 << 10)
	return err
}

// dialSmall dials addr from Go's net with a small receive buffer.
func dialSmall(t testing.TB, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// wakeEngine is a one-queue engine made with cfg (no fallback, the backend b) and a Go
// listener for its dials, both closed at the end of the test.
func wakeEngine(t *testing.T, b zc.Backend, cfg zc.Config) (*zc.Engine, net.Listener) {
	t.Helper()
	cfg.Backend, cfg.NoFallback, cfg.Queues = b, true, 1
	e, err := zc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return e, ln
}

// dialAccepted dials ln from e with h and accepts the peer's side (closed at the end of the
// test).
func dialAccepted(t *testing.T, e *zc.Engine, ln net.Listener, h zc.Handler) (*zc.Conn, net.Conn) {
	t.Helper()
	c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), h)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	return c, peer
}

// readPattern reads the streamer's byte pattern to EOF and says what was wrong.
func readPattern(c net.Conn, want int, slow bool) error {
	defer c.Close()
	buf := make([]byte, 16<<10)
	var n int
	var next byte
	for {
		k, err := c.Read(buf)
		for _, v := range buf[:k] {
			if v != next {
				return fmt.Errorf("byte %d is %d, want %d", n, v, next)
			}
			next++
			n++
		}
		if slow {
			time.Sleep(time.Millisecond)
		}
		if err == io.EOF {
			if n != want {
				return fmt.Errorf("%d bytes, want %d", n, want)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("after %d bytes: %w", n, err)
		}
	}
}

// TestWritableManyStreams runs ExampleWritable's streamer (the godoc's code) to 8× more
// parallel readers than one queue's send pool serves at once: every stream must complete.
func TestWritableManyStreams(t *testing.T) {
	zc.EachBackend(t, func(t *testing.T, b zc.Backend) {
		const streams, size = 64, 1 << 20
		e, err := zc.New(zc.Config{Backend: b, NoFallback: true, Queues: 1, SendBufs: 8,
			SendPoolMax: 2 << 20, MaxQueuedBytes: 256 << 10, SocketOptions: smallBufs})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		l, err := e.Listen("tcp", "127.0.0.1:0", func(c *zc.Conn) zc.Handler {
			s := &streamer{left: size, max: e.Config().MaxQueuedBytes}
			c.Post(func() { s.pump(c) })
			return s
		})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		start := make(chan struct{})
		errs := make(chan error, streams)
		for i := 0; i < streams; i++ {
			c := dialSmall(t, l.Addr().String())
			go func() {
				<-start
				errs <- readPattern(c, size, i%8 == 0)
			}()
		}
		// Hold every reader back until a connection was refused a buffer: the case
		// that used to leave it without an event.
		testutil.Eventually(t, "a connection refused a send buffer", func() bool { return e.Stats().Send.PoolWaits > 0 })
		close(start)
		for i := 0; i < streams; i++ {
			select {
			case err := <-errs:
				if err != nil {
					t.Errorf("stream: %v", err)
				}
			case <-time.After(2 * time.Minute):
				t.Fatalf("%d of %d streams unfinished (stalled): %+v", streams-i, streams, e.Stats())
			}
		}
		t.Logf("pool waits %d", e.Stats().Send.PoolWaits)
	})
}

// TestPoolWakeMinimal: A's peer stops reading so A holds the whole pool; B, with nothing of
// its own in flight, is refused (Write: ErrWouldBlock); when A's peer reads again, B must
// hear OnWritable and finish.
func TestPoolWakeMinimal(t *testing.T) {
	zc.EachBackend(t, func(t *testing.T, b zc.Backend) {
		e, ln := wakeEngine(t, b, zc.Config{SendBufs: 8, SendPoolMax: 512 << 10, MaxQueuedBytes: 4 << 20,
			SocketOptions: smallBufs})

		// A: takes buffers until the pool is dry (ignoring MaxQueuedBytes on purpose).
		aDry := make(chan struct{})
		var aOnce sync.Once
		aLeft := 4 << 20
		aPump := func(c *zc.Conn) {
			for aLeft > 0 {
				buf, err := c.Buffer()
				if errors.Is(err, memreg.ErrExhausted) {
					aOnce.Do(func() { close(aDry) })
					return
				}
				if err != nil {
					t.Errorf("A: %v", err)
					return
				}
				n := min(aLeft, len(buf.Bytes()))
				if err := c.Send(buf, n); err != nil {
					t.Errorf("A: %v", err)
					return
				}
				aLeft -= n
			}
			c.Close()
		}
		a, aPeer := dialAccepted(t, e, ln, zc.HandlerFuncs{Writable: aPump})
		a.Post(func() { aPump(a) })
		<-aDry

		// B: writes 1 MiB on its queue goroutine; refused at once, it goes on in OnWritable.
		const bSize = 1 << 20
		payload := make([]byte, bSize)
		for i := range payload {
			payload[i] = byte(i * 7)
		}
		type first struct {
			n   int
			err error
		}
		bFirst := make(chan first, 1)
		rest := payload
		var bMu sync.Mutex
		bWrite := func(c *zc.Conn) {
			bMu.Lock()
			defer bMu.Unlock()
			for len(rest) > 0 {
				n, err := c.Write(rest)
				rest = rest[n:]
				if errors.Is(err, zc.ErrWouldBlock) {
					return
				}
				if err != nil {
					t.Errorf("B: %v", err)
					return
				}
			}
			c.CloseWrite()
		}
		bc, bPeer := dialAccepted(t, e, ln, zc.HandlerFuncs{Writable: bWrite})
		bc.Post(func() {
			bMu.Lock()
			n, err := bc.Write(rest)
			rest = rest[n:]
			bMu.Unlock()
			bFirst <- first{n, err}
		})
		f := <-bFirst
		if f.n != 0 || !errors.Is(f.err, zc.ErrWouldBlock) {
			t.Fatalf("B's first Write with the pool dry = %d, %v; want 0, ErrWouldBlock", f.n, f.err)
		}
		if q := bc.Queued(); q != 0 {
			t.Fatalf("B queued %d", q)
		}
		bGot := make(chan []byte, 1)
		go func() {
			data, _ := io.ReadAll(bPeer)
			bGot <- data
		}()
		go io.Copy(io.Discard, aPeer) // A's peer reads again: A drains, buffers return
		select {
		case data := <-bGot:
			if len(data) != bSize {
				t.Fatalf("B's peer got %d bytes, want %d", len(data), bSize)
			}
			for i := range data {
				if data[i] != payload[i] {
					t.Fatalf("B's byte %d differs", i)
				}
			}
		case <-time.After(time.Minute):
			t.Fatalf("B never heard OnWritable (lost wake-up): %+v", e.Stats())
		}
		aPeer.Close()
		bPeer.Close()
	})
}

// subscriber is one connection of a fan-out: messages wait in its backlog until Write takes
// them; ErrWouldBlock leaves the rest for OnWritable.
type subscriber struct {
	zc.HandlerFuncs
	backlog [][]byte
	off     int
	closing bool
}

func (s *subscriber) OnWritable(c *zc.Conn) { s.flush(c) }

func (s *subscriber) flush(c *zc.Conn) {
	for len(s.backlog) > 0 {
		m := s.backlog[0][s.off:]
		n, err := c.Write(m)
		if n == len(m) {
			s.backlog[0] = nil
			s.backlog = s.backlog[1:]
			s.off = 0
		} else {
			s.off += n
		}
		if errors.Is(err, zc.ErrWouldBlock) {
			return // OnWritable comes
		}
		if err != nil {
			c.Close()
			return
		}
	}
	if s.closing {
		c.Close()
	}
}

// TestFanOutWakes: one publisher on the queue goroutine writes every message to 100
// subscribers, some of them slow readers, some half-closed (their FIN comes first), through a send pool that holds a fraction of what
// is in flight: every subscriber must get every message (Write on the loop, ErrWouldBlock,
// OnWritable).
func TestFanOutWakes(t *testing.T) {
	zc.EachBackend(t, func(t *testing.T, b zc.Backend) {
		const subs, msgs, size = 100, 200, 1024
		e, err := zc.New(zc.Config{Backend: b, NoFallback: true, Queues: 1, SendBufs: 4, SendBufSize: 16 << 10,
			SendPoolMax: 256 << 10, MaxQueuedBytes: 64 << 10, SocketOptions: smallBufs})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		type sub struct {
			c *zc.Conn
			s *subscriber
		}
		accepted := make(chan sub, subs)
		l, err := e.Listen("tcp", "127.0.0.1:0", func(c *zc.Conn) zc.Handler {
			s := &subscriber{}
			accepted <- sub{c, s}
			return s
		})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		errs := make(chan error, subs)
		for i := 0; i < subs; i++ {
			c := dialSmall(t, l.Addr().String())
			if i%7 == 0 {
				c.(*net.TCPConn).CloseWrite() // a half-closing subscriber still reads
			}
			go func() {
				defer c.Close()
				buf := make([]byte, size)
				for m := 0; m < msgs; m++ {
					if _, err := io.ReadFull(c, buf); err != nil {
						errs <- fmt.Errorf("message %d: %w", m, err)
						return
					}
					for j, v := range buf {
						if v != byte(m+j) {
							errs <- fmt.Errorf("message %d byte %d corrupt", m, j)
							return
						}
					}
					if i%10 == 0 {
						time.Sleep(time.Millisecond) // a slow subscriber
					}
				}
				_, err := c.Read(buf)
				if err != io.EOF {
					err = fmt.Errorf("after the last message: %v", err)
				} else {
					err = nil
				}
				errs <- err
			}()
		}
		all := make([]sub, 0, subs)
		for i := 0; i < subs; i++ {
			all = append(all, <-accepted)
		}
		// The publisher: every message to every subscriber, from the queue goroutine.
		pub := all[0].c
		for m := 0; m < msgs; m++ {
			msg := make([]byte, size)
			for j := range msg {
				msg[j] = byte(m + j)
			}
			last := m == msgs-1
			err := pub.Post(func() {
				for _, x := range all {
					x.s.backlog = append(x.s.backlog, msg)
					x.s.closing = last
					x.s.flush(x.c)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < subs; i++ {
			select {
			case err := <-errs:
				if err != nil {
					t.Errorf("subscriber: %v", err)
				}
			case <-time.After(2 * time.Minute):
				t.Fatalf("%d of %d subscribers unfinished (stalled): %+v", subs-i, subs, e.Stats())
			}
		}
		t.Logf("pool waits %d", e.Stats().Send.PoolWaits)
	})
}

// TestHandlerWriteWithPoolEmpty: a handler's Write on a connection with nothing queued goes
// out through write(2) when the send pool has no buffer to stage it in (a file server's
// header in OnData under a burst of requests: the services probe's server lost 10–91 of
// 128 headers to ErrWouldBlock with a capped pool). What the socket does not take is
// refused with ErrWouldBlock and the count written, and OnWritable follows.
func TestHandlerWriteWithPoolEmpty(t *testing.T) {
	zc.EachBackend(t, func(t *testing.T, b zc.Backend) {
		e, ln := wakeEngine(t, b, zc.Config{SendBufs: 2, SendBufSize: 64 << 10, SendPoolMax: 128 << 10,
			SendPath: zc.SendCopy, SocketOptions: smallBufs})
		a, _ := dialAccepted(t, e, ln, zc.HandlerFuncs{}) // A holds every buffer of the pool
		var held []memreg.Buf
		for {
			buf, err := a.Buffer()
			if err != nil {
				break
			}
			held = append(held, buf)
		}
		type res struct {
			n   int
			err error
		}
		results := make(chan res, 2)
		writable := make(chan struct{}, 16)
		big := make([]byte, 4<<20)
		c, peer := dialAccepted(t, e, ln, zc.HandlerFuncs{Writable: func(*zc.Conn) { writable <- struct{}{} }})
		c.Post(func() {
			n, err := c.Write([]byte("200 OK\n")) // the header: the socket takes it
			results <- res{n, err}
			n, err = c.Write(big) // more than the socket takes: the rest is refused
			results <- res{n, err}
		})
		if r := <-results; r.n != 7 || r.err != nil {
			t.Fatalf("a handler's small Write with the pool empty = %d, %v; want 7, nil", r.n, r.err)
		}
		r := <-results
		if !errors.Is(r.err, zc.ErrWouldBlock) || r.n <= 0 || r.n >= len(big) {
			t.Fatalf("a handler's large Write with the pool empty = %d, %v; want part of it and ErrWouldBlock", r.n, r.err)
		}
		got := make([]byte, 7+r.n)
		if _, err := io.ReadFull(peer, got); err != nil || string(got[:7]) != "200 OK\n" {
			t.Fatalf("the peer read %q, %v", got[:min(7, len(got))], err)
		}
		for _, buf := range held {
			buf.Release()
		}
		select {
		case <-writable:
		case <-time.After(10 * time.Second):
			t.Fatal("no OnWritable after the refused Write, with the pool's buffers back")
		}
		if d := e.Stats().Send.DirectWrites; d == 0 {
			t.Errorf("Stats.Send.DirectWrites = 0")
		}
	})
}

// TestGrantRefusedAgainServed: the window between a connection's refusal inside its own
// OnWritable and its return to the line of waiters. A connection holds the whole pool
// (nothing in flight), is refused, and is granted the buffer the test gives back; in that
// OnWritable it takes the grant, is refused again, and gives one of its buffers back before
// it returns. That buffer came back while nobody stood in line (the connection was between
// its grant and its new place), so nothing served it: the connection must still hear a
// second OnWritable — nothing else will ever return a buffer. (wakeGrants serves the line
// again after putting the connection back in it; without that the connection waits forever.)
func TestGrantRefusedAgainServed(t *testing.T) {
	zc.EachBackend(t, func(t *testing.T, b zc.Backend) {
		const bufs, size = 4, 4 << 10
		e, ln := wakeEngine(t, b, zc.Config{SendBufs: bufs, SendBufSize: size, SendPoolMax: bufs * size,
			MaxQueuedBytes: 1 << 20})

		var (
			mu       sync.Mutex
			held     []memreg.Buf
			writable int
		)
		dry := make(chan error, 1)
		second := make(chan error, 1)
		h := zc.HandlerFuncs{Writable: func(c *zc.Conn) {
			mu.Lock()
			defer mu.Unlock()
			writable++
			switch writable {
			case 1:
				g, err := c.Buffer() // the grant
				if err != nil {
					second <- fmt.Errorf("first OnWritable: the grant: %v", err)
					return
				}
				held = append(held, g)
				if _, err := c.Buffer(); !errors.Is(err, memreg.ErrExhausted) {
					second <- fmt.Errorf("first OnWritable: second Buffer = %v, want ErrExhausted", err)
					return
				}
				held[0].Release() // back while the connection is out of line
				held = held[1:]
			case 2:
				g, err := c.Buffer()
				if err == nil {
					held = append(held, g)
				}
				second <- err
			}
		}}
		c, peer := dialAccepted(t, e, ln, h)
		defer peer.Close()
		c.Post(func() {
			mu.Lock()
			defer mu.Unlock()
			for {
				g, err := c.Buffer()
				if err != nil {
					if len(held) != bufs {
						err = fmt.Errorf("refused after %d of %d buffers: %w", len(held), bufs, err)
					} else if errors.Is(err, memreg.ErrExhausted) {
						err = nil
					}
					dry <- err
					return
				}
				held = append(held, g)
			}
		})
		if err := <-dry; err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		last := held[len(held)-1]
		held = held[:len(held)-1]
		mu.Unlock()
		last.Release() // the first grant
		select {
		case err := <-second:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no second OnWritable with a buffer free in the pool (lost wake-up): %+v", e.Stats().Send)
		}
		done := make(chan struct{})
		c.Post(func() {
			mu.Lock()
			for _, g := range held {
				g.Release()
			}
			held = nil
			mu.Unlock()
			close(done)
		})
		<-done
		c.Close()
	})
}

// TestCloseWakesWriterWaitingForBuffer: a Write blocked off the loop waiting for a send
// buffer (the pool is held elsewhere; its own peer does not read) returns when its
// connection is closed — with what it wrote and an error matching ErrClosed, as a Write
// blocked in Go's net does at Close — instead of waiting for the connection's end, which a
// graceful close with bytes queued for a peer that does not read puts off (up to
// CloseStall): the net.Conn face's nettest CloseTimeout hung this way. The same for
// BufferWait.
func TestCloseWakesWriterWaitingForBuffer(t *testing.T) {
	eachBackend(t, func(t *testing.T, b zc.Backend) {
		const bufs, size = 4, 4 << 10
		e, ln := wakeEngine(t, b, zc.Config{SendBufs: bufs, SendBufSize: size, SendPoolMax: bufs * size,
			MaxQueuedBytes: 8 << 20, SocketOptions: smallBufs})

		// A holds the whole pool.
		var held []memreg.Buf
		dry := make(chan struct{})
		a, _ := dialAccepted(t, e, ln, zc.HandlerFuncs{})
		a.Post(func() {
			for {
				g, err := a.Buffer()
				if err != nil {
					break
				}
				held = append(held, g)
			}
			close(dry)
		})
		<-dry
		defer a.Post(func() {
			for _, g := range held {
				g.Release()
			}
		})

		for _, call := range []string{"Write", "BufferWait"} {
			c, _ := dialAccepted(t, e, ln, zc.HandlerFuncs{}) // its peer never reads
			// Bytes queued that the peer will not take (from the application's memory: the
			// pool is dry), so a graceful close of c waits for them and does not end soon.
			if err := c.SendBytes(make([]byte, 4<<20), nil); err != nil {
				t.Fatal(err)
			}
			type result struct {
				n   int
				err error
			}
			res := make(chan result, 1)
			go func() {
				if call == "Write" {
					n, err := c.Write(make([]byte, 4<<20))
					res <- result{n, err}
					return
				}
				_, err := c.BufferWait(0)
				res <- result{0, err}
			}()
			// Let it block (it either waits for a buffer, or — Write — first fills the
			// kernel's buffers directly and then waits).
			time.Sleep(200 * time.Millisecond)
			select {
			case r := <-res:
				t.Fatalf("%s returned before Close: %d, %v (the pool should be dry)", call, r.n, r.err)
			default:
			}
			c.Close()
			select {
			case r := <-res:
				if !errors.Is(r.err, zc.ErrClosed) {
					t.Errorf("%s after Close: %d, %v; want an error matching ErrClosed", call, r.n, r.err)
				}
				t.Logf("%s: %d, %v", call, r.n, r.err)
			case <-time.After(30 * time.Second):
				t.Fatalf("%s waiting for a send buffer was not woken by Close", call)
			}
		}
	})
}
