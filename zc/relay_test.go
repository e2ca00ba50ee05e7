package zc

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/tcpglue"
)

// The relay test: a zc engine accepts clients, dials a backend for each with
// DialAsync from the accept function, and forwards both ways with Conn.SendData only: no
// flow-control code of its own; MaxQueuedBytes and MaxRecvHeld must keep it going. Some
// clients read slowly (small socket buffer, sleeps), one pauses for a while, and some backend
// connections hold their received data for a moment before releasing it. Every byte is
// checked (SHA-256 per connection, both ways), and a watchdog fails the test with the
// engines' state when nothing moves for a while.
//
// ZC_RELAY_MIB (MiB each way per connection, default 1), ZC_RELAY_RUNS (runs of the one- and
// two-queue configurations, default 2; their variations run once) and ZC_RELAY_CONNS (default 64) scale it up: the goal is
// 64 connections × 64 MiB, 100 runs.

func envInt(t testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// streamGen produces a deterministic byte stream (PCG seeded with seed), in pieces of any
// size.
type streamGen struct {
	rng *rand.PCG
	buf [8]byte
	n   int // bytes of buf still unused
}

func newStreamGen(seed uint64) *streamGen {
	return &streamGen{rng: rand.NewPCG(seed, 0x9e3779b97f4a7c15)}
}

func (g *streamGen) fill(p []byte) {
	i := 0
	for i < len(p) && g.n > 0 {
		p[i] = g.buf[8-g.n]
		g.n--
		i++
	}
	for ; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], g.rng.Uint64())
	}
	if i < len(p) {
		binary.LittleEndian.PutUint64(g.buf[:], g.rng.Uint64())
		g.n = 8
		for ; i < len(p); i++ {
			p[i] = g.buf[8-g.n]
			g.n--
		}
	}
}

// streamResult is what one end of one direction saw: bytes and their SHA-256.
type streamResult struct {
	n   int
	sum [32]byte
}

type relayRun struct {
	t        *testing.T
	perConn  int
	progress atomic.Int64 // bytes moved by anyone: the watchdog watches it
	errMu    sync.Mutex
	errs     []error

	mu          sync.Mutex
	upSent      map[uint64]streamResult // client id -> what the client sent
	upRecv      map[uint64]streamResult // client id -> what the backend received
	downSent    map[uint64]streamResult // backend conn id -> what the backend sent
	downRecv    map[uint64]streamResult // backend conn id -> what the client received
	backendSeq  atomic.Uint64
	dialsFailed atomic.Int64
	retries     atomic.Int64 // backend senders that found no buffer with nothing queued

	connsMu sync.Mutex
	conns   []*Conn // the relay's client-side connections (sampled for RecvHeld)
	maxHeld int     // the most receive-buffer bytes one of them held at a sample
}

func (r *relayRun) fail(err error) {
	r.errMu.Lock()
	if len(r.errs) < 20 {
		r.errs = append(r.errs, err)
	}
	r.errMu.Unlock()
}

func (r *relayRun) firstErrs() []error {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	return append([]error(nil), r.errs...)
}

// relayPair is one relayed connection: a (client side) and b (backend side).
type relayPair struct {
	a, b atomic.Pointer[Conn]
	eofs atomic.Int32
}

