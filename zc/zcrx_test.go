package zc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/internal/zcrx"
	"github.com/zcnet/zcnet/memreg"
)

// The RecvZcrx tests run everywhere: on a kernel with device-less zcrx (Linux 7.1+, the 7.3
// guest of make vmtest) as root they demand that every byte arrives through zcrx; elsewhere
// (this 6.18 host) they demand the visible fallback to the ring, and the same data checks.

// zcrxExpected reports whether RecvZcrx must really receive through zcrx here. A kernel that
// is new enough and still refuses fails the test.
func zcrxExpected(t testing.TB) bool {
	t.Helper()
	err := zcrxProbe()
	if os.Geteuid() != 0 {
		return false // registration needs CAP_NET_ADMIN: the fallback is expected
	}
	if err == nil {
		return true
	}
	if testutil.KernelAtLeast("7.1") {
		t.Fatalf("kernel is at least 7.1 but device-less zcrx is refused: %v", err)
	}
	return false
}

// zcrxPattern is the byte at stream offset i of the test streams.
func zcrxPattern(i int) byte { return byte(i*31 + i>>11 + 7) }

// writePattern writes total bytes of zcrxPattern with Write, in chunks of up to 64 KiB.
func writePattern(t testing.TB, c *Conn, total int) {
	t.Helper()
	buf := make([]byte, 64<<10)
	for off := 0; off < total; {
		n := min(len(buf), total-off)
		for i := 0; i < n; i++ {
			buf[i] = zcrxPattern(off + i)
		}
		if _, err := c.Write(buf[:n]); err != nil {
			t.Errorf("write at %d: %v", off, err)
			return
		}
		off += n
	}
}

// checkPattern reports the first byte of p (at stream offset off) that is not zcrxPattern.
func checkPattern(p []byte, off int) error {
	for i, b := range p {
		if b != zcrxPattern(off+i) {
			return fmt.Errorf("byte %d is %#x, want %#x", off+i, b, zcrxPattern(off+i))
		}
	}
	return nil
}

// checkZcrxStats checks that the engine's received bytes took the path this machine allows.
func checkZcrxStats(t testing.TB, e *Engine, want bool, conns uint64, bytes uint64) {
	t.Helper()
	st := e.Stats()
	if want {
		if st.Recv.ZcrxQueues != st.Queues || st.Recv.ZcrxFallbacks != 0 || st.Recv.ZcrxFallback != "" {
			t.Fatalf("zcrx expected on every queue: %d of %d queues, %d fallbacks (%s)", st.Recv.ZcrxQueues, st.Queues, st.Recv.ZcrxFallbacks, st.Recv.ZcrxFallback)
		}
		if st.Recv.BytesZcrx < bytes || st.Recv.BytesRing != 0 {
			t.Fatalf("%d bytes through zcrx (want %d), %d through the ring", st.Recv.BytesZcrx, bytes, st.Recv.BytesRing)
		}
		if st.Recv.BytesZcrxCopied != st.Recv.BytesZcrx {
			t.Fatalf("device-less: %d of %d zcrx bytes counted as copied", st.Recv.BytesZcrxCopied, st.Recv.BytesZcrx)
		}
		return
	}
	if st.Recv.ZcrxQueues != 0 || st.Recv.ZcrxFallbacks != conns || st.Recv.ZcrxFallback == "" {
		t.Fatalf("fallback expected: %d zcrx queues, %d fallbacks of %d connections, reason %q", st.Recv.ZcrxQueues, st.Recv.ZcrxFallbacks, conns, st.Recv.ZcrxFallback)
	}
	if st.Recv.BytesZcrx != 0 || st.Recv.BytesRing+st.Recv.BytesPlain < bytes {
		t.Fatalf("%d bytes through zcrx, %d through the ring (want %d)", st.Recv.BytesZcrx, st.Recv.BytesRing+st.Recv.BytesPlain, bytes)
	}
	t.Logf("fell back visibly: %s", st.Recv.ZcrxFallback)
}

