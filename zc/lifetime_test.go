package zc

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// Lifetimes the process cannot crash on: no callback on a reused descriptor, memory
// the application holds stays mapped after Engine.Close, and every call after Close fails
// with an error matching ErrClosed.

// TestSocketAfterPeerReset: Conn.Socket racing a peer reset, with new sockets taking the
// freed descriptor numbers meanwhile: every callback that runs sees our connection (its peer
// is our client), and once the connection closed Socket fails with ErrClosed without
// calling back.
func TestSocketAfterPeerReset(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testSocketAfterPeerReset(t, Config{Backend: b}) })
}

func testSocketAfterPeerReset(t *testing.T, cfg Config) {
	e := newEngine(t, cfg)
	l, ev := listenEvents(t, e)
	reused := 0
	for round := 0; round < 20; round++ {
		s, err := tcpglue.Dial("tcp", l.Addr().String(), tcpglue.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cliAddr, _ := s.LocalAddr()
		c := recvEvent(t, ev.conn, "accept")
		var fd int
		if err := c.Socket(func(so *tcpglue.Socket) error { fd = so.Fd(); return nil }); err != nil {
			t.Fatalf("Socket on a live connection: %v", err)
		}
		// Hammer Socket while the peer resets and new sockets grab descriptors.
		var wrong atomic.Int64
		var calls atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c.Socket(func(so *tcpglue.Socket) error {
					calls.Add(1)
					return so.Control(func(fd int) error {
						sa, err := unix.Getpeername(fd)
						if err != nil {
							return nil // our socket, reset: no peer any more
						}
						if tcpglue.TCPAddrFromSockaddr(sa).AddrPort() != cliAddr {
							wrong.Add(1)
						}
						return nil
					})
				})
			}
		}()
		s.SetLinger(0)
		s.Close() // RST
		recvEvent(t, ev.closed, "close after reset")
		select {
		case <-c.Done():
		case <-time.After(hangBound):
			t.Fatal("connection not done after the peer's reset")
		}
		// New descriptors: the lowest free numbers are reused, the connection's among them.
		var others []*tcpglue.Socket
		for i := 0; i < 8; i++ {
			o, err := tcpglue.Listen("tcp", "127.0.0.1:0", tcpglue.ListenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if o.Fd() == fd {
				reused++
			}
			others = append(others, o)
		}
		ran := false
		err = c.Socket(func(*tcpglue.Socket) error { ran = true; return nil })
		close(stop)
		wg.Wait()
		for _, o := range others {
			o.Close()
		}
		if ran || !errors.Is(err, ErrClosed) {
			t.Fatalf("round %d: Socket after the connection closed: callback ran %v, err %v (want ErrClosed)", round, ran, err)
		}
		var oe *OpError
		if !errors.As(err, &oe) {
			t.Fatalf("Socket after close: %T %v, want *OpError", err, err)
		}
		if n := wrong.Load(); n != 0 {
			t.Fatalf("round %d: %d of %d Socket callbacks saw another socket (a reused descriptor)", round, n, calls.Load())
		}
	}
	t.Logf("descriptor number reused by a new socket in %d of 20 rounds", reused)
	if reused == 0 {
		t.Fatal("no round reused the descriptor number: the test did not provoke reuse")
	}
}

// TestEngineCloseWithHeldMemory: Engine.Close while the application holds a send buffer
// (Conn.Buffer) and received data (held from OnData): both stay usable (write the buffer,
// read the data), Release works, and the regions are unmapped after the last release.
func TestEngineCloseWithHeldMemory(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		testEngineCloseWithHeldMemory(t, Config{Backend: b, Queues: 2, NoPin: true})
	})
}

func waitRegions(want int64) int64 {
	deadline := time.Now().Add(5 * time.Second)
	for memreg.OpenRegions() != want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return memreg.OpenRegions()
}

