package zc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
)

// SendBytes: sends from the application's own memory (sendbytes.go), on every backend
// (the shim's run in the VM: shim_vm_test.go calls the test* functions with shimCfg).

// sendBytesConfigs are the backends and send paths SendBytes runs on here: io_uring with
// the adaptive policy (zero-copy probes, then copying sends on loopback), io_uring forced to
// zero-copy (SEND_ZC by address, callbacks after the notification), and plain sockets.
func sendBytesConfigs() map[string]Config {
	return map[string]Config{
		"uring":   {Backend: BackendIOUring},
		"uringZC": {Backend: BackendIOUring, SendPath: SendZeroCopy},
		"plain":   {Backend: BackendPlain},
	}
}

func forSendBytesConfigs(t *testing.T, f func(t *testing.T, cfg Config)) {
	for name, cfg := range sendBytesConfigs() {
		t.Run(name, func(t *testing.T) { f(t, cfg) })
	}
}

// waitAppHeld waits until no SendBytes slice of e is pinned any more (every one handed
// back), failing after a bound.
func waitAppHeld(t *testing.T, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.shareCtr.appHeld.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d SendBytes slices still pinned\n%s", e.shareCtr.appHeld.Load(), engineDump(e))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// appDone records the calls of SendBytes callbacks: each exactly once, on the loop.
type appDone struct {
	mu    sync.Mutex
	calls map[int]int
	errs  map[int]error
	off   int // calls made off the connection's queue goroutine
	ch    chan int
}

func newAppDone() *appDone {
	return &appDone{calls: map[int]int{}, errs: map[int]error{}, ch: make(chan int, 1<<16)}
}

func (a *appDone) fn(c *Conn, k int, after func(error)) func(error) {
	return func(err error) {
		a.mu.Lock()
		a.calls[k]++
		a.errs[k] = err
		if !c.q.OnLoop() {
			a.off++
		}
		a.mu.Unlock()
		if after != nil {
			after(err)
		}
		a.ch <- k
	}
}

// check fails unless callbacks 0..n-1 each ran exactly once, on the loop, and returns
// their errors.
func (a *appDone) check(t *testing.T, n int) []error {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	errs := make([]error, n)
	for k := 0; k < n; k++ {
		if a.calls[k] != 1 {
			t.Errorf("callback %d ran %d times, want exactly once", k, a.calls[k])
		}
		errs[k] = a.errs[k]
	}
	if len(a.calls) != n {
		t.Errorf("%d callbacks ran, want %d", len(a.calls), n)
	}
	if a.off != 0 {
		t.Errorf("%d callbacks ran off the connection's queue goroutine", a.off)
	}
	return errs
}

func (a *appDone) waitN(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		recvEvent(t, a.ch, fmt.Sprintf("SendBytes callback %d of %d", i+1, n))
	}
}

// TestSendBytesOrder: SendBytes interleaved with Send (a header in a pool buffer),
// SendData (the request itself, forwarded) and Write (a trailer) arrives in call order,
// every byte checked. Each callback runs exactly once, on the loop, and only once the
// kernel is done with the bytes: the callback scribbles over its slice, so a callback that
// ran early would show as scribbles at the peer.
func TestSendBytesOrder(t *testing.T) { forSendBytesConfigs(t, testSendBytesOrder) }