// TestZcrxEcho: both engines receive with RecvZcrx; the server echoes with SendData (a copy
// out of the area); random-sized sends come back intact (SHA-256).
func TestZcrxEcho(t *testing.T) {
	want := zcrxExpected(t)
	cfg := Config{Queues: 1, RecvPath: RecvZcrx, ZcrxAreaSize: 256 << 10}
	srv, cli := newPair(t, cfg)
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const total = 4 << 20
	k := newCollector(total)
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), k.handler())
	if err != nil {
		t.Fatal(err)
	}
	sendRandomEchoed(t, c, k, total, 11, 60*time.Second)
	c.Close()
	<-c.Done()
	checkZcrxStats(t, srv, want, 1, total)
	checkZcrxStats(t, cli, want, 1, total)
	t.Logf("server %+v", srv.Stats())
}

// TestZcrxBulk: 8 MiB through an area of 256 KiB, every byte checked in place, released at
// once from the handler.
func TestZcrxBulk(t *testing.T) {
	want := zcrxExpected(t)
	srv, cli := newEngine(t, Config{Queues: 1, RecvPath: RecvZcrx, ZcrxAreaSize: 256 << 10}), newEngine(t, Config{Queues: 1})
	const total = 8 << 20
	var mu sync.Mutex
	var got int
	var bad error
	done := make(chan struct{})
	l, err := srv.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		return HandlerFuncs{
			Data: func(c *Conn, d Data) {
				mu.Lock()
				if err := checkPattern(d.Bytes(), got); err != nil && bad == nil {
					bad = err
				}
				got += d.Len()
				mu.Unlock()
				if err := d.Release(); err != nil {
					t.Error(err)
				}
			},
			EOF: func(c *Conn, err error) { c.Close(); close(done) },
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	writePattern(t, c, total)
	c.CloseWrite()
	select {
	case <-done:
	case <-time.After(120 * time.Second):
		t.Fatalf("timeout: %d of %d bytes\n%s", got, total, engineDump(srv))
	}
	mu.Lock()
	defer mu.Unlock()
	if bad != nil || got != total {
		t.Fatalf("received %d of %d bytes: %v", got, total, bad)
	}
	c.Close()
	<-c.Done()
	checkZcrxStats(t, srv, want, 1, total)
	t.Logf("server %+v", srv.Stats())
}

// heldData is a Data the test holds, with its stream offset.
type heldData struct {
	d   Data
	off int
}

// TestZcrxReleaseOrder: the handler hands every Data to another goroutine, which releases
// them in random order, in batches, after checking that none was overwritten while held;
// the area (64 KiB) is far smaller than the stream, so its buffers are reused all the time.
func TestZcrxReleaseOrder(t *testing.T) {
	want := zcrxExpected(t)
	srv := newEngine(t, Config{Queues: 1, RecvPath: RecvZcrx, ZcrxAreaSize: 64 << 10, MaxRecvHeld: 48 << 10})
	cli := newEngine(t, Config{Queues: 1})
	const total = 4 << 20
	ch := make(chan heldData, 1024)
	var off int
	l, err := srv.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		return HandlerFuncs{
			Data: func(c *Conn, d Data) {
				ch <- heldData{d, off}
				off += d.Len()
			},
			EOF: func(c *Conn, err error) { close(ch); c.Close() },
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	result := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(3, 4))
		n, stale := 0, 0
		var batch []heldData
		flush := func() error {
			rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
			for _, h := range batch {
				if err := checkPattern(h.d.Bytes(), h.off); err != nil {
					return fmt.Errorf("held data changed: %w", err)
				}
				if err := h.d.Release(); err != nil {
					return err
				}
				if stale < 8 {
					stale++
					if err := h.d.Release(); !errors.Is(err, memreg.ErrStale) {
						return fmt.Errorf("second Release = %v, want ErrStale", err)
					}
					if h.d.Bytes() != nil {
						return errors.New("a released Data still shows bytes")
					}
				}
			}
			batch = batch[:0]
			return nil
		}
		for h := range ch {
			n += h.d.Len()
			batch = append(batch, h)
			if len(batch) >= 1+rng.IntN(12) || len(ch) == 0 {
				if err := flush(); err != nil {
					result <- err
					for h := range ch {
						h.d.Release()
					}
					return
				}
			}
		}
		if err := flush(); err != nil {
			result <- err
			return
		}
		if n != total {
			result <- fmt.Errorf("received %d of %d bytes", n, total)
			return
		}
		result <- nil
	}()
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	writePattern(t, c, total)
	c.CloseWrite()
	select {
	case err := <-result:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(120 * time.Second):
		t.Fatalf("timeout\n%s", engineDump(srv))
	}
	c.Close()
	<-c.Done()
	checkZcrxStats(t, srv, want, 1, total)
	t.Logf("server %+v", srv.Stats())
}

