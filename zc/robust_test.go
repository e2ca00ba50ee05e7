package zc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// TestManyConnsRandomSizes: 256 concurrent connections echo messages of random sizes
// (1 B .. 4 MiB) through an echo server, 1 GiB in total (256 MiB with -short), every
// connection's stream checksummed end to end.
func TestManyConnsRandomSizes(t *testing.T) {
	total := 1 << 30
	if testing.Short() {
		total = 128 << 20
	}
	const conns = 256
	cfg := Config{Queues: 2, NoPin: true}
	srv, cli := newPair(t, cfg)
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	perConn := total / conns
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := echoExchange(cli, l.Addr().String(), perConn, uint64(i)); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%v\nclient: %s\nserver: %s", err, engineDump(cli), engineDump(srv))
	}
	st := srv.Stats()
	if st.Send.NotifsUnexpected != 0 || st.Recv.BundleMismatch != 0 || st.Send.NotifsPending < 0 {
		t.Fatalf("server stats %+v", st)
	}
	t.Logf("server: %+v", st)
}

// echoExchange sends size bytes in random-sized messages (Send and Write alternately) and
// checks the echoed stream's checksum.
func echoExchange(e *Engine, addr string, size int, seed uint64) error {
	k := newCollector(size)
	c, err := e.Dial(context.Background(), "tcp", addr, k.handler())
	if err != nil {
		return err
	}
	defer func() { c.Close(); <-c.Done() }()
	rng := rand.New(rand.NewPCG(seed, 77))
	want := sha256.New()
	scratch := make([]byte, 4<<20)
	for sent := 0; sent < size; {
		n := min(1+rng.IntN(4<<20), size-sent)
		if rng.IntN(4) == 0 {
			n = min(1+rng.IntN(64), size-sent) // plenty of tiny messages
		}
		p := scratch[:n]
		for i := 0; i < n; i += 8 {
			v := rng.Uint64()
			for j := 0; j < 8 && i+j < n; j++ {
				p[i+j] = byte(v >> (8 * j))
			}
		}
		want.Write(p)
		if rng.IntN(2) == 0 {
			if _, err := c.Write(p); err != nil {
				return err
			}
		} else {
			for off := 0; off < n; {
				b, err := c.BufferWait(30 * time.Second)
				if err != nil {
					return err
				}
				k := copy(b.Bytes(), p[off:])
				if err := c.Send(b, k); err != nil {
					return err
				}
				off += k
			}
		}
		sent += n
	}
	select {
	case <-k.done:
	case <-time.After(120 * time.Second):
		return errors.New("echo timed out")
	}
	if k.err != nil {
		return k.err
	}
	if k.n != size || !bytes.Equal(k.sum.h.Sum(nil), want.Sum(nil)) {
		return errors.New("echoed stream differs")
	}
	return nil
}

// plainPeer returns a plain kernel socket connected to a zc server's listener, and the
// server-side zc connection with its events.
type peerEvents struct {
	conn   chan *Conn
	data   chan []byte
	eof    chan error
	closed chan error
}