func testSendBytesOrder(t *testing.T, cfg Config) {
	cfg.MaxQueuedBytes = 64 << 20
	e := newEngine(t, cfg)
	sizes := []int{1, 17, 4096, 70000, 300000, 333}
	const reqs = 60
	var mu sync.Mutex
	var want bytes.Buffer
	dones := newAppDone()
	sent, made := 0, 0 // bytes and calls of SendBytes (under mu)
	var errsMu sync.Mutex
	var callErrs []error
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		i := 0
		return HandlerFuncs{
			Data: func(c *Conn, d Data) {
				mu.Lock()
				defer mu.Unlock()
				fail := func(err error) {
					errsMu.Lock()
					callErrs = append(callErrs, err)
					errsMu.Unlock()
				}
				hdr := fmt.Appendf(nil, "<%d:%d>", i, d.Len())
				b, err := c.Buffer()
				if err != nil {
					fail(err)
					return
				}
				copy(b.Bytes(), hdr)
				if err := c.Send(b, len(hdr)); err != nil {
					fail(err)
				}
				want.Write(hdr)
				want.Write(d.Bytes())
				if err := c.SendData(d); err != nil {
					fail(err)
				}
				body := make([]byte, sizes[i%len(sizes)])
				for j := range body {
					body[j] = byte(i + j*7 + j>>9)
				}
				want.Write(body)
				if err := c.SendBytes(body, dones.fn(c, i, func(err error) {
					for j := range body {
						body[j] = 0xEE // the kernel is done: the application may write
					}
				})); err != nil {
					fail(err)
				} else {
					made++
				}
				sent += len(body)
				if _, err := c.Write([]byte("|")); err != nil {
					fail(err)
				}
				want.WriteByte('|')
				i++
			},
			EOF: func(c *Conn, err error) { c.Close() },
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s := dialPlain(t, l.Addr().String())
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(sockReader{s})
		got <- b
	}()
	for i := 0; i < reqs; i++ {
		msg := bytes.Repeat([]byte{byte('a' + i%26)}, 1+i*37%3000)
		if _, err := s.Write(msg); err != nil {
			t.Fatal(err)
		}
		if i%8 == 0 {
			time.Sleep(time.Millisecond) // let some requests arrive alone, others together
		}
	}
	if err := s.Shutdown(syscall.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	b := recvEvent(t, got, "the peer's read to EOF")
	mu.Lock()
	w := want.Bytes()
	mu.Unlock()
	if !bytes.Equal(b, w) {
		i := 0
		for i < min(len(b), len(w)) && b[i] == w[i] {
			i++
		}
		t.Fatalf("the peer got %d bytes, want %d; first difference at %d", len(b), len(w), i)
	}
	errsMu.Lock()
	for _, err := range callErrs {
		t.Errorf("a send call failed: %v", err)
	}
	errsMu.Unlock()
	waitAppHeld(t, e)
	mu.Lock()
	calls, total := made, sent
	mu.Unlock()
	for _, err := range dones.check(t, calls) {
		if err != nil {
			t.Errorf("callback error %v, want nil (every byte sent)", err)
		}
	}
	if st := e.Stats(); st.Send.BytesApp != uint64(total) {
		t.Errorf("Stats.Send.BytesApp = %d, want %d", st.Send.BytesApp, total)
	}
	switch copied := e.Stats().Send.BytesAppCopied; {
	case cfg.Backend == BackendShim && copied != uint64(total):
		t.Errorf("BytesAppCopied = %d on the shim, want all %d", copied, total)
	case cfg.Backend != BackendShim && copied != 0:
		t.Errorf("BytesAppCopied = %d on %v, want 0 (every callback given)", copied, cfg.Backend)
	}
	runtime.GC() // a Pinner left pinned and unreachable panics in its finalizer
}

// sockReader is a tcpglue.Socket as an io.Reader.
type sockReader struct{ s *tcpglue.Socket }

func (r sockReader) Read(p []byte) (int, error) { return r.s.Read(p) }

// stuckPeer accepts one connection on e whose peer does not read (small buffers on both
// sides), and returns it with its events and the peer.
func stuckPeer(t *testing.T, e *Engine) (*Conn, *peerEvents, *tcpglue.Socket) {
	t.Helper()
	l, ev := listenEvents(t, e)
	s := smallRecvBuf(t, l.Addr().String())
	c := recvEvent(t, ev.conn, "accept")
	if err := c.Socket(func(s *tcpglue.Socket) error { _, err := s.SetSendBuffer(4096); return err }); err != nil {
		t.Fatal(err)
	}
	return c, ev, s
}

func pattern(n, seed int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(seed + i*31 + i>>10)
	}
	return p
}