// relayHandler forwards c's data to its peer with SendData; EOF half-closes the peer, and
// once both sides ended both connections close (gracefully: queued data still goes out).
func relayHandler(r *relayRun, p *relayPair, side int) Handler {
	peer := func() *Conn {
		if side == 0 {
			return p.b.Load()
		}
		return p.a.Load()
	}
	return HandlerFuncs{
		Data: func(c *Conn, d Data) {
			o := peer()
			if o == nil {
				d.Release()
				r.fail(fmt.Errorf("relay side %d: data before its peer exists", side))
				c.Close()
				return
			}
			if err := o.SendData(d); err != nil {
				r.fail(fmt.Errorf("relay side %d: SendData: %w", side, err))
			}
		},
		EOF: func(c *Conn, err error) {
			o := peer()
			if err != io.EOF {
				r.fail(fmt.Errorf("relay side %d: %w", side, err))
				c.Close()
				if o != nil {
					o.Close()
				}
				return
			}
			if o == nil {
				c.Close()
				return
			}
			if err := o.CloseWrite(); err != nil {
				r.fail(fmt.Errorf("relay side %d: CloseWrite of the peer: %w", side, err))
			}
			if p.eofs.Add(1) == 2 {
				c.Close()
				o.Close()
			}
		},
		Close: func(c *Conn, err error) {
			if err != nil {
				r.fail(fmt.Errorf("relay side %d closed: %w", side, err))
			}
			if o := peer(); o != nil {
				o.Close()
			}
		},
	}
}

// relayAccept is the relay's accept function: it pauses the client until the backend
// connection is up, dialed with DialAsync from here (a queue goroutine).
func relayAccept(r *relayRun, e *Engine, backend string) func(c *Conn) Handler {
	return func(c *Conn) Handler {
		p := &relayPair{}
		p.a.Store(c)
		r.connsMu.Lock()
		r.conns = append(r.conns, c)
		r.connsMu.Unlock()
		if err := c.SetReceivePaused(true); err != nil {
			r.fail(fmt.Errorf("pause in accept: %w", err))
			return nil
		}
		err := e.DialAsync(context.Background(), "tcp", backend, relayHandler(r, p, 1), func(b *Conn, err error) {
			if err != nil {
				r.dialsFailed.Add(1)
				r.fail(fmt.Errorf("backend dial: %w", err))
				c.Close()
				return
			}
			p.b.Store(b)
			if err := c.SetReceivePaused(false); err != nil {
				r.fail(fmt.Errorf("resume after dial: %w", err))
				b.Close()
			}
		})
		if err != nil {
			r.fail(fmt.Errorf("DialAsync from accept: %w", err))
			return nil
		}
		return relayHandler(r, p, 0)
	}
}

// relayBackend is the backend's handler: it hashes what arrives (the client's id first) and
// streams its own perConn bytes (its sequence number first) from OnWritable.
type relayBackend struct {
	r        *relayRun
	id       uint64 // this backend connection's number (the downstream stream's seed)
	slow     bool   // hold received data for a moment before releasing it
	maxQueue int

	// Loop only.
	up      [8]byte
	upN     int
	recvN   int
	upHash  hashState
	gen     *streamGen
	sent    int
	hdrSent bool
	down    hashState
	wrDone  bool
	eof     bool
	closed  bool
}

func (h *relayBackend) OnData(c *Conn, d Data) {
	p := d.Bytes()
	for len(p) > 0 && h.upN < 8 {
		h.up[h.upN] = p[0]
		h.upN++
		p = p[1:]
	}
	h.upHash.h.Write(d.Bytes())
	h.r.progress.Add(int64(d.Len()))
	h.recvN += d.Len()
	if h.slow {
		go func() {
			time.Sleep(200 * time.Microsecond)
			d.Release()
		}()
		return
	}
	d.Release()
}

func (h *relayBackend) OnEOF(c *Conn, err error) {
	if err != io.EOF {
		h.r.fail(fmt.Errorf("backend %d: %w", h.id, err))
		c.Close()
		return
	}
	h.eof = true
	var sum [32]byte
	copy(sum[:], h.upHash.h.Sum(nil))
	h.r.mu.Lock()
	h.r.upRecv[binary.LittleEndian.Uint64(h.up[:])] = streamResult{n: h.recvN, sum: sum}
	h.r.mu.Unlock()
	h.maybeClose(c)
}

func (h *relayBackend) OnClose(c *Conn, err error) {
	if err != nil {
		h.r.fail(fmt.Errorf("backend %d closed: %w", h.id, err))
	}
}

