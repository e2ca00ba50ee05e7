package zc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// Misuse gets a typed error, never a silent default.

// TestConfigNegative: every negative Config field is refused by New with a *ConfigError that
// names it and matches ErrInvalid; nothing is started (no region, no ring left behind).
func TestConfigNegative(t *testing.T) {
	cases := []struct {
		field string
		cfg   Config
	}{
		{"Queues", Config{Queues: -1}},
		{"ZCThreshold", Config{ZCThreshold: -1}},
		{"ZCReprobe", Config{ZCReprobe: -1}},
		{"SendBufSize", Config{SendBufSize: -1}},
		{"SendBufs", Config{SendBufs: -1}},
		{"SendPoolMax", Config{SendPoolMax: -1}},
		{"RecvBufSize", Config{RecvBufSize: -1}},
		{"RecvBufs", Config{RecvBufs: -1}},
		{"RecvPoolMax", Config{RecvPoolMax: -1}},
		{"MaxQueuedBytes", Config{MaxQueuedBytes: -1}},
		{"MaxRecvHeld", Config{MaxRecvHeld: -1}},
		{"CloseTimeout", Config{CloseTimeout: -time.Second}},
		{"CloseStall", Config{CloseStall: -time.Second}},
		{"CloseStall", Config{CloseTimeout: 10 * time.Second, CloseStall: time.Second}},
		// Below the initial pool: refused, not silently raised.
		{"SendPoolMax", Config{SendBufs: 8, SendBufSize: 64 << 10, SendPoolMax: 64 << 10}},
		{"RecvPoolMax", Config{RecvBufs: 16, RecvBufSize: 32 << 10, RecvPoolMax: 32 << 10}},
		{"MaxRecvHeld", Config{RecvBufSize: 64 << 10, MaxRecvHeld: 4096}},
	}
	regions := memreg.OpenRegions()
	for _, tc := range cases {
		for _, b := range []Backend{BackendAuto, BackendIOUring, BackendPlain} {
			cfg := tc.cfg
			cfg.Backend = b
			e, err := New(cfg)
			if e != nil {
				e.Close()
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) || ce.Field != tc.field {
				t.Errorf("New(%+v) = %v; want a *ConfigError for %s matching ErrInvalid", tc.cfg, err, tc.field)
				continue
			}
			if b == BackendAuto {
				t.Logf("%s: %v", tc.field, err)
			}
		}
	}
	if n := memreg.OpenRegions(); n != regions {
		t.Errorf("refused configs left regions behind: %d open, %d before", n, regions)
	}
}

func TestMisuse(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testMisuse(t, Config{Backend: b}) })
}