// TestSendBytesDoneAfterKernel: while the peer does not read, the kernel holds the bytes
// and the callback does not run; once the peer reads everything, it runs exactly once
// with nil, and the peer has every byte.
func TestSendBytesDoneAfterKernel(t *testing.T) { forSendBytesConfigs(t, testSendBytesDoneAfterKernel) }

func testSendBytesDoneAfterKernel(t *testing.T, cfg Config) {
	cfg.MaxQueuedBytes = 16 << 20
	e := newEngine(t, cfg)
	c, _, s := stuckPeer(t, e)
	p := pattern(2<<20, 5)
	orig := bytes.Clone(p)
	dones := newAppDone()
	if err := c.SendBytes(p, dones.fn(c, 0, nil)); err != nil {
		t.Fatal(err)
	}
	// The peer reads nothing: the kernel cannot have taken 2 MiB into 4 KiB buffers.
	time.Sleep(200 * time.Millisecond)
	select {
	case <-dones.ch:
		t.Fatalf("the callback ran while the peer had read nothing (%d of %d bytes could have left)", 0, len(p))
	default:
	}
	if q := c.Queued(); q == 0 {
		t.Fatalf("Queued = 0 with the peer reading nothing")
	}
	got := make([]byte, 0, len(p))
	buf := make([]byte, 64<<10)
	for len(got) < len(p) {
		n, err := s.Read(buf)
		if err != nil {
			t.Fatalf("peer read after %d bytes: %v", len(got), err)
		}
		got = append(got, buf[:n]...)
	}
	dones.waitN(t, 1)
	if errs := dones.check(t, 1); errs[0] != nil {
		t.Fatalf("callback error %v, want nil", errs[0])
	}
	if !bytes.Equal(got, orig) {
		t.Fatal("the peer's bytes differ from what was sent")
	}
	waitAppHeld(t, e)
}

// TestSendBytesVectored: a header in a send buffer and a body sent from application memory,
// queued in one round of the loop, leave in one copying send (SENDMSG, writev).
func TestSendBytesVectored(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		e := newEngine(t, Config{Backend: be, SendPath: SendCopy})
		l, ev := listenEvents(t, e)
		s := dialPlain(t, l.Addr().String())
		c := recvEvent(t, ev.conn, "accept")
		body := pattern(48<<10, 9)
		dones := newAppDone()
		before := c.Stats().SendOps
		errc := make(chan error, 1)
		if err := c.Post(func() {
			b, err := c.Buffer()
			if err == nil {
				copy(b.Bytes(), "HDR:")
				err = c.Send(b, 4)
			}
			if err == nil {
				err = c.SendBytes(body, dones.fn(c, 0, nil))
			}
			errc <- err
		}); err != nil {
			t.Fatal(err)
		}
		if err := recvEvent(t, errc, "the sends"); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4+len(body))
		if _, err := io.ReadFull(sockReader{s}, got); err != nil {
			t.Fatal(err)
		}
		if string(got[:4]) != "HDR:" || !bytes.Equal(got[4:], body) {
			t.Fatal("the peer's bytes differ")
		}
		dones.waitN(t, 1)
		if ops := c.Stats().SendOps - before; ops != 1 {
			t.Fatalf("the header and the body took %d send operations, want 1", ops)
		}
	})
}

// TestSendBytesCloseInFlight: owned sends queued or in the kernel when the connection ends
// each get their callback exactly once, with an error that says what ended it, and what
// was not sent is counted; no slice stays pinned.
func TestSendBytesCloseInFlight(t *testing.T) {
	forSendBytesConfigs(t, func(t *testing.T, cfg Config) {
		t.Run("reset", func(t *testing.T) { testSendBytesReset(t, cfg) })
		t.Run("closeTimeout", func(t *testing.T) { testSendBytesCloseTimeout(t, cfg) })
		t.Run("engineClose", func(t *testing.T) { testSendBytesEngineClose(t, cfg, false) })
		t.Run("engineCloseContext", func(t *testing.T) { testSendBytesEngineClose(t, cfg, true) })
	})
}

