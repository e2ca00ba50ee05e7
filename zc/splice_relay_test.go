package zc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Tests of Relay's splice path (RelaySplice): every byte checked both ways, half-close,
// slow readers, resets, Engine.Close mid-relay, and demanded paths that cannot be taken.

// spliceEnv is a relay engine in front of a Go net backend.
type spliceEnv struct {
	t       *testing.T
	e       *Engine
	l       *Listener
	backend net.Listener
	opts    RelayOptions
	stats   chan *RelayStats
	errs    chan error
	hook    atomic.Pointer[func(front, back *Conn)] // runs once a relay started
}

// newSpliceEnv starts a relay engine whose accept function dials the backend and relays
// with opts; serve runs per backend connection.
func newSpliceEnv(t *testing.T, cfg Config, opts RelayOptions, serve func(c *net.TCPConn)) *spliceEnv {
	t.Helper()
	s := &spliceEnv{t: t, e: newEngine(t, cfg), opts: opts, stats: make(chan *RelayStats, 1024), errs: make(chan error, 1024)}
	var err error
	if s.backend, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.backend.Close() })
	go func() {
		for {
			c, err := s.backend.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c.(*net.TCPConn))
			}()
		}
	}()
	baddr := s.backend.Addr().String()
	s.l, err = s.e.Listen("tcp", "127.0.0.1:0", func(front *Conn) Handler {
		front.SetReceivePaused(true)
		err := s.e.DialAsync(context.Background(), "tcp", baddr, HandlerFuncs{}, func(back *Conn, err error) {
			if err != nil {
				front.Close()
				s.errs <- err
				return
			}
			rs, err := Relay(front, back, s.opts)
			if err != nil {
				s.errs <- err
				return
			}
			if h := s.hook.Load(); h != nil {
				(*h)(front, back)
			}
			s.stats <- rs
		})
		if err != nil {
			s.errs <- err
		}
		return HandlerFuncs{}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.l.Close() })
	return s
}

func (s *spliceEnv) addr() string { return s.l.Addr().String() }

// checkStream reads r to EOF and compares it with n bytes of the stream seeded with seed.
func checkStream(r io.Reader, seed uint64, n int64) error {
	got, err := checkPrefix(r, seed)
	if err != nil {
		return fmt.Errorf("%w (want %d bytes)", err, n)
	}
	if got != n {
		return fmt.Errorf("EOF after %d of %d bytes", got, n)
	}
	return nil
}

// writeStream writes n bytes of the stream seeded with seed.
func writeStream(w io.Writer, seed uint64, n int64) error {
	g := newStreamGen(seed)
	buf := make([]byte, 256<<10)
	for n > 0 {
		k := int(min(n, int64(len(buf))))
		g.fill(buf[:k])
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		n -= int64(k)
	}
	return nil
}

// streamServe is a backend that reads the client's stream (seed from its first 8 bytes) and
// answers with its own, both checked, both ways at once.
func streamServe(perConn int64) func(c *net.TCPConn) {
	return func(c *net.TCPConn) {
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		id, _ := strconv.ParseUint(strings.TrimSpace(string(hdr[:])), 10, 64)
		done := make(chan error, 1)
		go func() { done <- checkStream(c, 2*id, perConn) }()
		if err := writeStream(c, 2*id+1, perConn); err != nil {
			return
		}
		c.CloseWrite()
		if err := <-done; err != nil {
			c.Write([]byte("!")) // too late to matter: the client sees its answer short
		}
	}
}

