package zc

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ReadSelf (readself.go) through the event-loop API, as an application that reads its
// sockets itself uses it: a request/response server whose goroutines call Conn.Read and
// Conn.Write, no OnData ever, every byte checked, the counters saying which path carried it.

func TestReadSelfEcho(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		e := newEngine(t, smallCfg(b))
		var onData atomic.Int64
		h := HandlerFuncs{Data: func(c *Conn, d Data) { onData.Add(1); d.Release() }}
		ln, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
			go func() { // echo with Read and Write, as over a *net.TCPConn
				buf := make([]byte, 32<<10)
				for {
					k, err := c.Read(buf)
					if k > 0 {
						if _, werr := c.Write(buf[:k]); werr != nil {
							return
						}
					}
					if err == io.EOF {
						c.CloseWrite()
						return
					}
					if err != nil {
						return
					}
				}
			}()
			return h
		}, ListenOptions{ReadSelf: true})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), h, DialOptions{ReadSelf: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		const total = 4 << 20
		src := make([]byte, total)
		for i := range src {
			src[i] = byte(i*7 + i>>12)
		}
		go func() {
			for off := 0; off < total; off += 100_000 {
				if _, err := c.Write(src[off:min(off+100_000, total)]); err != nil {
					return
				}
			}
			c.CloseWrite()
		}()
		got := make([]byte, 0, total)
		buf := make([]byte, 64<<10)
		for {
			k, err := c.Read(buf)
			got = append(got, buf[:k]...)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("Read after %d bytes: %v", len(got), err)
			}
		}
		if !bytes.Equal(got, src) {
			t.Fatalf("echo: got %d bytes (crc %08x), want %d (crc %08x)", len(got), crc32.ChecksumIEEE(got), total, crc32.ChecksumIEEE(src))
		}
		if n := onData.Load(); n != 0 {
			t.Fatalf("OnData ran %d times on ReadSelf connections", n)
		}
		if r := c.Stats().BytesRecv; r != total {
			t.Fatalf("ConnStats.BytesRecv = %d, want %d", r, total)
		}
		if d := e.Stats().Recv.BytesDirect; d != 2*total {
			t.Fatalf("Stats.Recv.BytesDirect = %d, want %d (both sides read themselves)", d, 2*total)
		}
		if r := e.Stats().Recv.BytesRing + e.Stats().Recv.BytesPlain; r != 0 {
			t.Fatalf("the queue received %d bytes beside the connections' own reads", r)
		}
	})
}