func testMisuse(t *testing.T, cfg Config) {
	cfg.Queues = 1
	cfg.NoPin = true
	e := newEngine(t, cfg)
	other := newEngine(t, cfg)
	l, ev := listenEvents(t, e)
	s := dialPlain(t, l.Addr().String())
	c := recvEvent(t, ev.conn, "accept")
	pool := e.queues[0].send
	free := func() int { return pool.Free() }

	t.Run("Send0", func(t *testing.T) {
		before := free()
		b, err := c.Buffer()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Send(b, 0); !errors.Is(err, ErrEmpty) {
			t.Fatalf("Send(b, 0) = %v, want ErrEmpty", err)
		}
		if b.Valid() || free() != before {
			t.Fatalf("Send(b, 0) kept the buffer: valid %v, free %d (before %d)", b.Valid(), free(), before)
		}
	})
	t.Run("SendNegative", func(t *testing.T) {
		before := free()
		b, _ := c.Buffer()
		if err := c.Send(b, -1); !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrInvalid) {
			t.Fatalf("Send(b, -1) = %v, want a typed error", err)
		}
		if free() != before {
			t.Fatalf("Send(b, -1) leaked the buffer")
		}
	})
	t.Run("SendDataEmpty", func(t *testing.T) {
		if err := c.SendData(Data{}); !errors.Is(err, ErrEmpty) {
			t.Fatalf("SendData(Data{}) = %v, want ErrEmpty", err)
		}
	})
	t.Run("SendForeignBuffer", func(t *testing.T) {
		op := other.queues[0].send
		before := op.Free()
		b, err := other.queues[0].getSendBuf()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Send(b, 1); !errors.Is(err, ErrForeignBuffer) {
			t.Fatalf("Send of another engine's buffer = %v, want ErrForeignBuffer", err)
		}
		if b.Valid() || op.Free() != before {
			t.Fatalf("the refused foreign buffer was not released to its pool (free %d, before %d)", op.Free(), before)
		}
		// A region of no engine at all.
		r, err := memreg.New(memreg.Options{BufSize: 4096, Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		rb, _ := r.Get()
		if err := c.Send(rb, 1); !errors.Is(err, ErrForeignBuffer) {
			t.Fatalf("Send of a plain region's buffer = %v, want ErrForeignBuffer", err)
		}
	})
	t.Run("SendDataForeign", func(t *testing.T) {
		// Data received by another engine's connection, forwarded to ours: refused, released.
		type result struct {
			err      error
			released bool
		}
		got := make(chan result, 1)
		ol, err := other.Listen("tcp", "127.0.0.1:0", func(oc *Conn) Handler {
			return HandlerFuncs{Data: func(oc *Conn, d Data) {
				err := c.SendData(d)
				got <- result{err, d.Bytes() == nil}
			}}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer ol.Close()
		peer := dialPlain(t, ol.Addr().String())
		peer.Write([]byte("foreign"))
		r := recvEvent(t, got, "foreign data")
		if !errors.Is(r.err, ErrForeignBuffer) || !r.released {
			t.Fatalf("SendData of another engine's Data = %v (released %v), want ErrForeignBuffer and the Data released", r.err, r.released)
		}
	})
	t.Run("SetHandlerNil", func(t *testing.T) {
		if err := c.SetHandler(nil); !errors.Is(err, ErrInvalid) {
			t.Fatalf("SetHandler(nil) = %v, want ErrInvalid", err)
		}
		var oe *OpError
		if err := c.SetHandler(nil); !errors.As(err, &oe) {
			t.Fatalf("SetHandler(nil) = %T, want *OpError", err)
		}
		// The connection still works with its handler.
		s.Write([]byte("after"))
		if got := recvEvent(t, ev.data, "data after SetHandler(nil)"); string(got) != "after" {
			t.Fatalf("got %q", got)
		}
	})
	t.Run("NilArgs", func(t *testing.T) {
		if err := e.DialAsync(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{}, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("DialAsync with nil done = %v", err)
		}
		//lint:ignore SA1012 a nil context is the misuse under test
		if _, err := e.Dial(nil, "tcp", l.Addr().String(), HandlerFuncs{}); !errors.Is(err, ErrInvalid) { //nolint:staticcheck
			t.Errorf("Dial with nil context = %v", err)
		}
		if _, err := e.Dial(context.Background(), "tcp", "0.0.0.0:80", HandlerFuncs{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("Dial of 0.0.0.0 = %v, want ErrInvalid", err)
		}
		if _, err := e.Listen("tcp", "127.0.0.1:0", echoAccept, ListenOptions{Backlog: -1}); !errors.Is(err, ErrInvalid) {
			t.Errorf("Listen with a negative backlog = %v", err)
		}
		// Post(nil) was accepted and then closed the connection with a *PanicError.
		if err := c.Post(nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("Post(nil) = %v, want ErrInvalid", err)
		}
		s.Write([]byte("post"))
		if got := recvEvent(t, ev.data, "data after Post(nil)"); string(got) != "post" {
			t.Fatalf("got %q after Post(nil)", got)
		}
	})
	t.Run("SendAfterCloseWrite", func(t *testing.T) {
		// Write, Send and SendData after CloseWrite fail with an error matching ErrClosed, as
		// SendFile's does (they returned a bare "write side closed" no sentinel matched).
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("x")); !errors.Is(err, ErrClosed) {
			t.Errorf("Write after CloseWrite = %v, want ErrClosed", err)
		}
		b, err := c.Buffer()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Send(b, 1); !errors.Is(err, ErrClosed) {
			t.Errorf("Send after CloseWrite = %v, want ErrClosed", err)
		}
		if b.Valid() {
			t.Errorf("Send after CloseWrite kept the buffer")
		}
		if err := c.CloseWrite(); !errors.Is(err, ErrClosed) {
			t.Errorf("a second CloseWrite = %v, want ErrClosed", err)
		}
	})
}

// TestHandlerPanics: a panic in a handler method (or the accept function, or a posted
// function) closes that connection with an error wrapping *PanicError, is counted in
// Stats.Faults.HandlerPanics, and the engine keeps serving the others.
func TestHandlerPanics(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testHandlerPanics(t, Config{Backend: b, Queues: 1, NoPin: true}) })
}

func testHandlerPanics(t *testing.T, cfg Config) {
	e := newEngine(t, cfg)
	type closeEv struct {
		name string
		err  error
	}
	closed := make(chan closeEv, 16)
	mode := make(chan string, 16)
	conns := make(chan *Conn, 16)
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		m := <-mode
		conns <- c
		if m == "accept" {
			panic("boom in accept")
		}
		return &panicky{mode: m, closed: func(err error) { closed <- closeEv{m, err} }}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// A healthy echo connection on the same queue, checked after every panic.
	el, err := e.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		t.Fatal(err)
	}
	defer el.Close()
	healthy := dialPlain(t, el.Addr().String())
	echoOK := func(when string) {
		t.Helper()
		msg := []byte("ping " + when)
		if _, err := healthy.Write(msg); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(msg))
		setRecvTimeout(healthy, hangBound)
		if _, err := io.ReadFull(healthy, buf); err != nil || string(buf) != string(msg) {
			t.Fatalf("the engine stopped serving after a panic in %s: %q, %v", when, buf, err)
		}
	}
	echoOK("start")
	for i, m := range []string{"OnData", "OnWritable", "posted", "OnEOF", "accept"} {
		before := e.Stats().Faults.HandlerPanics
		mode <- m
		s, err := tcpglue.Dial("tcp", l.Addr().String(), tcpglue.DialOptions{})
		if err != nil {
			// A panicking accept function resets the connection: on a slow machine (TCG)
			// that can land before the blocking connect returns, which then reports it.
			if m != "accept" || !errors.Is(err, unix.ECONNRESET) {
				t.Fatalf("%s: dial: %v", m, err)
			}
			s = nil
		} else {
			t.Cleanup(func() { s.Close() })
		}
		c := recvEvent(t, conns, "accept")
		switch m {
		case "OnData", "OnWritable":
			s.Write([]byte("trigger"))
		case "posted":
			c.Post(func() { panic("boom in a posted function") })
		case "OnEOF":
			s.Shutdown(unix.SHUT_WR)
		}
		select {
		case <-c.Done():
		case <-time.After(hangBound):
			t.Fatalf("%s: the panicking connection did not close\n%s", m, engineDump(e))
		}
		if m != "accept" {
			ce := recvEvent(t, closed, "OnClose")
			var pe *PanicError
			if !errors.As(ce.err, &pe) || pe.Method == "" || len(pe.Stack) == 0 {
				t.Fatalf("%s: OnClose error %v (%T), want one wrapping *PanicError", m, ce.err, ce.err)
			}
			t.Logf("%s: closed with %v", m, ce.err)
		}
		if got := e.Stats().Faults.HandlerPanics; got != before+1 {
			t.Fatalf("%s: HandlerPanics %d, want %d", m, got, before+1)
		}
		if s == nil { // the peer already saw the reset
			echoOK(fmt.Sprintf("%s (%d)", m, i))
			continue
		}
		// The peer sees the connection end.
		setRecvTimeout(s, hangBound)
		buf := make([]byte, 64)
		for {
			n, err := s.Read(buf)
			if err != nil || n == 0 {
				if err != nil && err != io.EOF && !errors.Is(err, unix.ECONNRESET) {
					t.Fatalf("%s: peer read %v", m, err)
				}
				break
			}
		}
		echoOK(fmt.Sprintf("%s (%d)", m, i))
	}
}