// runSpliceClients runs n clients through the relay, perConn bytes each way, every byte
// checked.
func runSpliceClients(t *testing.T, addr string, n int, perConn int64) {
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			id := uint64(i + 1)
			if _, err := fmt.Fprintf(c, "%-8d", id); err != nil {
				errs <- err
				return
			}
			werr := make(chan error, 1)
			go func() {
				err := writeStream(c, 2*id, perConn)
				c.(*net.TCPConn).CloseWrite()
				werr <- err
			}()
			if err := checkStream(c, 2*id+1, perConn); err != nil {
				errs <- fmt.Errorf("client %d: answer: %w", id, err)
			}
			if err := <-werr; err != nil {
				errs <- fmt.Errorf("client %d: upload: %w", id, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestRelaySpliceBytes(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		for _, tc := range []struct {
			conns   int
			perConn int64
		}{{8, 8 << 20}, {64, 2 << 20}} {
			t.Run(fmt.Sprintf("%dx%dMiB", tc.conns, tc.perConn>>20), func(t *testing.T) {
				s := newSpliceEnv(t, Config{Backend: be, Queues: 2}, RelayOptions{Path: RelaySplice, PipeSize: 256 << 10},
					streamServe(tc.perConn))
				runSpliceClients(t, s.addr(), tc.conns, tc.perConn)
				s.checkRelays(t, tc.conns, tc.perConn+8, tc.perConn)
			})
		}
	})
}

// checkRelays waits for n relays to finish and checks their counters (atob: client →
// backend bytes, btoa: backend → client).
func (s *spliceEnv) checkRelays(t *testing.T, n int, atob, btoa int64) {
	t.Helper()
	for range n {
		var rs *RelayStats
		select {
		case rs = <-s.stats:
		case err := <-s.errs:
			t.Fatalf("relay: %v", err)
		case <-time.After(time.Minute):
			t.Fatal("relay not started")
		}
		deadline := time.Now().Add(time.Minute)
		for !rs.Finished() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if !rs.Finished() {
			t.Fatalf("relay not finished: %d/%d bytes", rs.AtoB.Load(), rs.BtoA.Load())
		}
		want := RelaySplice
		if s.opts.Path == RelaySendData {
			want = RelaySendData
		}
		if rs.Path != want {
			t.Errorf("path %v (fallback %v), want %v", rs.Path, rs.Fallback, want)
		}
		if got := int64(rs.AtoB.Load()); got != atob {
			t.Errorf("AtoB %d, want %d", got, atob)
		}
		if got := int64(rs.BtoA.Load()); got != btoa {
			t.Errorf("BtoA %d, want %d", got, btoa)
		}
		// Bytes the backend connection received before the relay took over (its receive is
		// armed before DialAsync's done runs) went by SendData; the bulk must be spliced.
		sa, sb := rs.SplicedAtoB.Load(), rs.SplicedBtoA.Load()
		if want == RelaySendData {
			if sa+sb != 0 {
				t.Errorf("SendData relay spliced %d/%d bytes", sa, sb)
			}
			continue
		}
		if sa > rs.AtoB.Load() || sb > rs.BtoA.Load() || 2*(sa+sb) < rs.AtoB.Load()+rs.BtoA.Load() {
			t.Errorf("spliced %d/%d of %d/%d bytes", sa, sb, rs.AtoB.Load(), rs.BtoA.Load())
		}
	}
	st := s.e.Stats()
	if s.opts.Path != RelaySendData && (st.Forward.SpliceRelays < uint64(n) || st.Forward.BytesSpliced == 0) {
		t.Errorf("Stats: %d splice relays, %d bytes", st.Forward.SpliceRelays, st.Forward.BytesSpliced)
	}
	waitPipes(t, s.e)
}

// waitPipes waits until the engine's relays hold no pipe beyond its pool.
func waitPipes(t *testing.T, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if st := e.Stats(); st.Forward.PipesOpen <= uint64(maxPooledPipes*st.Queues) && st.Conns == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	st := e.Stats()
	t.Fatalf("%d pipes open, %d connections", st.Forward.PipesOpen, st.Conns)
}

// TestRelaySpliceHalfCloseFirst: the backend answers, half-closes, then reads an 8 MiB
// upload: every byte arrives.
func TestRelaySpliceHalfCloseFirst(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		testRelaySpliceHalfCloseFirst(t, Config{Backend: be, Queues: 2}, 8<<20)
	})
}