// queueStuck queues n owned sends of size bytes each on c, whose peer does not read.
func queueStuck(t *testing.T, c *Conn, dones *appDone, n, size int) int {
	t.Helper()
	total := 0
	for k := 0; k < n; k++ {
		if err := c.SendBytes(pattern(size, k), dones.fn(c, k, nil)); err != nil {
			t.Fatal(err)
		}
		total += size
	}
	return total
}

func testSendBytesReset(t *testing.T, cfg Config) {
	cfg.MaxQueuedBytes = 16 << 20
	e := newEngine(t, cfg)
	c, ev, s := stuckPeer(t, e)
	dones := newAppDone()
	const n = 8
	queueStuck(t, c, dones, n, 256<<10)
	time.Sleep(50 * time.Millisecond) // the first send is in the kernel, the rest queued
	if err := s.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	s.Close() // a RST
	closeErr := recvEvent(t, ev.closed, "OnClose")
	if closeErr == nil {
		t.Fatal("OnClose nil after the peer's reset with 2 MiB queued")
	}
	dones.waitN(t, n)
	errs := dones.check(t, n)
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, ErrClosed) {
				t.Errorf("callback error %v does not say the connection was reset", err)
			}
		}
	}
	if failed == 0 {
		t.Fatal("every callback said nil after a reset with 2 MiB unread")
	}
	if d := c.Stats().BytesDropped; d == 0 {
		t.Error("BytesDropped = 0 after a reset with owned sends queued")
	}
	waitAppHeld(t, e)
}

func testSendBytesCloseTimeout(t *testing.T, cfg Config) {
	cfg.MaxQueuedBytes = 16 << 20
	cfg.CloseTimeout = 100 * time.Millisecond
	e := newEngine(t, cfg)
	c, ev, s := stuckPeer(t, e)
	dones := newAppDone()
	const n = 6
	total := queueStuck(t, c, dones, n, 128<<10)
	silence(t, s.Fd()) // a silent peer: the close gives up after CloseTimeout
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	closeErr := recvEvent(t, ev.closed, "OnClose")
	var te *CloseTimeoutError
	if !errors.As(closeErr, &te) {
		t.Fatalf("OnClose = %v, want a *CloseTimeoutError", closeErr)
	}
	dones.waitN(t, n)
	errs := dones.check(t, n)
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			if !errors.Is(err, ErrCloseTimeout) && !errors.Is(err, ErrClosed) {
				t.Errorf("callback error %v does not match ErrClosed", err)
			}
		}
	}
	if failed == 0 {
		t.Fatal("every callback said nil though the close gave up")
	}
	if te.Unsent <= 0 || te.Unsent > total {
		t.Errorf("Unsent = %d of %d", te.Unsent, total)
	}
	waitAppHeld(t, e)
	if err := e.Close(); err != nil {
		t.Logf("Engine.Close: %v", err)
	}
	if a := dones.check(t, n); len(a) != n {
		t.Fatal("callbacks changed")
	}
}