func listenEvents(t *testing.T, e *Engine) (*Listener, *peerEvents) {
	ev := &peerEvents{conn: make(chan *Conn, 1024), data: make(chan []byte, 1024), eof: make(chan error, 1024), closed: make(chan error, 1024)}
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		ev.conn <- c
		return HandlerFuncs{
			Data:  func(c *Conn, d Data) { ev.data <- append([]byte(nil), d.Bytes()...); d.Release() },
			EOF:   func(c *Conn, err error) { ev.eof <- err },
			Close: func(c *Conn, err error) { ev.closed <- err },
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, ev
}

func dialPlain(t *testing.T, addr string) *tcpglue.Socket {
	s, err := tcpglue.Dial("tcp", addr, tcpglue.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func recvEvent[T any](t *testing.T, ch chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

func TestPeerClosesMidStream(t *testing.T) { testPeerClosesMidStream(t, Config{}) }

// testPeerClosesMidStream: a half-close from the peer is data then io.EOF, we can still answer,
// and a local Close reaches the peer as EOF (every backend runs it).
func testPeerClosesMidStream(t *testing.T, cfg Config) {
	e := newEngine(t, cfg)
	l, ev := listenEvents(t, e)
	s := dialPlain(t, l.Addr().String())
	c := recvEvent(t, ev.conn, "accept")
	s.Write([]byte("partial message"))
	s.Shutdown(unix.SHUT_WR)
	got := recvEvent(t, ev.data, "data")
	if string(got) != "partial message" {
		t.Fatalf("got %q", got)
	}
	if err := recvEvent(t, ev.eof, "EOF"); err != io.EOF {
		t.Fatalf("EOF event = %v", err)
	}
	// The peer only closed its sending side: we can still answer.
	if _, err := c.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, _ := s.Read(buf)
	if string(buf[:n]) != "reply" {
		t.Fatalf("peer read %q", buf[:n])
	}
	c.Close()
	if err := recvEvent(t, ev.closed, "close"); err != nil {
		t.Fatalf("close after local Close = %v", err)
	}
	if n, err := s.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("peer sees %d, %v after close; want EOF", n, err)
	}
}

func TestPeerReset(t *testing.T) { testPeerReset(t, Config{}) }

// testPeerReset: a reset surfaces as ECONNRESET in OnEOF and OnClose, and later writes and
// sends fail without leaking the buffer (every backend runs it).
func testPeerReset(t *testing.T, cfg Config) {
	e := newEngine(t, cfg)
	l, ev := listenEvents(t, e)
	s := dialPlain(t, l.Addr().String())
	c := recvEvent(t, ev.conn, "accept")
	spare, err := c.Buffer()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	s.Close() // RST
	err = recvEvent(t, ev.eof, "EOF")
	if !errors.Is(err, unix.ECONNRESET) {
		t.Fatalf("reset surfaced as %v, want ECONNRESET", err)
	}
	if err := recvEvent(t, ev.closed, "close"); !errors.Is(err, unix.ECONNRESET) {
		t.Fatalf("close error %v", err)
	}
	<-c.Done()
	// Writes after the reset fail with a clear error and leak nothing.
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("write after reset succeeded")
	}
	// No new buffers for a closed connection; one taken before is released by the failed Send.
	if b, err := c.Buffer(); err == nil {
		b.Release()
		t.Fatal("Buffer after reset succeeded")
	}
	if err := c.Send(spare, 1); err == nil {
		t.Fatal("send after reset succeeded")
	}
	if spare.Valid() {
		t.Fatal("failed Send left the buffer with the caller's handle")
	}
}

// TestCloseWithZeroCopyInFlight closes connections while zero-copy sends are in flight and
// checks every buffer comes back and the peer got a clean prefix of the stream.
func TestCloseWithZeroCopyInFlight(t *testing.T) {
	// A connection with zero-copy sends in flight is closed; its buffers come back only after
	// the notifications, and nothing leaks (TestMain checks rings, regions and fds).
	srv, cli := newPair(t, Config{SendPath: SendZeroCopy, SendBufs: 32, SendPoolMax: 32 << 16})
	l2, err := srv.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler { return HandlerFuncs{} })
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	c, err := cli.Dial(context.Background(), "tcp", l2.Addr().String(), HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 32; i++ {
		b, err := c.BufferWait(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Send(b, len(b.Bytes())); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	select {
	case <-c.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("close with zero-copy sends in flight did not finish")
	}
	q := cli.queues[c.q.idx]
	if free := q.send.Free(); free != q.send.Buffers() {
		t.Fatalf("%d of %d send buffers came back", free, q.send.Buffers())
	}
	if st := c.Stats(); st.NotifsPending != 0 || st.SendZCOps == 0 {
		t.Fatalf("conn stats %+v", st)
	}
}

// TestMutateAfterRelease: once Send returned, the caller's handle is stale, so the only way
// to touch the memory again is a new buffer from the region; reusing a released buffer never
// corrupts data already queued.
func TestMutateAfterRelease(t *testing.T) {
	for _, path := range []SendPath{SendZeroCopy, SendCopy} {
		t.Run(path.String(), func(t *testing.T) {
			e := newEngine(t, Config{SendPath: path, SendBufs: 4, SendBufSize: 4096, SendPoolMax: 4 * 4096})
			l, _ := listenEvents(t, e)
			_ = l
			srv, err := New(Config{Queues: 1, SendBufs: 4, RecvBufs: 64, NoPin: true})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			k := newCollector(4096 * 200)
			sl, err := srv.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler { return k.handler() })
			if err != nil {
				t.Fatal(err)
			}
			defer sl.Close()
			c, err := e.Dial(context.Background(), "tcp", sl.Addr().String(), HandlerFuncs{})
			if err != nil {
				t.Fatal(err)
			}
			want := sha256.New()
			for i := 0; i < 200; i++ {
				b, err := c.BufferWait(5 * time.Second)
				if err != nil {
					t.Fatal(err)
				}
				p := b.Bytes()
				for j := range p {
					p[j] = byte(i)
				}
				want.Write(p)
				if err := c.Send(b, len(p)); err != nil {
					t.Fatal(err)
				}
				// The handle is stale now: writes through it are impossible.
				if b.Bytes() != nil || b.Release() == nil {
					t.Fatal("handle still usable after Send")
				}
				if err := c.Send(b, 10); !errors.Is(err, memreg.ErrStale) {
					t.Fatalf("second Send of the same handle = %v, want ErrStale", err)
				}
				// Immediately scribble over whatever buffer the region hands out next.
				if nb, err := c.Buffer(); err == nil {
					for j := range nb.Bytes() {
						nb.Bytes()[j] = 0xEE
					}
					nb.Release()
				}
			}
			select {
			case <-k.done:
			case <-time.After(10 * time.Second):
				t.Fatal("timeout")
			}
			if !bytes.Equal(k.sum.h.Sum(nil), want.Sum(nil)) {
				t.Fatal("data corrupted by buffer reuse")
			}
			c.Close()
			<-c.Done()
		})
	}
}

// TestAdaptiveSwitchesToCopy: on loopback the kernel copies zero-copy sends; an adaptive
// connection notices and moves to copying sends, and the counters say so.
func TestAdaptiveSwitchesToCopy(t *testing.T) {
	srv, cli := newPair(t, Config{ZCReprobe: 64})
	k := newCollector(64 << 20)
	l, err := srv.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler { return k.handler() })
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	for sent := 0; sent < 64<<20; {
		b, err := c.BufferWait(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		n := len(b.Bytes())
		c.Send(b, n)
		sent += n
	}
	<-k.done
	st := c.Stats()
	t.Logf("conn stats: %+v", st)
	if st.SendZCOps == 0 || st.BytesZCCopied == 0 {
		t.Fatal("adaptive connection never tried zero-copy")
	}
	if st.ZCSwitches == 0 || st.ZeroCopyOn {
		t.Fatal("adaptive connection did not switch to copying sends")
	}
	if st.BytesSentCopy < 32<<20 {
		t.Fatalf("only %d bytes went by copy: still paying for zero-copy", st.BytesSentCopy)
	}
	if st.ZCProbes == 0 {
		t.Fatal("no re-probe of zero-copy happened")
	}
	if st.BytesSentZC != 0 {
		t.Fatalf("%d bytes reported as truly zero-copy on loopback", st.BytesSentZC)
	}
	es := cli.Stats()
	if es.Send.ZCSwitches == 0 || es.Send.BytesZCCopied == 0 || es.Send.ZCProbes == 0 {
		t.Fatalf("engine stats do not show the switch: %+v", es)
	}
	c.Close()
	<-c.Done()
}

func TestBadInput(t *testing.T) {
	for _, cfg := range []Config{
		{Queues: 5000}, {SendPath: 9}, {Backend: 7}, {RecvBufs: -1}, {Steering: 5},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", cfg, err)
		}
	}
	e := newEngine(t, Config{})
	if _, err := e.Dial(context.Background(), "tcp", "127.0.0.1:1", nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Dial with nil handler = %v", err)
	}
	if _, err := e.Dial(context.Background(), "tcp", "not an address", HandlerFuncs{}); err == nil {
		t.Error("Dial of a bad address succeeded")
	}
	// Nothing listens on this port (we just closed it): connection refused, typed.
	ls := dialablePort(t)
	_, err := e.Dial(context.Background(), "tcp", ls, HandlerFuncs{})
	var oe *OpError
	if !errors.As(err, &oe) || !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("Dial to a closed port = %v, want *OpError with ECONNREFUSED", err)
	}
	if _, err := e.Listen("tcp", "127.0.0.1:0", nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Listen with nil accept = %v", err)
	}
	if _, err := e.Listen("tcp", "256.0.0.1:0", func(*Conn) Handler { return nil }); err == nil {
		t.Error("Listen on a bad address succeeded")
	}
	// A listener that refuses connections (nil handler) closes them without leaking.
	l, err := e.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return nil })
	if err != nil {
		t.Fatal(err)
	}
	s := dialPlain(t, l.Addr().String())
	buf := make([]byte, 1)
	if n, err := s.Read(buf); n != 0 || (err != io.EOF && !errors.Is(err, unix.ECONNRESET)) {
		t.Fatalf("refused connection read %d, %v", n, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second listener Close = %v", err)
	}
	// Send misuse.
	srv, cli := newPair(t, Config{})
	sl, _ := srv.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return HandlerFuncs{} })
	defer sl.Close()
	c, err := cli.Dial(context.Background(), "tcp", sl.Addr().String(), HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := c.Buffer()
	if err := c.Send(b, len(b.Bytes())+1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized Send = %v", err)
	}
	if err := c.Send(memreg.Buf{}, 1); !errors.Is(err, memreg.ErrStale) {
		t.Fatalf("Send of zero Buf = %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close = %v", err)
	}
	<-c.Done()
	// Dial with an expired context.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := cli.Dial(ctx, "tcp", sl.Addr().String(), HandlerFuncs{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial with cancelled context = %v", err)
	}
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cli.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second engine Close = %v", err)
	}
	if _, err := cli.Dial(context.Background(), "tcp", sl.Addr().String(), HandlerFuncs{}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Dial after engine Close = %v", err)
	}
}