// TestReadSelfMisuse: the new calls on the wrong connection, goroutine or moment get typed
// errors, and every wait ends (deadline, Close, Engine.Close).
func TestReadSelfMisuse(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		// The peers are another engine's: Engine.Close of e closes only our side.
		e, srv := newEngine(t, smallCfg(b)), newEngine(t, smallCfg(b))
		accepted := make(chan *Conn, 4)
		ln, err := srv.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
			// The peer never replies and never reads: a large Write below fills the
			// socket and waits (a peer that read would take 64 MiB in ~50 ms here,
			// before the deadline is set).
			c.SetReceivePaused(true)
			accepted <- c
			return HandlerFuncs{}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var peer *Conn // the last dial's
		dial := func(self bool) *Conn {
			c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), HandlerFuncs{}, DialOptions{ReadSelf: self})
			if err != nil {
				t.Fatal(err)
			}
			peer = <-accepted
			return c
		}

		// Read and SetReadDeadline on a connection zc receives for.
		ev := dial(false)
		if _, err := ev.Read(make([]byte, 8)); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Read on an event-loop connection = %v, want ErrInvalid", err)
		}
		if err := ev.SetReadDeadline(time.Now()); !errors.Is(err, ErrInvalid) {
			t.Fatalf("SetReadDeadline on an event-loop connection = %v, want ErrInvalid", err)
		}
		ev.Close()

		c := dial(true)
		// OnQueue and Read on a queue goroutine: nothing there, no waiting.
		if c.OnQueue() {
			t.Fatal("OnQueue is true on the test's goroutine")
		}
		type res struct {
			onQ bool
			err error
		}
		rch := make(chan res, 1)
		if err := c.Post(func() {
			_, err := c.Read(make([]byte, 8))
			rch <- res{c.OnQueue(), err}
		}); err != nil {
			t.Fatal(err)
		}
		r := waitHang(t, rch, "Read on a queue goroutine", nil)
		if !r.onQ || !errors.Is(r.err, ErrWouldBlock) {
			t.Fatalf("on a queue goroutine: OnQueue %v, Read = %v; want true, ErrWouldBlock", r.onQ, r.err)
		}
		// ReadFrom there fails (it waits), as does a nil reader anywhere.
		if err := c.Post(func() {
			_, err := c.ReadFrom(bytes.NewReader([]byte("x")))
			rch <- res{true, err}
		}); err != nil {
			t.Fatal(err)
		}
		if r := waitHang(t, rch, "ReadFrom on a queue goroutine", nil); !errors.Is(r.err, ErrInvalid) {
			t.Fatalf("ReadFrom on a queue goroutine = %v, want ErrInvalid", r.err)
		}
		if _, err := c.ReadFrom(nil); !errors.Is(err, ErrInvalid) {
			t.Fatalf("ReadFrom(nil) = %v, want ErrInvalid", err)
		}

		// A read deadline ends a waiting Read; a later one set meanwhile applies.
		c.SetReadDeadline(time.Now().Add(time.Hour))
		errc := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 8))
			errc <- err
		}()
		time.Sleep(20 * time.Millisecond)
		c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		err = waitHang(t, errc, "Read past a shortened deadline", nil)
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("Read past its deadline = %v, want os.ErrDeadlineExceeded (Timeout)", err)
		}
		c.SetReadDeadline(time.Time{})

		// A write deadline: a Write that fills the socket (the peer never reads) ends
		// when a deadline set meanwhile passes, having queued what it reports.
		big := make([]byte, 64<<20)
		wres := make(chan error, 1)
		var wrote atomic.Int64
		go func() {
			k, err := c.Write(big)
			wrote.Store(int64(k))
			wres <- err
		}()
		time.Sleep(50 * time.Millisecond)
		c.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
		err = waitHang(t, wres, "Write past a deadline set while it waited", nil)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Write past its deadline = %v (wrote %d), want os.ErrDeadlineExceeded", err, wrote.Load())
		}
		if k := wrote.Load(); k <= 0 || k >= int64(len(big)) {
			t.Fatalf("Write past its deadline reported %d bytes written, want some, not all", k)
		}
		if _, err := c.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Write after the deadline = %v, want os.ErrDeadlineExceeded at once", err)
		}
		if _, err := c.ReadFrom(bytes.NewReader([]byte("x"))); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("ReadFrom after the write deadline = %v, want os.ErrDeadlineExceeded", err)
		}
		// WriteContext: the connection's deadline is not the context's.
		if _, err := c.WriteContext(context.Background(), []byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WriteContext after the write deadline = %v, want os.ErrDeadlineExceeded, not the context's", err)
		}
		c.SetWriteDeadline(time.Time{})
		peer.SetReceivePaused(false) // what was queued drains: the Close below is quick

		// Close wakes a waiting Read with ErrClosed.
		go func() {
			_, err := c.Read(make([]byte, 8))
			errc <- err
		}()
		time.Sleep(20 * time.Millisecond)
		c.Close()
		if err := waitHang(t, errc, "Read at Close", nil); !errors.Is(err, ErrClosed) {
			t.Fatalf("Read at Close = %v, want ErrClosed", err)
		}
		if _, err := c.Read(make([]byte, 8)); !errors.Is(err, ErrClosed) {
			t.Fatalf("Read after Close = %v, want ErrClosed", err)
		}

		// Engine.Close wakes a waiting Read with an error matching net.ErrClosed.
		c2 := dial(true)
		go func() {
			_, err := c2.Read(make([]byte, 8))
			errc <- err
		}()
		time.Sleep(20 * time.Millisecond)
		e.Close()
		if err := waitHang(t, errc, "Read at Engine.Close", nil); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read at Engine.Close = %v, want net.ErrClosed", err)
		}
	})
}