func testSendBytesEngineClose(t *testing.T, cfg Config, withCtx bool) {
	cfg.MaxQueuedBytes = 16 << 20
	cfg.CloseTimeout = 100 * time.Millisecond
	e, err := New(withQueues(cfg))
	if err != nil {
		t.Fatal(err)
	}
	c, _, s := stuckPeer(t, e)
	dones := newAppDone()
	const n = 6
	queueStuck(t, c, dones, n, 128<<10)
	silence(t, s.Fd())
	if withCtx {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		err = e.CloseContext(ctx)
	} else {
		err = e.Close()
	}
	if err == nil {
		t.Fatal("Engine.Close returned nil with owned bytes unsent to a silent peer")
	}
	// Every callback ran before Close returned.
	errs := dones.check(t, n)
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			if !errors.Is(err, ErrClosed) {
				t.Errorf("callback error %v does not match ErrClosed", err)
			}
		}
	}
	if failed == 0 {
		t.Fatal("every callback said nil though the engine closed with the bytes unsent")
	}
	if h := e.shareCtr.appHeld.Load(); h != 0 {
		t.Fatalf("%d slices still pinned after Engine.Close", h)
	}
	runtime.GC()
}

// withQueues is cfg with newEngine's small defaults, for tests that close the engine
// themselves.
func withQueues(cfg Config) Config {
	if cfg.Queues == 0 {
		cfg.Queues = 2
	}
	if cfg.SendBufs == 0 {
		cfg.SendBufs = 64
	}
	if cfg.RecvBufs == 0 {
		cfg.RecvBufs = 64
	}
	return cfg
}

// TestSendBytesMisuse: bad calls are refused with typed errors, queue nothing, never call
// the callback and pin nothing.
func TestSendBytesMisuse(t *testing.T) { forSendBytesConfigs(t, testSendBytesMisuse) }