// dialablePort returns an address nothing listens on.
func dialablePort(t *testing.T) string {
	s, err := tcpglue.Listen("tcp", "127.0.0.1:0", tcpglue.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ap, _ := s.LocalAddr()
	s.Close()
	return ap.String()
}

func TestSameEngineDialClose(t *testing.T) {
	e := newEngine(t, Config{})
	l, ev := listenEvents(t, e)
	c, err := e.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	recvEvent(t, ev.conn, "accept")
	c.Close()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("close hung: %+v", e.Stats())
	}
}

func TestIPv6Echo(t *testing.T) {
	testutil.RequireIPv6Loopback(t)
	srv, cli := newPair(t, Config{})
	l, err := srv.Listen("tcp6", "[::1]:0", echoAccept)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := echoExchange(cli, l.Addr().String(), 4<<20, 9); err != nil {
		t.Fatal(err)
	}
}

func TestForeignBuffers(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testForeignBuffers(t, Config{Backend: b, Queues: 2, NoPin: true}) })
}

// testForeignBuffers sends buffers of one queue's pool on a connection of another queue
// (allowed: copied or sent from the address), and refuses buffers of another engine.
func testForeignBuffers(t *testing.T, cfg Config) {
	srv, cli := newPair(t, cfg)
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const rounds = 16
	k := newCollector(rounds * (48 << 10))
	// Two connections: round-robin puts them on different queues.
	other, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), k.handler())
	if err != nil {
		t.Fatal(err)
	}
	if c.q.idx == other.q.idx {
		t.Fatalf("both connections on queue %d", c.q.idx)
	}
	want := sha256.New()
	for i := 0; i < rounds; i++ {
		b, err := other.BufferWait(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		p := b.Bytes()[:48<<10]
		for j := range p {
			p[j] = byte(i*7 + j/4096)
		}
		want.Write(p)
		if err := c.Send(b, len(p)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-k.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("timeout: got %d\n%s", k.n, engineDump(cli))
	}
	if !bytes.Equal(k.sum.h.Sum(nil), want.Sum(nil)) {
		t.Fatal("echoed stream differs")
	}
	// Another engine's buffer: refused, and released back to its own pool.
	b, err := srv.queues[0].getSendBuf()
	if err != nil {
		t.Fatal(err)
	}
	before := srv.queues[0].send.Free()
	if err := c.Send(b, 10); !errors.Is(err, ErrForeignBuffer) {
		t.Fatalf("Send of another engine's buffer: %v, want ErrForeignBuffer", err)
	}
	if srv.queues[0].send.Free() != before+1 {
		t.Fatal("the refused buffer was not released")
	}
	c.Close()
	<-c.Done()
	waitSendBuffersBack(t, cli)
}

// TestRecvPoolExhaustedResumes: the handler keeps what it receives until the connection stops
// at its credit (half the tiny pool), the queue goes to sleep, and buffers released later from
// another goroutine wake it: receiving resumes and every byte arrives.
func TestRecvPoolExhaustedResumes(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		srv := newEngine(t, Config{Backend: b, Queues: 1, RecvBufSize: 4096, RecvBufs: 4, RecvPoolMax: 4 * 4096, MaxRecvHeld: 1 << 20})
		cli := newEngine(t, Config{Backend: b, Queues: 1})
		var mu sync.Mutex
		var held []Data
		got := 0
		full := make(chan struct{}, 1)
		sum := sha256.New()
		done := make(chan struct{})
		const total = 1 << 20
		l, err := srv.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler {
			return HandlerFuncs{Data: func(c *Conn, d Data) {
				mu.Lock()
				sum.Write(d.Bytes())
				got += d.Len()
				held = append(held, d)
				n, g := len(held), got
				mu.Unlock()
				if n >= 2 { // the credit stops it at half the pool (2 of 4 buffers)
					select {
					case full <- struct{}{}:
					default:
					}
				}
				if g == total {
					close(done)
				}
			}}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
		if err != nil {
			t.Fatal(err)
		}
		want := payload(total)
		if _, err := c.Write(want); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case <-done:
				mu.Lock()
				for _, d := range held {
					d.Release()
				}
				ok := bytes.Equal(sum.Sum(nil), sha256Sum(want))
				mu.Unlock()
				if !ok {
					t.Fatal("received bytes differ")
				}
				c.Close()
				return
			case <-full:
				time.Sleep(20 * time.Millisecond) // the queue has nothing to do: it sleeps
				mu.Lock()
				for _, d := range held {
					d.Release()
				}
				held = held[:0]
				mu.Unlock()
			case <-time.After(20 * time.Second):
				t.Fatalf("stalled at %d of %d bytes\n%s", got, total, engineDump(srv))
			}
		}
	})
}