// TestReadSelfAfterEngineClose: what the kernel had received before the engine closed the
// connection is still read, then the stream's end.
func TestReadSelfAfterEngineClose(t *testing.T) {
	e := newEngine(t, smallCfg(BackendIOUring))
	peer, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	msg := bytes.Repeat([]byte("zcnet "), 10000)
	go func() {
		pc, err := peer.Accept()
		if err != nil {
			return
		}
		pc.Write(msg)
		pc.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, pc)
		pc.Close()
	}()
	c, err := e.Dial(context.Background(), "tcp", peer.Addr().String(), HandlerFuncs{}, DialOptions{ReadSelf: true})
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the whole message is in the socket, then close the engine under it.
	for {
		if info, err := c.sock.TCPInfo(); err == nil && info.BytesReceived >= uint64(len(msg)) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	e.Close()
	got, err := io.ReadAll(readerFunc(c.Read))
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("after Engine.Close read %d of %d bytes, err %v", len(got), len(msg), err)
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("Read after the end = %v, want io.EOF", err)
	}
	c.Close() // releases nothing twice
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestWakeFromHandler: a handler hands work to a goroutine through Wake.
func TestWakeFromHandler(t *testing.T) {
	e := newEngine(t, smallCfg(BackendIOUring))
	ch := make(chan struct{}, 1)
	ln, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		return HandlerFuncs{Data: func(c *Conn, d Data) { d.Release(); c.Wake(ch) }}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for i := 0; i < 3; i++ {
		nc.Write([]byte("ping"))
		waitHang(t, ch, "a goroutine woken by Wake", nil)
	}
}

// TestReadSelfNoLeakOnRefusal: a ReadSelf connection that nobody gets (a refused dial, an
// accept function that refuses or panics) leaves no duplicate descriptor behind.
func TestReadSelfNoLeakOnRefusal(t *testing.T) {
	e := newEngine(t, smallCfg(BackendIOUring))
	// A port nothing listens on (bound and closed just before).
	tmp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := tmp.Addr().String()
	tmp.Close()
	var mode atomic.Int32
	ln, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		if mode.Load() == 1 {
			panic("refused by panicking")
		}
		return nil
	}, ListenOptions{ReadSelf: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	settle := func() int {
		// Closes finish on the queue: count once the counts stop moving.
		n := countFDs()
		for i := 0; i < 100; i++ {
			time.Sleep(10 * time.Millisecond)
			m := countFDs()
			if m == n {
				return n
			}
			n = m
		}
		return n
	}
	before := settle()
	for i := 0; i < 20; i++ {
		if _, err := e.Dial(context.Background(), "tcp", dead, HandlerFuncs{}, DialOptions{ReadSelf: true}); err == nil {
			t.Fatal("dial to a closed port succeeded")
		}
		mode.Store(int32(i % 2))
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			continue // refused before the handshake finished (a reset): nothing was made
		}
		nc.Write([]byte("bytes the refused connection never reads"))
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.Copy(io.Discard, nc) // the refusal closes it
		nc.Close()
	}
	if after := settle(); after > before {
		t.Fatalf("%d descriptors before, %d after 20 refused dials and 20 refused accepts", before, after)
	}
}

// TestDialAsyncWithFromHandler: a handler dials with options (ReadSelf, LocalAddr) through
// DialAsync with DialOptions, as a proxy's accept function dials its backend; Dial there would wait.
func TestDialAsyncWithFromHandler(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		e := newEngine(t, smallCfg(b))
		backend, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer backend.Close()
		go func() {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			c.Write([]byte("backend says hi"))
			io.Copy(io.Discard, c)
		}()
		type res struct {
			c   *Conn
			err error
		}
		got := make(chan res, 1)
		local := netip.MustParseAddrPort("127.0.0.1:0")
		ln, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
			if err := e.DialAsync(context.Background(), "tcp", backend.Addr().String(), HandlerFuncs{},
				func(bc *Conn, err error) { got <- res{bc, err} }, DialOptions{ReadSelf: true, LocalAddr: local}); err != nil {
				got <- res{nil, err}
			}
			return HandlerFuncs{}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		r := waitHang(t, got, "DialAsync's done", nil)
		if r.err != nil {
			t.Fatalf("DialAsync with options from the accept function: %v", r.err)
		}
		defer r.c.Close()
		if r.c.laddr.Addr() != local.Addr() {
			t.Errorf("local address %v, want %v", r.c.laddr, local.Addr())
		}
		buf := make([]byte, 64)
		r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := io.ReadAtLeast(readerFunc(r.c.Read), buf, len("backend says hi"))
		if err != nil || string(buf[:n]) != "backend says hi" {
			t.Fatalf("Read of the ReadSelf backend connection = %q, %v", buf[:n], err)
		}
		if err := e.DialAsync(context.Background(), "tcp", backend.Addr().String(), HandlerFuncs{}, nil, DialOptions{}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("DialAsync with options and a nil done = %v, want ErrInvalid", err)
		}
	})
}

