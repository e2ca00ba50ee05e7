package zc

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
)

// misuses collects what Config.Debug reports.
type misuses struct {
	mu   sync.Mutex
	errs []*MisuseError
}

func (m *misuses) add(err error) {
	var me *MisuseError
	if errors.As(err, &me) {
		m.mu.Lock()
		m.errs = append(m.errs, me)
		m.mu.Unlock()
	}
}

func (m *misuses) has(kind string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.errs {
		if e.Kind == kind {
			return true
		}
	}
	return false
}

func debugEngine(t *testing.T, d DebugOptions, m *misuses, b ...Backend) *Engine {
	d.OnMisuse = m.add
	cfg := Config{Queues: 1, Debug: d, NoFallback: true}
	if len(b) > 0 {
		cfg.Backend = b[0]
	}
	cfg.SocketOptions = func(s *tcpglue.Socket) error {
		_, err := s.SetSendBuffer(16 << 10)
		return err
	}
	return newEngine(t, cfg)
}

func dialPeer(t *testing.T, e *Engine, h Handler) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), h)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return c, p
}

// TestDebugWriteAfterSend: a slice of Buf.Bytes written after Send is reported when the
// buffer comes back.
func TestDebugWriteAfterSend(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		m := &misuses{}
		e := debugEngine(t, DebugOptions{Buffers: true}, m, b)
		c, peer := dialPeer(t, e, HandlerFuncs{})
		// Fill the socket (the peer does not read yet), so the next Send waits in the queue.
		go c.Write(make([]byte, 4<<20))
		testutil.Eventually(t, "bytes queued", func() bool { return c.Queued() > 0 })
		buf, err := c.BufferWait(0)
		if err != nil {
			t.Fatal(err)
		}
		kept := buf.Bytes()
		for i := range kept {
			kept[i] = 'a'
		}
		if err := c.Send(buf, len(kept)); err != nil {
			t.Fatal(err)
		}
		kept[100] = 'b' // the misuse
		go io.Copy(io.Discard, peer)
		testutil.Eventually(t, "the write after Send reported", func() bool { return m.has("write after Send") })
		if e.Stats().Debug.Misuses == 0 {
			t.Fatal("Stats.Debug.Misuses is 0")
		}
	})
}

// TestDebugWriteAfterRelease: a slice kept past Release and written is reported when the
// buffer is handed out again.
func TestDebugWriteAfterRelease(t *testing.T) {
	m := &misuses{}
	e := debugEngine(t, DebugOptions{Buffers: true}, m)
	c, _ := dialPeer(t, e, HandlerFuncs{})
	b, err := c.BufferWait(0)
	if err != nil {
		t.Fatal(err)
	}
	kept := b.Bytes()
	b.Release()
	kept[7] = 1 // the misuse
	for i := 0; i < 64 && !m.has("write after Release"); i++ {
		b, err := c.BufferWait(0)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release()
	}
	if !m.has("write after Release") {
		t.Fatal("the write after Release was not reported")
	}
	// A correct program is never reported: fill, release, take again.
	m2 := &misuses{}
	e2 := debugEngine(t, DebugOptions{Buffers: true}, m2)
	c2, peer2 := dialPeer(t, e2, HandlerFuncs{})
	go io.Copy(io.Discard, peer2)
	for i := 0; i < 100; i++ {
		b, err := c2.BufferWait(0)
		if err != nil {
			t.Fatal(err)
		}
		p := b.Bytes()
		for j := range p {
			p[j] = byte(i)
		}
		if i%2 == 0 {
			b.Release()
		} else if err := c2.Send(b, len(p)); err != nil {
			t.Fatal(err)
		}
	}
	c2.Close()
	<-c2.Done()
	if len(m2.errs) != 0 || e2.Stats().Debug.Misuses != 0 {
		t.Fatalf("a correct program was reported: %v", m2.errs)
	}
}

// TestDebugSlowAndHeld: a blocking handler and a forgotten Release are counted.
func TestDebugSlowAndHeld(t *testing.T) {
	m := &misuses{}
	e := debugEngine(t, DebugOptions{SlowHandler: 5 * time.Millisecond, HeldData: 20 * time.Millisecond}, m)
	var kept []Data
	var mu sync.Mutex
	c, peer := dialPeer(t, e, HandlerFuncs{Data: func(_ *Conn, d Data) {
		time.Sleep(20 * time.Millisecond) // blocks its queue: the misuse
		mu.Lock()
		kept = append(kept, d) // never released: the other misuse
		mu.Unlock()
	}})
	peer.Write([]byte("data"))
	testutil.Eventually(t, "the slow handler counted", func() bool { return e.Stats().Debug.SlowHandlerCalls > 0 })
	testutil.Eventually(t, "the held Data counted", func() bool { return e.Stats().Debug.DataHeldLong > 0 })
	// Each report follows its count (counted, then OnMisuse called).
	testutil.Eventually(t, "both reported", func() bool { return m.has("slow handler") && m.has("Data held") })
	if !m.has("slow handler") || !m.has("Data held") {
		t.Fatalf("reports: %v", m.errs)
	}
	mu.Lock()
	for _, d := range kept {
		d.Release()
	}
	mu.Unlock()
	c.Close()
	<-c.Done()
	if _, err := New(Config{Debug: DebugOptions{SlowHandler: -1}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative SlowHandler = %v, want ErrInvalid", err)
	}
}

// TestDebugKeptSliceAfterClose: under Debug.Buffers a slice of Data kept past Release after
// Engine.Close can be written without crashing the process.
func TestDebugKeptSliceAfterClose(t *testing.T) {
	e, err := New(Config{Queues: 1, Debug: DebugOptions{Buffers: true}})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan Data, 1)
	_, peer := dialPeer(t, e, HandlerFuncs{Data: func(_ *Conn, d Data) { got <- d }})
	peer.Write([]byte("hello"))
	d := <-got
	kept := d.Bytes()
	e.Close()
	d.Release()   // the last buffer: the region would be unmapped here
	kept[0] = 'x' // without Debug.Buffers this write is a SIGSEGV (the process dies)
}

// TestQueueStalls: a handler that blocks its queue is counted, without Config.Debug.
func TestQueueStalls(t *testing.T) {
	e := newEngine(t, Config{Queues: 1})
	release := make(chan struct{})
	c, peer := dialPeer(t, e, HandlerFuncs{Data: func(_ *Conn, d Data) {
		<-release // blocks the queue: the misuse
		d.Release()
	}})
	peer.Write([]byte("x"))
	testutil.Eventually(t, "the stall counted", func() bool { return e.Stats().Loop.Stalls > 0 })
	close(release)
	c.Close()
	<-c.Done()
	if n := e.Stats().Loop.Stalls; n != 1 {
		t.Fatalf("one stall counted %d times", n)
	}
}