func (h *relayBackend) maybeClose(c *Conn) {
	if h.eof && h.wrDone && !h.closed {
		h.closed = true
		c.Close()
	}
}

// OnWritable produces the next buffers while less than maxQueue bytes are queued.
func (h *relayBackend) OnWritable(c *Conn) {
	for h.sent < h.r.perConn && c.Queued() < h.maxQueue {
		b, err := c.Buffer()
		if err != nil {
			if c.Queued() == 0 {
				// Nothing in flight: no OnWritable would come. Try again shortly.
				h.r.retries.Add(1)
				go func() {
					time.Sleep(time.Millisecond)
					c.Post(func() { h.OnWritable(c) })
				}()
			}
			return
		}
		n := min(len(b.Bytes()), h.r.perConn-h.sent)
		p := b.Bytes()[:n]
		off := 0
		if !h.hdrSent {
			binary.LittleEndian.PutUint64(p, h.id)
			off = 8
			h.hdrSent = true
		}
		h.gen.fill(p[off:])
		h.down.h.Write(p)
		if err := c.Send(b, n); err != nil {
			h.r.fail(fmt.Errorf("backend %d: Send: %w", h.id, err))
			return
		}
		h.sent += n
		h.r.progress.Add(int64(n))
	}
	if h.sent == h.r.perConn && !h.wrDone {
		h.wrDone = true
		var sum [32]byte
		copy(sum[:], h.down.h.Sum(nil))
		h.r.mu.Lock()
		h.r.downSent[h.id] = streamResult{n: h.sent, sum: sum}
		h.r.mu.Unlock()
		if err := c.CloseWrite(); err != nil {
			h.r.fail(fmt.Errorf("backend %d: CloseWrite: %w", h.id, err))
		}
		h.maybeClose(c)
	}
}

func relayBackendAccept(r *relayRun, e *Engine) func(c *Conn) Handler {
	return func(c *Conn) Handler {
		id := r.backendSeq.Add(1)
		h := &relayBackend{r: r, id: id, slow: id%4 == 1, maxQueue: min(256<<10, e.Config().MaxQueuedBytes),
			gen: newStreamGen(id), upHash: hashState{sha256.New()}, down: hashState{sha256.New()}}
		h.OnWritable(c) // start streaming (on the queue goroutine)
		return h
	}
}

// relayClient is one client (Go's net): it sends perConn bytes (its id first) and reads the
// backend's stream, slowly when asked.
func relayClient(r *relayRun, addr string, id uint64, slow, pause bool) {
	d := net.Dialer{Timeout: 10 * time.Second}
	d.SetMultipathTCP(false)
	if slow {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 32<<10) })
			return serr
		}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		r.fail(fmt.Errorf("client %d: %w", id, err))
		return
	}
	defer nc.Close()
	tc := nc.(*net.TCPConn)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		g := newStreamGen(1<<40 + id)
		h := sha256.New()
		rng := rand.New(rand.NewPCG(id, 5))
		buf := make([]byte, 64<<10)
		sent := 0
		for sent < r.perConn {
			n := min(1+rng.IntN(len(buf)), r.perConn-sent)
			p := buf[:n]
			off := 0
			if sent == 0 {
				binary.LittleEndian.PutUint64(p, id)
				off = 8
			}
			g.fill(p[off:])
			h.Write(p)
			if _, err := tc.Write(p); err != nil {
				r.fail(fmt.Errorf("client %d write: %w", id, err))
				return
			}
			sent += n
			r.progress.Add(int64(n))
		}
		var sum [32]byte
		copy(sum[:], h.Sum(nil))
		r.mu.Lock()
		r.upSent[id] = streamResult{n: sent, sum: sum}
		r.mu.Unlock()
		if err := tc.CloseWrite(); err != nil {
			r.fail(fmt.Errorf("client %d CloseWrite: %w", id, err))
		}
	}()
	h := sha256.New()
	var hdr [8]byte
	got := 0
	buf := make([]byte, 64<<10)
	if slow {
		buf = buf[:16<<10]
	}
	for {
		n, err := tc.Read(buf)
		for i := 0; i < n && got+i < 8; i++ {
			hdr[got+i] = buf[i]
		}
		h.Write(buf[:n])
		got += n
		r.progress.Add(int64(n))
		if err == io.EOF {
			break
		}
		if err != nil {
			r.fail(fmt.Errorf("client %d read after %d bytes: %w", id, got, err))
			break
		}
		if slow {
			time.Sleep(500 * time.Microsecond)
		}
		if pause && got > r.perConn/3 {
			pause = false
			time.Sleep(300 * time.Millisecond)
		}
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	r.mu.Lock()
	r.downRecv[binary.LittleEndian.Uint64(hdr[:])] = streamResult{n: got, sum: sum}
	r.mu.Unlock()
	wg.Wait()
}