// TestReadSelfQueueNotBehindReader: a Read on a queue goroutine while another goroutine's
// Read waits in the poller returns ErrWouldBlock at once instead of stalling the queue
// behind it.
func TestReadSelfQueueNotBehindReader(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		e, srv := newEngine(t, smallCfg(b)), newEngine(t, smallCfg(b))
		ln, err := srv.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return HandlerFuncs{} })
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), HandlerFuncs{}, DialOptions{ReadSelf: true})
		if err != nil {
			t.Fatal(err)
		}
		blocked := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 8)) // nothing comes: waits until Close
			blocked <- err
		}()
		time.Sleep(50 * time.Millisecond)
		onQ := make(chan error, 1)
		if err := c.Post(func() {
			_, err := c.Read(make([]byte, 8))
			onQ <- err
		}); err != nil {
			t.Fatal(err)
		}
		if err := waitHang(t, onQ, "a queue goroutine's Read beside a waiting reader", nil); !errors.Is(err, ErrWouldBlock) {
			t.Fatalf("Read on a queue goroutine beside a waiting reader = %v, want ErrWouldBlock", err)
		}
		c.Close()
		if err := waitHang(t, blocked, "the waiting Read at Close", nil); !errors.Is(err, ErrClosed) {
			t.Fatalf("the waiting Read at Close = %v, want ErrClosed", err)
		}
	})
}

// Out of descriptors for the duplicate of a ReadSelf connection (opened as the net.Conn
// face, zc/netconn, opens its direct ones: ReadSelf and Exclusive): an accepted connection
// is refused (counted in AcceptErrors; the peer sees it end), a dial fails with the errno;
// nothing leaks. (The face turns the dial's *OpError into a *net.OpError of the same Err.)
func TestReadSelfNoDescriptor(t *testing.T) {
	old := dupFD
	dupFD = func(int) (int, error) { return -1, unix.EMFILE }
	defer func() { dupFD = old }()
	eachBackend(t, func(t *testing.T, b Backend) {
		e := newEngine(t, Config{Backend: b, Queues: 1, NoPin: true})
		opts := ListenOptions{ReadSelf: true, Exclusive: true}
		ln, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler { return HandlerFuncs{} }, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		s := dialPlain(t, ln.Addr().String())
		s.SetNonblocking(false)
		setRecvTimeout(s, hangBound)
		k, rerr := s.Read(make([]byte, 8))
		if k != 0 || (rerr != nil && rerr != io.EOF && !errors.Is(rerr, unix.ECONNRESET)) {
			t.Fatalf("peer of a refused connection: read %d, %v; want its end", k, rerr)
		}
		if n := e.Stats().Faults.AcceptErrors; n != 1 {
			t.Errorf("AcceptErrors = %d, want 1", n)
		}
		nc, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), HandlerFuncs{}, DialOptions{ReadSelf: true, Exclusive: true})
		var oe *OpError
		if err == nil || !errors.As(err, &oe) || oe.Op != "dial" || !errors.Is(err, unix.EMFILE) {
			t.Fatalf("DialWith ReadSelf without a descriptor for the poller: %v, %v; want a dial *OpError matching EMFILE", nc, err)
		}
		deadline := time.Now().Add(hangBound)
		for e.Stats().Conns > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections left after the refusals", e.Stats().Conns)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}