// panicky panics in the method named by mode.
type panicky struct {
	mode   string
	closed func(error)
}

func (p *panicky) OnData(c *Conn, d Data) {
	d.Release()
	switch p.mode {
	case "OnData":
		panic("boom in OnData")
	case "OnWritable":
		b, err := c.Buffer()
		if err == nil {
			c.Send(b, 1) // its completion calls OnWritable
		}
	}
}

func (p *panicky) OnWritable(c *Conn) {
	if p.mode == "OnWritable" {
		panic("boom in OnWritable")
	}
}

func (p *panicky) OnEOF(c *Conn, err error) {
	if p.mode == "OnEOF" {
		panic(fmt.Errorf("boom in OnEOF after %w", err))
	}
}

func (p *panicky) OnClose(c *Conn, err error) { p.closed(err) }

// TestListenAddrInUse: Listen on an address another zc listener holds (same engine, another
// engine, a plain socket) fails with EADDRINUSE; ListenOptions.Shared joins instead; port 0
// always works; the address is free again once the holder closed.
func TestListenAddrInUse(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testListenAddrInUse(t, Config{Backend: b}) })
}

func testListenAddrInUse(t *testing.T, cfg Config) {
	e := newEngine(t, cfg)
	e2 := newEngine(t, cfg)
	acc := make(chan string, 64)
	accept := func(name string) func(*Conn) Handler {
		return func(c *Conn) Handler {
			acc <- name
			return HandlerFuncs{}
		}
	}
	first, err := e.Listen("tcp", "127.0.0.1:0", accept("first"))
	if err != nil {
		t.Fatal(err)
	}
	addr := first.Addr().String()
	for _, tc := range []struct {
		name string
		e    *Engine
	}{{"same engine", e}, {"another engine", e2}} {
		l, err := tc.e.Listen("tcp", addr, accept("second"))
		if err == nil {
			l.Close()
			t.Fatalf("Listen on %s held by a zc listener (%s) succeeded", addr, tc.name)
		}
		var oe *OpError
		if !errors.Is(err, unix.EADDRINUSE) || !errors.As(err, &oe) {
			t.Fatalf("Listen on a held address (%s) = %v, want an *OpError matching EADDRINUSE", tc.name, err)
		}
		// Shared: joins the group.
		sl, err := tc.e.Listen("tcp", addr, accept("shared"), ListenOptions{Shared: true})
		if err != nil {
			t.Fatalf("Listen Shared on %s (%s) = %v", addr, tc.name, err)
		}
		// Connections reach the group (either listener).
		for i := 0; i < 4; i++ {
			s := dialPlain(t, addr)
			recvEvent(t, acc, "accept")
			s.Close()
		}
		sl.Close()
		<-sl.Done()
	}
	// A plain socket holding an address (with SO_REUSEPORT even) also refuses.
	ps, err := tcpglue.Listen("tcp", "127.0.0.1:0", tcpglue.ListenOptions{ReusePort: true})
	if err != nil {
		t.Fatal(err)
	}
	pa, _ := ps.LocalAddr()
	if l, err := e.Listen("tcp", pa.String(), accept("x")); !errors.Is(err, unix.EADDRINUSE) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("Listen on an address a plain reuseport socket holds = %v, want EADDRINUSE", err)
	}
	ps.Close()
	// Port 0 always works, many times over.
	var ls []*Listener
	for i := 0; i < 4; i++ {
		l, err := e.Listen("tcp", "127.0.0.1:0", accept("zero"))
		if err != nil {
			t.Fatalf("Listen on port 0 (%d): %v", i, err)
		}
		ls = append(ls, l)
	}
	for _, l := range ls {
		l.Close()
	}
	// Once the holder closed, the address is free.
	first.Close()
	<-first.Done()
	again, err := e2.Listen("tcp", addr, accept("again"))
	if err != nil {
		t.Fatalf("Listen on %s after its holder closed: %v", addr, err)
	}
	again.Close()
	if _, ok := first.Addr().(*net.TCPAddr); !ok {
		t.Fatalf("Addr is %T", first.Addr())
	}
}