func testRelaySpliceHalfCloseFirst(t *testing.T, cfg Config, upload int64) {
	got := make(chan error, 1)
	s := newSpliceEnv(t, cfg, RelayOptions{}, func(c *net.TCPConn) {
		c.Write([]byte("hello"))
		c.CloseWrite()
		got <- checkStream(c, 7, upload)
	})
	c, err := net.Dial("tcp", s.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	answer, err := io.ReadAll(c)
	if string(answer) != "hello" || err != nil {
		t.Fatalf("answer %q, %v", answer, err)
	}
	if err := writeStream(c, 7, upload); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	s.checkRelays(t, 1, upload, 5)
}

// TestRelaySpliceSlowReader: one side stops reading for a while, then reads slowly, while
// the other sends 48 MiB: the writer is held back (what is in flight is bounded by the socket
// buffers on the way and the relay's pipe, about 20 MiB on loopback), and every byte arrives.
func TestRelaySpliceSlowReader(t *testing.T) {
	const n = 48 << 20
	eachBackend(t, func(t *testing.T, be Backend) {
		for _, slowSide := range []string{"client", "backend"} {
			t.Run(slowSide, func(t *testing.T) {
				var written atomic.Int64
				serveDone := make(chan error, 1)
				s := newSpliceEnv(t, Config{Backend: be, Queues: 1}, RelayOptions{PipeSize: 64 << 10}, func(c *net.TCPConn) {
					if slowSide == "client" {
						serveDone <- writeStream(&countingWriter{w: c, n: &written}, 3, n)
						c.CloseWrite()
						io.Copy(io.Discard, c)
						return
					}
					serveDone <- slowCheck(c, 3, n, &written)
				})
				c, err := net.Dial("tcp", s.addr())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				wd := time.AfterFunc(20*time.Second, func() { t.Logf("stalled?\n%s", spliceDump(s.e)) })
				defer wd.Stop()
				if slowSide == "client" {
					c.(*net.TCPConn).CloseWrite()
					if err := slowCheck(c, 3, n, &written); err != nil {
						t.Fatal(err)
					}
				} else {
					if err := writeStream(&countingWriter{w: c, n: &written}, 3, n); err != nil {
						t.Fatal(err)
					}
					c.(*net.TCPConn).CloseWrite()
					io.Copy(io.Discard, c)
				}
				if err := <-serveDone; err != nil {
					t.Fatal(err)
				}
				if slowSide == "client" {
					s.checkRelays(t, 1, 0, n)
				} else {
					s.checkRelays(t, 1, n, 0)
				}
			})
		}
	})
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.n.Add(int64(k))
	return k, err
}

// slowCheck waits while the writer fills every buffer on the way, checks that it is held
// back, then reads the stream slowly and checks it.
func slowCheck(c net.Conn, seed uint64, n int64, written *atomic.Int64) error {
	time.Sleep(300 * time.Millisecond)
	if w := written.Load(); w > 40<<20 {
		return fmt.Errorf("%d bytes written with nobody reading: the relay does not hold the writer back", w)
	}
	return checkStream(&slowReader{r: c}, seed, n)
}

type slowReader struct {
	r io.Reader
	k int
}

func (s *slowReader) Read(p []byte) (int, error) {
	s.k++
	if s.k%64 == 0 {
		time.Sleep(time.Millisecond)
	}
	return s.r.Read(p[:min(len(p), 32<<10)])
}

// TestRelaySpliceReset: the backend resets mid-relay: both relay connections close, no
// descriptor or pipe stays.
func TestRelaySpliceReset(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		s := newSpliceEnv(t, Config{Backend: be, Queues: 2}, RelayOptions{Path: RelaySplice}, func(c *net.TCPConn) {
			io.CopyN(io.Discard, c, 1<<20)
			c.SetLinger(0)
			c.Close() // RST
		})
		c, err := net.Dial("tcp", s.addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Keep writing until the relay closes us.
		errc := make(chan error, 1)
		go func() { errc <- writeStream(c, 1, 1<<30) }()
		select {
		case err := <-errc:
			if err == nil {
				t.Fatal("1 GiB went through a backend that reset after 1 MiB")
			}
		case <-time.After(time.Minute):
			t.Fatal("the client was not closed after the backend's reset")
		}
		rs := <-s.stats
		deadline := time.Now().Add(time.Minute)
		for !rs.Finished() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if !rs.Finished() {
			t.Fatal("relay connections not closed")
		}
		waitPipes(t, s.e)
	})
}

// TestRelaySpliceEngineClose: Engine.Close in the middle of 16 busy relays returns, and
// leaves no descriptor, pipe or goroutine of the relays (the package's leak check counts
// descriptors at exit).
func TestRelaySpliceEngineClose(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		fdsBefore := countFDs()
		func() {
			s := newSpliceEnv(t, Config{Backend: be, Queues: 2}, RelayOptions{}, func(c *net.TCPConn) {
				go io.Copy(io.Discard, c)
				writeStream(c, 1, 1<<30)
			})
			var wg sync.WaitGroup
			var conns []net.Conn
			for range 16 {
				c, err := net.Dial("tcp", s.addr())
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
				wg.Add(2)
				go func() { defer wg.Done(); io.Copy(io.Discard, c) }()
				go func() { defer wg.Done(); writeStream(c, 1, 1<<30) }()
			}
			for range 16 {
				<-s.stats
			}
			time.Sleep(100 * time.Millisecond)
			if st := s.e.Stats(); st.Forward.PipesOpen == 0 {
				t.Errorf("no pipes open mid-relay: %+v", st)
			}
			if err := s.e.Close(); err != nil {
				t.Fatal(err)
			}
			s.l.Close()
			s.backend.Close()
			if st := s.e.Stats(); st.Forward.PipesOpen != 0 {
				t.Errorf("%d pipes open after Close", st.Forward.PipesOpen)
			}
			for _, c := range conns {
				c.Close()
			}
			wg.Wait()
		}()
		deadline := time.Now().Add(10 * time.Second)
		for countFDs() > fdsBefore && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := countFDs(); n > fdsBefore {
			t.Errorf("%d descriptors before, %d after", fdsBefore, n)
		}
	})
}

// TestRelaySendDataDemanded: RelaySendData is the old path, on a backend that could splice.
func TestRelaySendDataDemanded(t *testing.T) {
	testRelaySendDataDemanded(t, Config{Queues: 2}, 8, 1<<20)
}