type relayCase struct {
	name       string
	once       bool   // one run whatever ZC_RELAY_RUNS says (a variation of a main case)
	cfg        Config // the relay engine's
	sameEngine bool   // the backend listens on the relay engine itself
}

func relayCases() []relayCase {
	small := func(s *tcpglue.Socket) error {
		return s.Control(func(fd int) error {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 64<<10); err != nil {
				return err
			}
			return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 64<<10)
		})
	}
	return []relayCase{
		{name: "1queue", cfg: Config{Queues: 1, NoPin: true}},
		{name: "2queues", cfg: Config{Queues: 2, NoPin: true}},
		{name: "2queues-tight", once: true, cfg: Config{Queues: 2, NoPin: true, SocketOptions: small,
			MaxQueuedBytes: 256 << 10, MaxRecvHeld: 128 << 10, RecvPoolMax: 4 << 20}},
		{name: "1queue-same-engine", once: true, sameEngine: true, cfg: Config{Queues: 1, NoPin: true}},
		// The relay and its backend share one queue's receive pool, which is smaller than the
		// connections' receive credit put together.
		{name: "1queue-same-engine-tight", once: true, sameEngine: true, cfg: Config{Queues: 1, NoPin: true,
			MaxQueuedBytes: 256 << 10, MaxRecvHeld: 128 << 10, RecvPoolMax: 4 << 20}},
	}
}

func TestRelay(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		testRelay(t, b, envInt(t, "ZC_RELAY_CONNS", 64), envInt(t, "ZC_RELAY_MIB", 1)<<20, envInt(t, "ZC_RELAY_RUNS", 2))
	})
}

// testRelay runs the relay cases (all when only is empty, else those named).
func testRelay(t *testing.T, backend Backend, conns, perConn, runs int, only ...string) {
	for _, tc := range relayCases() {
		if len(only) > 0 && !slices.Contains(only, tc.name) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Backend = backend
			relay := newEngine(t, cfg)
			be := relay
			if !tc.sameEngine {
				be = newEngine(t, Config{Backend: backend, Queues: 2, NoPin: true})
			}
			n := runs
			if tc.once {
				n = 1
			}
			for run := 0; run < n; run++ {
				start := time.Now()
				r := relayOnce(t, relay, be, conns, perConn)
				st := relay.Stats()
				t.Logf("run %d: %d conns × %d KiB each way in %v; relay credit pauses %d, buf-ring empty %d, pool %d/%d bytes, sender retries %d; most held by one connection %d KiB (MaxRecvHeld %d KiB)",
					run, conns, perConn>>10, time.Since(start).Round(time.Millisecond), st.Recv.CreditPauses, st.Recv.BufRingEmpty,
					st.Memory.RecvPoolBytes, st.Memory.RecvPoolMax, r.retries.Load(), r.maxHeld>>10, relay.Config().MaxRecvHeld>>10)
				if t.Failed() {
					return
				}
			}
		})
	}
}