// TestTwoOptionStructs: Listen, Dial, DialAsync and Relay take at most one options struct;
// two are ErrInvalid, and nothing is opened or changed.
func TestTwoOptionStructs(t *testing.T) {
	e := newEngine(t, Config{Queues: 1})
	if _, err := e.Listen("tcp", "127.0.0.1:0", echoAccept, ListenOptions{}, ListenOptions{Shared: true}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Listen with two ListenOptions = %v, want ErrInvalid", err)
	}
	l, err := e.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := e.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{}, DialOptions{}, DialOptions{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Dial with two DialOptions = %v, want ErrInvalid", err)
	}
	err = e.DialAsync(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{}, func(*Conn, error) { t.Error("done ran") }, DialOptions{}, DialOptions{})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("DialAsync with two DialOptions = %v, want ErrInvalid", err)
	}
	a, _ := dialPeer(t, e, HandlerFuncs{})
	b, _ := dialPeer(t, e, HandlerFuncs{})
	if _, err := Relay(a, b, RelayOptions{}, RelayOptions{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Relay with two RelayOptions = %v, want ErrInvalid", err)
	}
	if closing(a) || closing(b) {
		t.Error("a refused Relay closed a connection")
	}
	if st := l.Stats(); st.Accepted != 0 {
		t.Errorf("accepted %d: a refused Dial connected", st.Accepted)
	}
}

func closing(c *Conn) bool { return c.isClosing() }