func testEngineCloseWithHeldMemory(t *testing.T, cfg Config) {
	before := waitRegions(0)
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if memreg.OpenRegions() <= before {
		t.Fatalf("engine has no regions? %d before, %d after New", before, memreg.OpenRegions())
	}
	held := make(chan Data, 4)
	conns := make(chan *Conn, 1)
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		conns <- c
		return HandlerFuncs{Data: func(c *Conn, d Data) { held <- d }} // kept, not released
	})
	if err != nil {
		t.Fatal(err)
	}
	s := dialPlain(t, l.Addr().String())
	c := recvEvent(t, conns, "accept")
	msg := bytes.Repeat([]byte("held data "), 100)
	if _, err := s.Write(msg); err != nil {
		t.Fatal(err)
	}
	var ds []Data
	for got := 0; got < len(msg); {
		d := recvEvent(t, held, "data")
		ds = append(ds, d)
		got += d.Len()
	}
	b, err := c.Buffer()
	if err != nil {
		t.Fatal(err)
	}
	b2, err := c.Buffer() // a second one is sent after Close (it must fail and be released)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	if err := waitHang(t, closed, "Engine.Close with memory held", func() string { return "" }); err != nil {
		t.Fatalf("Engine.Close: %v", err)
	}
	// The memory is still ours: write the buffer, read the data.
	p := b.Bytes()
	if len(p) == 0 {
		t.Fatal("held buffer lost its bytes after Engine.Close")
	}
	for i := range p {
		p[i] = byte(i)
	}
	var got []byte
	for _, d := range ds {
		got = append(got, d.Bytes()...)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("held data after Engine.Close: %d bytes, equal %v", len(got), bytes.Equal(got, msg))
	}
	if err := c.Send(b2, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Send after Engine.Close = %v, want ErrClosed", err)
	}
	if b2.Valid() {
		t.Fatal("failed Send after Engine.Close left the buffer with the caller")
	}
	if n := memreg.OpenRegions(); n <= before {
		t.Fatalf("regions unmapped while the application holds their memory: %d open, %d before the engine", n, before)
	}
	if err := b.Release(); err != nil {
		t.Fatalf("Release of the held buffer after Engine.Close: %v", err)
	}
	for i, d := range ds {
		if err := d.Release(); err != nil {
			t.Fatalf("Release of held data %d after Engine.Close: %v", i, err)
		}
		// Stale, or (once the last buffer came back and the region is gone) closed.
		if err := d.Release(); !errors.Is(err, memreg.ErrStale) && !errors.Is(err, memreg.ErrClosed) {
			t.Fatalf("second Release of held data = %v, want ErrStale", err)
		}
	}
	if n := waitRegions(before); n != before {
		t.Fatalf("%d regions open after the last release, %d before the engine", n, before)
	}
}

// TestCallsAfterClose: Post, Buffer, BufferWait, SetReceivePaused, Send, SendData, Write,
// CloseWrite and SetHandler after Conn.Close (and after Engine.Close) fail with a typed error
// matching ErrClosed, never nil, and a buffer passed to a failed Send is released.
func TestCallsAfterClose(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testCallsAfterClose(t, Config{Backend: b}) })
}

func testCallsAfterClose(t *testing.T, cfg Config) {
	for _, how := range []string{"Conn.Close", "Engine.Close", "peer reset"} {
		t.Run(how, func(t *testing.T) {
			e, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			l, ev := listenEvents(t, e)
			s := dialPlain(t, l.Addr().String())
			c := recvEvent(t, ev.conn, "accept")
			spare, err := c.Buffer() // taken before the close, sent after it
			if err != nil {
				t.Fatal(err)
			}
			s.Write([]byte("some data"))
			recvEvent(t, ev.data, "data")
			switch how {
			case "Conn.Close":
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
			case "Engine.Close":
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
			case "peer reset":
				s.SetLinger(0)
				s.Close()
			}
			select {
			case <-c.Done():
			case <-time.After(hangBound):
				t.Fatal("connection not done")
			}
			check := func(what string, err error) {
				t.Helper()
				var oe *OpError
				// After a reset the connection's own error (ECONNRESET) is as good an answer.
				ok := errors.Is(err, ErrClosed) || how == "peer reset" && errors.Is(err, unix.ECONNRESET)
				if !ok || !errors.As(err, &oe) {
					t.Errorf("%s after %s = %v (%T), want an *OpError matching ErrClosed", what, how, err, err)
				}
			}
			ran := make(chan struct{}, 1)
			check("Post", c.Post(func() { ran <- struct{}{} }))
			b, err := c.Buffer()
			check("Buffer", err)
			if b.Valid() {
				b.Release()
			}
			b, err = c.BufferWait(time.Second)
			check("BufferWait", err)
			if b.Valid() {
				b.Release()
			}
			check("SetReceivePaused(true)", c.SetReceivePaused(true))
			check("SetReceivePaused(false)", c.SetReceivePaused(false))
			check("Send", c.Send(spare, 1))
			if spare.Valid() {
				t.Errorf("Send after %s kept the caller's buffer", how)
				spare.Release()
			}
			_, err = c.Write([]byte("x"))
			check("Write", err)
			check("CloseWrite", c.CloseWrite())
			check("SetHandler", c.SetHandler(HandlerFuncs{}))
			if how != "peer reset" {
				check("second Close", c.Close())
			}
			select {
			case <-ran:
				t.Errorf("a function posted after %s ran", how)
			case <-time.After(50 * time.Millisecond):
			}
			if how != "Engine.Close" {
				waitSendBuffersBack(t, e)
			}
		})
	}
}

// TestDialAfterEngineClose: DialAsync on a closed engine fails at once, typed, and its done
// function never runs.
func TestDialAfterEngineClose(t *testing.T) {
	e := newEngine(t, Config{Queues: 1, NoPin: true})
	e.Close()
	err := e.DialAsync(context.Background(), "tcp", netip.MustParseAddrPort("127.0.0.1:9").String(), HandlerFuncs{}, func(*Conn, error) {
		t.Error("done ran for a DialAsync that returned an error")
	})
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("DialAsync after Engine.Close = %v, want ErrClosed", err)
	}
}