// TestZcrxAreaExhausted: the handler keeps everything it gets, with a receive credit larger
// than the area (16 pages): receiving stops when the area is full (the kernel ends the
// request with ENOMEM, the connection waits), nothing is lost or overwritten, and releasing
// the held buffers lets it go on, round after round.
func TestZcrxAreaExhausted(t *testing.T) {
	want := zcrxExpected(t)
	const area = 64 << 10
	srv := newEngine(t, Config{Queues: 1, RecvPath: RecvZcrx, ZcrxAreaSize: area, MaxRecvHeld: 4 << 20})
	cli := newEngine(t, Config{Queues: 1})
	const total = 1 << 20
	var mu sync.Mutex
	var held []heldData
	var got, heldBytes int
	l, err := srv.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		return HandlerFuncs{
			Data: func(c *Conn, d Data) {
				mu.Lock()
				held = append(held, heldData{d, got})
				got += d.Len()
				heldBytes += int(d.credit())
				mu.Unlock()
			},
			EOF: func(c *Conn, err error) { c.Close() },
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	go writePattern(t, c, total)
	rounds := 0
	lastStalls := uint64(0)
	deadline := time.Now().Add(120 * time.Second)
	for {
		time.Sleep(5 * time.Millisecond)
		st := srv.Stats()
		mu.Lock()
		n, hb := got, heldBytes
		if want && hb > area {
			mu.Unlock()
			t.Fatalf("the handler holds %d bytes of a %d-byte area", hb, area)
		}
		// Release when the area is exhausted (zcrx) or, through the ring, every 256 KiB.
		if (want && st.Recv.ZcrxAreaStalls > lastStalls) || (!want && hb >= 256<<10) || n == total {
			for _, h := range held {
				if err := checkPattern(h.d.Bytes(), h.off); err != nil {
					mu.Unlock()
					t.Fatalf("held data changed: %v", err)
				}
				h.d.Release()
			}
			held, heldBytes = held[:0], 0
			lastStalls = st.Recv.ZcrxAreaStalls
			rounds++
		}
		mu.Unlock()
		if n == total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timeout: %d of %d bytes, %d rounds\n%s", n, total, rounds, engineDump(srv))
		}
	}
	st := srv.Stats()
	if want && st.Recv.ZcrxAreaStalls == 0 {
		t.Fatalf("the area never ran out: %+v", st)
	}
	t.Logf("%d rounds, %d area stalls", rounds, st.Recv.ZcrxAreaStalls)
	c.Close()
	<-c.Done()
	checkZcrxStats(t, srv, want, 1, total)
}