func sha256Sum(p []byte) []byte {
	s := sha256.Sum256(p)
	return s[:]
}

// TestLoopWritesBatch: many small Writes made on the connection's queue goroutine (a
// loop-driven sender) leave in a few kernel sends, not one each.
func TestLoopWritesBatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		srv, cli := newPair(t, Config{Backend: b, Queues: 1})
		const n, size = 2000, 64
		k := newCollector(n * size)
		l, err := srv.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return k.handler() })
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
		if err != nil {
			t.Fatal(err)
		}
		msg := payload(size)
		want := sha256.New()
		for i := 0; i < n; i++ {
			want.Write(msg)
		}
		before := cli.Stats()
		c.Post(func() {
			for i := 0; i < n; i++ {
				if _, err := c.Write(msg); err != nil {
					t.Error(err)
					return
				}
			}
		})
		select {
		case <-k.done:
		case <-time.After(20 * time.Second):
			t.Fatalf("timeout: got %d\n%s", k.n, engineDump(cli))
		}
		if !bytes.Equal(k.sum.h.Sum(nil), want.Sum(nil)) {
			t.Fatal("stream differs")
		}
		after := cli.Stats()
		ops := (after.Send.Ops - before.Send.Ops) + (after.Send.DirectWrites - before.Send.DirectWrites)
		if ops > n/20 {
			t.Fatalf("%d Writes of %d bytes took %d kernel sends: not batched", n, size, ops)
		}
		t.Logf("%d writes in %d sends", n, ops)
		c.Close()
	})
}