// relayOnce runs conns clients through the relay engine to a backend listener on be.
func relayOnce(t *testing.T, relay, be *Engine, conns, perConn int) *relayRun {
	t.Helper()
	r := &relayRun{t: t, perConn: perConn, upSent: map[uint64]streamResult{}, upRecv: map[uint64]streamResult{},
		downSent: map[uint64]streamResult{}, downRecv: map[uint64]streamResult{}}
	bl, err := be.Listen("tcp", "127.0.0.1:0", relayBackendAccept(r, be))
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Close()
	rl, err := relay.Listen("tcp", "127.0.0.1:0", relayAccept(r, relay, bl.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	var wg sync.WaitGroup
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			relayClient(r, rl.Addr().String(), uint64(i), i%4 == 2, i == 3)
		}(i)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	// Wait for the clients, then for every connection of both engines to finish (the
	// backends' results come with their EOF). Watchdog: fail when nothing moved for 20 s.
	last, lastChange := int64(-1), time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	clientsDone := false
	for !clientsDone || relay.Stats().Conns != 0 || be.Stats().Conns != 0 {
		select {
		case <-done:
			clientsDone = true
			done = nil
		case <-tick.C:
			r.connsMu.Lock()
			for _, c := range r.conns {
				r.maxHeld = max(r.maxHeld, c.Stats().RecvHeld)
			}
			r.connsMu.Unlock()
		}
		if p := r.progress.Load() + int64(relay.Stats().Conns+be.Stats().Conns)<<40; p != last {
			last, lastChange = p, time.Now()
		} else if time.Since(lastChange) > 20*time.Second {
			dumpStacks(t)
			dump := "relay engine:\n" + engineDump(relay)
			if be != relay {
				dump += "backend engine:\n" + engineDump(be)
			}
			t.Fatalf("relay stalled: nothing moved for 20 s (clients done %v, %d bytes so far, errors %v)\n%s",
				clientsDone, r.progress.Load(), r.firstErrs(), dump)
		}
	}
	for _, err := range r.firstErrs() {
		t.Error(err)
	}
	r.mu.Lock()
	if len(r.upSent) != conns || len(r.upRecv) != conns || len(r.downSent) != conns || len(r.downRecv) != conns {
		t.Errorf("results: %d up sent, %d up received, %d down sent, %d down received; want %d each",
			len(r.upSent), len(r.upRecv), len(r.downSent), len(r.downRecv), conns)
	}
	for id, s := range r.upSent {
		if g, ok := r.upRecv[id]; !ok || g != s || s.n != perConn {
			t.Errorf("client %d -> backend: sent %d bytes, backend got %d; checksums equal %v", id, s.n, g.n, g.sum == s.sum)
		}
	}
	for id, s := range r.downSent {
		if g, ok := r.downRecv[id]; !ok || g != s || s.n != perConn {
			t.Errorf("backend %d -> client: sent %d bytes, client got %d; checksums equal %v", id, s.n, g.n, g.sum == s.sum)
		}
	}
	r.mu.Unlock()
	// Every buffer comes back.
	waitSendBuffersBack(t, relay)
	waitSendBuffersBack(t, be)
	if st := relay.Stats(); st.Send.NotifsPending != 0 || st.Send.NotifsUnexpected != 0 {
		t.Errorf("relay notifications: pending %d, unexpected %d", st.Send.NotifsPending, st.Send.NotifsUnexpected)
	}
	return r
}

// dumpStacks writes every goroutine's stack to a file named in the log (for stalls).
func dumpStacks(t testing.TB) {
	buf := make([]byte, 64<<20)
	n := runtime.Stack(buf, true)
	f, err := os.CreateTemp("", "zc-stacks-*.txt")
	if err != nil {
		return
	}
	f.Write(buf[:n])
	f.Close()
	t.Logf("goroutine stacks in %s", f.Name())
}