// TestZcrxCloseWithBuffersHeld: the server connection closes, then the engine, while its
// handler holds received Data: the bytes stay readable and intact, Release works once
// (then ErrStale), and the area goes away after the last release (the leak check sees it).
func TestZcrxCloseWithBuffersHeld(t *testing.T) {
	want := zcrxExpected(t)
	receivers := zcrx.OpenReceivers()
	srv, err := New(Config{Queues: 1, RecvPath: RecvZcrx, ZcrxAreaSize: 256 << 10, SendBufs: 8, RecvBufs: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli := newEngine(t, Config{Queues: 1})
	const total = 100 << 10
	var mu sync.Mutex
	var held []heldData
	var got int
	conns := make(chan *Conn, 1)
	l, err := srv.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		conns <- c
		return HandlerFuncs{
			Data: func(c *Conn, d Data) {
				mu.Lock()
				held = append(held, heldData{d, got})
				got += d.Len()
				mu.Unlock()
			},
			EOF: func(c *Conn, err error) { c.Close() },
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	writePattern(t, c, total)
	c.Close()
	sc := <-conns
	select {
	case <-sc.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("server connection did not close\n%s", engineDump(srv))
	}
	<-c.Done()
	mu.Lock()
	defer mu.Unlock()
	if got != total {
		t.Fatalf("received %d of %d bytes", got, total)
	}
	checkZcrxStats(t, srv, want, 1, total)
	check := func(when string, hs []heldData) {
		for _, h := range hs {
			if err := checkPattern(h.d.Bytes(), h.off); err != nil {
				t.Fatalf("%s: %v", when, err)
			}
		}
	}
	check("after the connection closed", held)
	half := held[:len(held)/2]
	rest := held[len(held)/2:]
	for _, h := range half {
		if err := h.d.Release(); err != nil {
			t.Fatal(err)
		}
		if err := h.d.Release(); !errors.Is(err, memreg.ErrStale) {
			t.Fatalf("second Release = %v", err)
		}
	}
	l.Close()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	check("after the engine closed", rest)
	if want && zcrx.OpenReceivers() == receivers {
		t.Fatal("the area went away while the application holds buffers of it")
	}
	for _, h := range rest {
		if err := h.d.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if n := zcrx.OpenReceivers(); n != receivers {
		t.Fatalf("%d zcrx receivers still open after the last release (%d before)", n, receivers)
	}
}

// TestZcrxFallbackRules: NoFallback turns an unavailable zcrx into New's typed error; a
// backend without io_uring falls back per connection, visibly, or fails with NoFallback;
// bad values are refused.
func TestZcrxFallbackRules(t *testing.T) {
	want := zcrxExpected(t)
	e, err := New(Config{Queues: 1, RecvPath: RecvZcrx, NoFallback: true, ZcrxAreaSize: 64 << 10})
	if want {
		if err != nil {
			t.Fatalf("zcrx is available, New failed: %v", err)
		}
		if st := e.Stats(); st.Recv.ZcrxQueues != 1 {
			t.Fatalf("%+v", st)
		}
		e.Close()
	} else {
		var ns *NotSupportedError
		if err == nil || !errors.As(err, &ns) || !strings.Contains(ns.What, "zcrx receive path on queue 0") {
			t.Fatalf("New with NoFallback = %v, want a *NotSupportedError for queue 0", err)
		}
		t.Log(err)
	}

	_, err = New(Config{Queues: 1, RecvPath: RecvZcrx, NoFallback: true, Backend: BackendPlain})
	var ns *NotSupportedError
	if !errors.As(err, &ns) || !strings.Contains(ns.What, "zcrx receive path on the engine") {
		t.Fatalf("plain backend with NoFallback = %v", err)
	}

	srv := newEngine(t, Config{Queues: 1, RecvPath: RecvZcrx, Backend: BackendPlain})
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cli := newEngine(t, Config{Queues: 1})
	k := newCollector(5)
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), k.handler())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("hello"))
	select {
	case <-k.done:
	case <-time.After(10 * time.Second):
		t.Fatal("timeout")
	}
	c.Close()
	<-c.Done()
	st := srv.Stats()
	if st.Recv.ZcrxFallbacks != 1 || !strings.Contains(st.Recv.ZcrxFallback, "io_uring backend") || st.Recv.BytesPlain != 5 {
		t.Fatalf("plain backend: %d fallbacks, reason %q, %d bytes", st.Recv.ZcrxFallbacks, st.Recv.ZcrxFallback, st.Recv.BytesPlain)
	}

	for _, cfg := range []Config{{RecvPath: RecvZcrx + 1}, {ZcrxAreaSize: -1}} {
		var ce *ConfigError
		if _, err := New(cfg); !errors.As(err, &ce) {
			t.Fatalf("New(%+v) = %v, want a *ConfigError", cfg, err)
		}
	}
}

// TestZcrxNICRefusal: a listener asks for a NIC RX queue on lo, which has none (hwq refuses
// before changing anything): the listener works on the queues' own path and says why; with
// NoFallback Listen fails with the reason; without RecvZcrx the option is refused.
func TestZcrxNICRefusal(t *testing.T) {
	testutil.RequireRoot(t)
	want := zcrxExpected(t)
	srv := newEngine(t, Config{Queues: 2, RecvPath: RecvZcrx, ZcrxAreaSize: 256 << 10})
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept, ListenOptions{ZcrxNIC: "lo"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Stats().ZcrxNICFallback == "" || l.Stats().ZcrxNIC != nil {
		t.Fatalf("lo got a NIC queue: binding %v, fallback %q", l.Stats().ZcrxNIC, l.Stats().ZcrxNICFallback)
	}
	t.Logf("NIC fallback: %s", l.Stats().ZcrxNICFallback)
	cli := newEngine(t, Config{Queues: 1})
	const total = 1 << 20
	k := newCollector(total)
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), k.handler())
	if err != nil {
		t.Fatal(err)
	}
	sendRandomEchoed(t, c, k, total, 5, 60*time.Second)
	c.Close()
	<-c.Done()
	checkZcrxStats(t, srv, want, 1, total)

	if _, err := newEngine(t, Config{Queues: 1}).Listen("tcp", "127.0.0.1:0", echoAccept, ListenOptions{ZcrxNIC: "lo"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("ZcrxNIC without RecvZcrx: %v", err)
	}
	if !want {
		return // a NoFallback engine cannot start here
	}
	strict := newEngine(t, Config{Queues: 1, RecvPath: RecvZcrx, NoFallback: true, ZcrxAreaSize: 64 << 10})
	_, err = strict.Listen("tcp", "127.0.0.1:0", echoAccept, ListenOptions{ZcrxNIC: "lo"})
	var ns *NotSupportedError
	if !errors.As(err, &ns) || !strings.Contains(ns.What, "zcrx receive path") {
		t.Fatalf("NoFallback listener on lo = %v, want a *NotSupportedError", err)
	}
	t.Log(err)
}

// TestZcrxForwardRetained: the server sends every Data back as two slices of it (Slice:
// further references to the area's buffer) after releasing the original, checking on the
// way that the released original is stale while its slices are not. Where zcrx is active
// the slices go out from the area itself (Stats.Send.BytesZcrxSent, nothing copied) and
// the buffers go back with the sends; the area (64 KiB, four times smaller than the
// stream's chunks) and the receive credit would run dry after a few chunks if a hold
// leaked. Every byte comes back in order.
func TestZcrxForwardRetained(t *testing.T) {
	want := zcrxExpected(t)
	srv := newEngine(t, Config{Queues: 1, RecvPath: RecvZcrx, ZcrxAreaSize: 64 << 10, MaxRecvHeld: 48 << 10})
	cli := newEngine(t, Config{Queues: 1})
	const total = 8 << 20
	misuse := make(chan error, 1)
	report := func(err error) {
		select {
		case misuse <- err:
		default:
		}
	}
	l, err := srv.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		return HandlerFuncs{
			Data: func(c *Conn, d Data) {
				parts := []Data{d}
				if k := d.Len() / 3; k > 0 {
					a, err1 := d.Slice(0, k)
					b, err2 := d.Slice(k, d.Len()-k)
					if err1 != nil || err2 != nil {
						report(fmt.Errorf("slices of %d bytes: %v, %v", d.Len(), err1, err2))
					}
					if err := d.Release(); err != nil {
						report(fmt.Errorf("release of the sliced original: %v", err))
					}
					if d.Bytes() != nil {
						report(errors.New("a released original still shows bytes"))
					}
					if _, err := d.Retain(); !errors.Is(err, memreg.ErrStale) {
						report(fmt.Errorf("Retain of a released original = %v, want ErrStale", err))
					}
					if err := d.Release(); !errors.Is(err, memreg.ErrStale) {
						report(fmt.Errorf("second Release = %v, want ErrStale", err))
					}
					parts = []Data{a, b}
				}
				for _, p := range parts {
					if err := c.SendData(p); err != nil {
						report(fmt.Errorf("SendData: %v", err))
						p.Release()
					}
				}
			},
			EOF: func(c *Conn, err error) { c.CloseWrite() },
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, 1)
	got := 0
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{
		Data: func(c *Conn, d Data) {
			if err := checkPattern(d.Bytes(), got); err != nil {
				select {
				case done <- err:
				default:
				}
			}
			got += d.Len()
			d.Release()
		},
		EOF: func(c *Conn, err error) {
			if got != total {
				err = fmt.Errorf("got %d of %d bytes back (%v)", got, total, err)
			} else {
				err = nil
			}
			select {
			case done <- err:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() { writePattern(t, c, total); c.CloseWrite() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(120 * time.Second):
		t.Fatalf("timeout after %d of %d bytes\n%s", got, total, engineDump(srv))
	}
	select {
	case err := <-misuse:
		t.Fatal(err)
	default:
	}
	c.Close()
	<-c.Done()
	checkZcrxStats(t, srv, want, 1, total)
	st := srv.Stats().Send
	if want && (st.BytesZcrxSent != total || st.BytesDataCopied != 0) {
		t.Fatalf("zcrx active: %d bytes sent from the area, %d copied; want %d and 0", st.BytesZcrxSent, st.BytesDataCopied, total)
	}
	if !want && st.BytesZcrxSent != 0 {
		t.Fatalf("ring fallback: %d bytes counted as sent from a zcrx area", st.BytesZcrxSent)
	}
	t.Logf("server send %+v", st)
}