func testRelaySendDataDemanded(t *testing.T, cfg Config, conns int, perConn int64) {
	s := newSpliceEnv(t, cfg, RelayOptions{Path: RelaySendData}, streamServe(perConn))
	runSpliceClients(t, s.addr(), conns, perConn)
	s.checkRelays(t, conns, perConn+8, perConn)
	if st := s.e.Stats(); st.Forward.SpliceRelays != 0 || st.Forward.Fallbacks != 0 {
		t.Errorf("Stats: %d splice relays, %d fallbacks", st.Forward.SpliceRelays, st.Forward.Fallbacks)
	}
}

// TestRelayPathDemand: a demanded path the host cannot take is a typed error, both sides
// closed; bad options are ErrInvalid; RelayAuto says why it did not splice.
func TestRelayPathDemand(t *testing.T) {
	e := newEngine(t, Config{Queues: 1})
	a, _ := dialPeer(t, e, HandlerFuncs{})
	b, _ := dialPeer(t, e, HandlerFuncs{})
	if _, err := Relay(a, b, RelayOptions{Path: RelayPath(9)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("unknown path: %v, want ErrInvalid", err)
	}
	<-a.Done()
	<-b.Done()
	a, _ = dialPeer(t, e, HandlerFuncs{})
	b, _ = dialPeer(t, e, HandlerFuncs{})
	if _, err := Relay(a, b, RelayOptions{PipeSize: -1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative pipe size: %v, want ErrInvalid", err)
	}
	<-a.Done()
	<-b.Done()

	// A connection the application reads itself (ReadSelf, as the net.Conn face opens its
	// direct ones, Exclusive too): zc never receives for it, so no relay of either path
	// could forward its bytes: ErrInvalid, and neither connection changes (RelayAuto used to
	// fall back to SendData there and wait forever).
	selfAcc := make(chan *Conn, 1)
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		selfAcc <- c
		return HandlerFuncs{}
	}, ListenOptions{ReadSelf: true, Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, path := range []RelayPath{RelaySplice, RelayAuto} {
		go func() {
			c, err := net.Dial("tcp", l.Addr().String())
			if err == nil {
				defer c.Close()
				io.Copy(io.Discard, c)
			}
		}()
		c := recvEvent(t, selfAcc, "accept")
		b, _ = dialPeer(t, e, HandlerFuncs{})
		if _, err := Relay(c, b, RelayOptions{Path: path}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("relay (%v) of a ReadSelf connection: %v, want ErrInvalid", path, err)
		}
		if b.isClosing() || c.isClosing() {
			t.Errorf("relay (%v) refused: a connection was closed", path)
		}
		b.Close()
		c.Close()
		<-b.Done()
		<-c.Done()
	}
	if st := e.Stats(); st.Forward.Fallbacks != 0 {
		t.Errorf("Stats.Forward.Fallbacks %d, want 0", st.Forward.Fallbacks)
	}
}

// spliceDump describes the engine's live splice relays (for a stalled test).
func spliceDump(e *Engine) string {
	var b strings.Builder
	for _, q := range e.queues {
		q.Do(func() error {
			for r := range q.splq().relays {
				for i, d := range r.dirs {
					fmt.Fprintf(&b, "q%d relay %p dir %d: inPipe %d eof %v done %v flushed %v posted %v in.armed %v out.armed %v total %d\n",
						q.idx, r, i, d.inPipe, d.eof, d.done, d.flushed, d.posted, d.in.armed, d.out.armed, d.total.Load())
				}
			}
			return nil
		})
	}
	return b.String()
}

// TestRelaySpliceUserUnpause: SetReceivePaused(false) called again and again on both
// connections of splice relays (a misuse: the relay owns their receiving) changes nothing:
// the receive ring never starts beside the splice, and every byte arrives once, in order.
func TestRelaySpliceUserUnpause(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		const conns, perConn = 4, 4 << 20
		s := newSpliceEnv(t, Config{Backend: be, Queues: 2}, RelayOptions{Path: RelaySplice, PipeSize: 64 << 10},
			streamServe(perConn))
		stop := make(chan struct{})
		var started, running atomic.Int32
		hook := func(front, back *Conn) {
			running.Add(1)
			started.Add(1)
			go func() {
				defer running.Add(-1)
				for {
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Microsecond):
					}
					front.SetReceivePaused(false)
					back.SetReceivePaused(false)
				}
			}()
		}
		s.hook.Store(&hook)
		runSpliceClients(t, s.addr(), conns, perConn)
		// Every relay's hook ran (it may run after its relay moved all the bytes), then
		// the togglers stop.
		waitFor(t, func() bool { return started.Load() == conns }, "every relay's hook")
		close(stop)
		waitFor(t, func() bool { return running.Load() == 0 }, "the togglers to stop")
		s.checkRelays(t, conns, perConn+8, perConn)
	})
}