func testSendBytesMisuse(t *testing.T, cfg Config) {
	e := newEngine(t, cfg)
	l, ev := listenEvents(t, e)
	s := dialPlain(t, l.Addr().String())
	_ = s
	c := recvEvent(t, ev.conn, "accept")
	called := atomic.Int32{}
	done := func(error) { called.Add(1) }
	if err := c.SendBytes(nil, done); !errors.Is(err, ErrEmpty) {
		t.Errorf("SendBytes(nil) = %v, want ErrEmpty", err)
	}
	if err := c.SendBytes([]byte{}, done); !errors.Is(err, ErrEmpty) {
		t.Errorf("SendBytes(empty) = %v, want ErrEmpty", err)
	}
	// 1 GiB + 1 of address space, never touched (refused before any read): PROT_NONE
	// pages, no memory behind them.
	huge, err := unix.Mmap(-1, 0, maxAppSend+1, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(huge)
	if err := c.SendBytes(huge, done); !errors.Is(err, ErrTooLarge) {
		t.Errorf("SendBytes(1 GiB + 1) = %v, want ErrTooLarge", err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := c.SendBytes([]byte("x"), done); !errors.Is(err, ErrClosed) {
		t.Errorf("SendBytes after CloseWrite = %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.SendBytes([]byte("x"), done); !errors.Is(err, ErrClosed) {
		t.Errorf("SendBytes after Close = %v, want ErrClosed", err)
	}
	recvEvent(t, ev.closed, "OnClose")
	if err := c.SendBytes([]byte("x"), done); !errors.Is(err, ErrClosed) {
		t.Errorf("SendBytes after OnClose = %v, want ErrClosed", err)
	}
	if n := called.Load(); n != 0 {
		t.Errorf("refused sends called their callback %d times", n)
	}
	if h := e.shareCtr.appHeld.Load(); h != 0 {
		t.Errorf("%d slices pinned after refused sends", h)
	}
	var oe *OpError
	if err := c.SendBytes(nil, nil); !errors.As(err, &oe) || oe.Op != "send" {
		t.Errorf("SendBytes error %v is not a *OpError with Op send", err)
	}
}

// TestSendBytesDebugWriteBeforeDone: under Config.Debug.Buffers, writing a slice passed
// to SendBytes before its callback ran is reported as a *MisuseError.
func TestSendBytesDebugWriteBeforeDone(t *testing.T) {
	forSendBytesConfigs(t, func(t *testing.T, cfg Config) {
		misuse := make(chan error, 16)
		cfg.Debug = DebugOptions{Buffers: true, OnMisuse: func(err error) { misuse <- err }}
		cfg.MaxQueuedBytes = 16 << 20
		e := newEngine(t, cfg)
		c, _, s := stuckPeer(t, e)
		p := pattern(1<<20, 3)
		dones := newAppDone()
		if err := c.SendBytes(p, dones.fn(c, 0, nil)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		p[len(p)-1] ^= 0xFF // the misuse: the kernel still holds p
		got := 0
		buf := make([]byte, 64<<10)
		for got < len(p) {
			n, err := s.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
		dones.waitN(t, 1)
		err := recvEvent(t, misuse, "the misuse report")
		var me *MisuseError
		if !errors.As(err, &me) || me.Kind != "write before SendBytes' done" {
			t.Fatalf("OnMisuse got %v, want a *MisuseError of kind \"write before SendBytes' done\"", err)
		}
		if n := e.Stats().Debug.Misuses; n != 1 {
			t.Errorf("Stats.Debug.Misuses = %d, want 1", n)
		}
	})
}

// TestSendBytesCallbackPanics: a panicking callback is recovered and counted, and closes
// only its connection.
func TestSendBytesCallbackPanics(t *testing.T) {
	e := newEngine(t, Config{Backend: BackendIOUring})
	l, ev := listenEvents(t, e)
	s := dialPlain(t, l.Addr().String())
	c := recvEvent(t, ev.conn, "accept")
	if err := c.SendBytes([]byte("boom"), func(error) { panic("app bug") }); err != nil {
		t.Fatal(err)
	}
	err := recvEvent(t, ev.closed, "OnClose")
	var pe *PanicError
	if !errors.As(err, &pe) || pe.Method != "SendBytes callback" {
		t.Fatalf("OnClose = %v, want a *PanicError of the callback", err)
	}
	if n := e.Stats().Faults.HandlerPanics; n != 1 {
		t.Errorf("HandlerPanics = %d, want 1", n)
	}
	b := make([]byte, 8)
	n, _ := s.Read(b)
	if string(b[:n]) != "boom" {
		t.Errorf("peer got %q, want the bytes sent before the panic", b[:n])
	}
	waitAppHeld(t, e)
}

// TestSendBytesSlowCallback: a SendBytes callback runs on the queue goroutine like a
// handler, so Config.Debug.SlowHandler times it too: one that blocks is counted and
// reported as a slow handler (it was not: a new user's blocking callback went unseen).
func TestSendBytesSlowCallback(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		m := &misuses{}
		e := debugEngine(t, DebugOptions{SlowHandler: 5 * time.Millisecond}, m, be)
		c, peer := dialPeer(t, e, HandlerFuncs{})
		done := make(chan error, 1)
		if err := c.SendBytes([]byte("slow"), func(err error) {
			time.Sleep(20 * time.Millisecond) // blocks its queue: the misuse
			done <- err
		}); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 4)
		if _, err := io.ReadFull(peer, b); err != nil || string(b) != "slow" {
			t.Fatalf("peer read %q, %v", b, err)
		}
		if err := recvEvent(t, done, "the callback"); err != nil {
			t.Fatalf("callback error %v, want nil", err)
		}
		testutil.Eventually(t, "the slow callback counted", func() bool { return e.Stats().Debug.SlowHandlerCalls > 0 })
		testutil.Eventually(t, "the slow callback reported", func() bool { return m.has("slow handler") })
		// Another call may overrun the threshold on a loaded machine too: look for this one.
		m.mu.Lock()
		var details []string
		named := false
		for _, me := range m.errs {
			details = append(details, me.Detail)
			named = named || strings.Contains(me.Detail, "SendBytes callback")
		}
		m.mu.Unlock()
		if !named {
			t.Errorf("no report names the SendBytes callback: %q", details)
		}
		c.Close()
		<-c.Done()
		waitAppHeld(t, e)
	})
}

// TestSendBytesHeadersShareABuffer: Writes (headers) and SendBytes (bodies) in turn, in one
// round of the loop, use one send buffer for all the headers (Write's staging buffer stays
// open across the flushes each SendBytes makes), small bodies given without a callback are
// copied behind the headers (BytesAppCopied), large ones are sent from their slices; the
// peer gets every byte in order.
func TestSendBytesHeadersShareABuffer(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		e := newEngine(t, Config{Backend: be, Queues: 1, SendPath: SendCopy})
		l, ev := listenEvents(t, e)
		s := dialPlain(t, l.Addr().String())
		c := recvEvent(t, ev.conn, "accept")
		var want bytes.Buffer
		small, large := 0, 0
		type res struct {
			inUse int
			err   error
		}
		rc := make(chan res, 1)
		if err := c.Post(func() {
			q := c.q
			free := q.send.Free()
			for i := 0; i < 40; i++ {
				hdr := fmt.Appendf(nil, "[%d]", i)
				if _, err := c.Write(hdr); err != nil {
					rc <- res{err: err}
					return
				}
				want.Write(hdr)
				n := 100 + i
				if i%2 == 1 {
					n = 8<<10 + i
				}
				body := pattern(n, i)
				if err := c.SendBytes(body, nil); err != nil {
					rc <- res{err: err}
					return
				}
				want.Write(body)
				if n <= appCopyMax {
					small += n
				} else {
					large += n
				}
			}
			rc <- res{inUse: free - q.send.Free()}
		}); err != nil {
			t.Fatal(err)
		}
		r := recvEvent(t, rc, "the sends")
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.inUse != 1 {
			t.Errorf("40 headers took %d send buffers, want 1", r.inUse)
		}
		got := make([]byte, want.Len())
		if _, err := io.ReadFull(sockReader{s}, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatal("the peer's bytes differ")
		}
		waitAppHeld(t, e)
		st := e.Stats().Send
		if st.BytesAppCopied != uint64(small) || st.BytesApp != uint64(small+large) {
			t.Errorf("BytesApp %d, BytesAppCopied %d; want %d, %d", st.BytesApp, st.BytesAppCopied, small+large, small)
		}
		waitSendBuffersBack(t, e)
	})
}

// TestSendBytesAfterStop: a zero-copy send whose notification never came before the queue
// stopped (made here by hand: loopback always delivers them first) keeps its slice pinned
// until the ring is closed; then (loop.Queue.AfterStop) its callback runs, exactly once, and
// nothing stays pinned.
func TestSendBytesAfterStop(t *testing.T) {
	e, err := New(withQueues(Config{Backend: BackendIOUring, Queues: 1, CloseTimeout: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	l, ev := listenEvents(t, e)
	dialPlain(t, l.Addr().String())
	c := recvEvent(t, ev.conn, "accept")
	dones := newAppDone()
	ran := make(chan struct{})
	if err := c.Post(func() {
		// What zcCompleted leaves of a SEND_ZC that took every byte and whose
		// notification is still to come.
		p := pattern(4096, 1)
		a := appMemPool.Get().(*appMem)
		a.p, a.done = p, dones.fn(c, 0, nil)
		a.pin.Pin(&p[0])
		e.shareCtr.appHeld.Add(1)
		s := appSeg(a)
		s.off = s.n
		c.txLocked()
		c.tx.zwait = append(c.tx.zwait, zcWait{ud: 1<<62 + 7, s: s, sent: int(s.n), done: true, notif: true})
		close(ran)
	}); err != nil {
		t.Fatal(err)
	}
	<-ran
	l.Close()
	e.Close()
	if errs := dones.check(t, 1); errs[0] != nil {
		t.Errorf("callback error %v, want nil (every byte was taken)", errs[0])
	}
	if h := e.shareCtr.appHeld.Load(); h != 0 {
		t.Fatalf("%d slices pinned after Engine.Close", h)
	}
}
