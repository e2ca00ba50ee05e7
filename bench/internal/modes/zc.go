package modes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zcnet/zcnet/bench/internal/frame"
	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/bench/internal/stats"
	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/caps"
)

func init() {
	const (
		b, e, p, s = harness.Bulk, harness.Echo, harness.PingPong, harness.Stream
		mc, idle   = harness.MultiCore, harness.Idle
	)
	registered = append(registered,
		ZC{name: "zc", path: zc.SendAdaptive, scens: []harness.Scenario{b, e, p, s, mc, idle}},
		ZC{name: "zc-copy", path: zc.SendCopy, scens: []harness.Scenario{b, e, p, s}},
		// zc-copy again, as a variant of its own (the A/A pair): how far two identical
		// variants drift apart round by round in one run is the noise every goal is read
		// against (bulk: Gbit/s and CPU per GB; echo: msgs/s; ping-pong: p99).
		ZC{name: "zc-copy-aa", path: zc.SendCopy, scens: []harness.Scenario{b, e, p}},
		// Opt-in busy polling (Config.BusyPoll): the latency mode of goal 4.
		ZC{name: "zc-busy", busy: 100 * time.Microsecond, scens: []harness.Scenario{e, p}},
		// zc's default with Config.AddProcs (GOMAXPROCS raised by the number of queues), as
		// zc's package doc advises ("Queues and Go's scheduler"): a queue waiting in the
		// kernel holds a P, and with none idle the runtime's sysmon takes it back from every
		// wait.
		ZC{name: "zc-extra-p", extraP: true, scens: []harness.Scenario{e, p}},
		ZC{name: "zc-sendzc", path: zc.SendZeroCopy, scens: []harness.Scenario{b}},
		ZC{name: "zc-mmap", path: zc.SendZeroCopy, mmap: true, scens: []harness.Scenario{b}},
		// Steering set explicitly (the default "zc" takes Config's default steering).
		ZC{name: "zc-hash", steer: zc.SteerReuseportHash, scens: []harness.Scenario{mc}},
		ZC{name: "zc-cpu", steer: zc.SteerBPF, cpuPolicy: true, scens: []harness.Scenario{mc}},
		ZCNet{},
		ZCNet{Ring: true},
	)
}

// ZC is zcnet's event-loop API (package zc) on the io_uring backend, fallback
// forbidden: "zc" sends adaptively, "zc-copy" forces copying sends, "zc-sendzc"
// forces SEND_ZC, "zc-mmap" receives through the mapped window (RecvMapped,
// TCP_ZEROCOPY_RECEIVE) with what it needs to map pages: a SEND_ZC sender and
// TCP_MAXSEG 4108 on both sides.
//
// How each scenario uses zc:
//   - bulk/stream senders are loop-driven (zc.Writable): a function posted to the
//     connection's queue goroutine starts them and OnWritable, run there whenever a
//     batch of sends completed, refills them; nothing crosses threads per send;
//   - frames of 4 KiB and more are sent from the engine's registered send buffers
//     (one frame per buffer, filled once per buffer, only re-stamped afterwards) with
//     Conn.Send, up to the engine's MaxQueuedBytes queued (then OnWritable resumes
//     them below half of it, the way Conn.Send's documentation asks); smaller frames
//     go through Conn.Write, which copies them into a
//     staging buffer and coalesces them while a send is in flight (on the queue
//     goroutine it returns zc.ErrWouldBlock instead of waiting: the rest of the frame
//     goes out in the next OnWritable);
//   - bulk/stream receivers Feed the borrowed Data (a receive buffer of the
//     provided-buffer ring, Case.RecvBuf bytes like every mode's read but at most
//     64 KiB, since a completion carries what arrived whatever the size; or with zc-mmap the
//     mapped window) to the verifier and Release it at once;
//   - echo servers send a request that arrived in one receive buffer straight back
//     from that buffer (Conn.SendData, no copy); one split over several buffers, or
//     any with zc-mmap (mapped pages belong to the socket), is gathered into a send
//     buffer and Sent;
//   - echo clients keep one request in flight per connection from the handler.
//
// Queue threads are not pinned by zc (NoPin): zcbench has already pinned the whole
// process to its CPU, and zc pins to absolute CPU numbers.
//
// Multi-core servers ("zc", "zc-hash", "zc-cpu") run Case.Queues queues, pinned by zc
// (zcbench gives the server CPUs 0..Queues-1 when it can, which is where zc pins them;
// otherwise NoPin, noted in the results), and note how their listener steered
// connections and how many each queue got. "zc-hash" sets Config.Steering to
// SteerReuseportHash, "zc-cpu" to SteerBPF with SteerPolicy bpf.PolicyCPU (root: the
// programs must load); "zc" leaves Config's default.
type ZC struct {
	name      string
	path      zc.SendPath
	mmap      bool
	steer     zc.SteeringMode
	cpuPolicy bool
	busy      time.Duration // Config.BusyPoll
	extraP    bool          // Config.AddProcs
	scens     []harness.Scenario
}

// Name implements harness.Mode.
func (z ZC) Name() string { return z.name }

// Supports implements harness.ScenarioSupporter.
func (z ZC) Supports(s harness.Scenario) bool { return slices.Contains(z.scens, s) }

// Available implements harness.Mode: an io_uring engine must start.
func (z ZC) Available() error {
	if z.mmap {
		if err := tcpglue.ProbeZeroCopyReceive(); err != nil {
			return fmt.Errorf("TCP_ZEROCOPY_RECEIVE: %w", err)
		}
	}
	if z.steer == zc.SteerBPF {
		if err := caps.Probe().BPFSteering; err != nil {
			return fmt.Errorf("BPF steering: %w", err)
		}
	}
	cfg := zc.Config{Queues: 1, Backend: zc.BackendIOUring, NoFallback: true, NoPin: true,
		SendPath: z.path, SendBufs: 16, RecvBufs: 16}
	if z.mmap {
		cfg.RecvPath = zc.RecvMapped
	}
	e, err := zc.New(cfg)
	if err != nil {
		return err
	}
	return e.Close()
}

// regionBudget is the registered memory one direction of an engine may use: 8 MiB, or
// a third of the locked-memory limit when that is lower (registered buffers count
// against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK; an ordinary user's limit
// is often 8 MiB in all).
func regionBudget() int {
	const want = 8 << 20
	if os.Geteuid() == 0 {
		return want
	}
	lim, _ := memreg.RaiseMemlock(3 * want)
	if lim >= 3*want {
		return want
	}
	return max(int(lim)/3, 64<<10)
}

// bufCount is how many buffers of size bytes fit the budget: a power of two up to
// 512, at least 16 with the full budget and at least 2 under a tight memlock limit.
func bufCount(size, budget int) int {
	n := 2
	if budget >= 8<<20 {
		n = 16
	}
	for n < 512 && n*2*size <= budget {
		n *= 2
	}
	return n
}

// mmapMaxSeg is zc-mmap's TCP_MAXSEG: 4096 payload bytes + 12 of timestamp option.
const mmapMaxSeg = 4108

// directSend is whether frames go out from registered buffers with Send.
func directSend(c harness.Case) bool { return c.Size >= 4096 }

// config is the engine configuration of one side of c.
func (z ZC) config(c harness.Case, server bool) zc.Config {
	cfg := zc.Config{Backend: zc.BackendIOUring, NoFallback: true, NoPin: true, SendPath: z.path,
		Steering: z.steer, BusyPoll: z.busy, AddProcs: z.extraP}
	if z.cpuPolicy {
		cfg.SteerPolicy = bpf.PolicyCPU
	}
	if c.Queues > 0 && server {
		cfg.Queues = c.Queues
		cfg.NoPin = !firstCPUs(c.Queues)
	}
	if z.mmap {
		// The kernel maps received pages only when each segment's payload is whole
		// order-0 pages: a 4096-byte payload per segment (TCP_MAXSEG 4108 with the
		// timestamp option, on both sides) from a SEND_ZC sender (on loopback the kernel's
		// deferred copy of zero-copy frags lays them out in fresh pages). The receive
		// ring is not used then; the send side still is. Only the server receives
		// through the window (echo clients use the ring).
		if server {
			cfg.RecvPath = zc.RecvMapped
		}
		cfg.SocketOptions = func(s *tcpglue.Socket) error { return s.SetMaxSeg(mmapMaxSeg) }
	}
	budget := regionBudget()
	if c.Scenario.OneWay() {
		// A ring buffer is not a read size: a completion carries what arrived, so buffers
		// larger than 64 KiB only spread the receiver over more memory (16 × 1 MiB buffers
		// cycle through 16 MiB, where the copy into them and the check after it miss the
		// cache): at 1 MiB writes, 64 KiB buffers took 0.86–0.93× the receiver CPU per GB.
		rb := min(c.RecvBuf, 64<<10)
		cfg.RecvBufSize, cfg.RecvBufs = rb, bufCount(rb, budget)
		if directSend(c) {
			cfg.SendBufSize, cfg.SendBufs = c.Size, bufCount(c.Size, budget)
		}
	}
	if budget < 8<<20 {
		// zc's defaults register 48 MiB: fit what this process may lock.
		if cfg.SendBufSize == 0 {
			cfg.SendBufSize = max(4096, c.Size)
			cfg.SendBufs = min(256, bufCount(cfg.SendBufSize, budget))
		}
		if cfg.RecvBufSize == 0 {
			cfg.RecvBufSize = 32 << 10
			cfg.RecvBufs = bufCount(cfg.RecvBufSize, budget)
		}
		// The pools grow with demand: cap them at what this process may lock.
		cfg.SendPoolMax = max(budget, cfg.SendBufs*cfg.SendBufSize)
	}
	// SendBufs/RecvBufs are where the pools start (they grow from there); the caps (default
	// 32 MiB each) must hold them.
	if n := cfg.SendBufs * max(cfg.SendBufSize, 64<<10); n > max(cfg.SendPoolMax, 32<<20) {
		cfg.SendPoolMax = n
	}
	if n := cfg.RecvBufs * max(cfg.RecvBufSize, 32<<10); n > max(cfg.RecvPoolMax, 32<<20) {
		cfg.RecvPoolMax = n
	}
	return cfg
}

// firstCPUs reports whether this process runs on exactly CPUs 0..n-1, where zc pins
// its n queues (queue i on CPU i).
func firstCPUs(n int) bool {
	cpus := harness.AllowedCPUs()
	if len(cpus) != n {
		return false
	}
	for i, c := range cpus {
		if c != i {
			return false
		}
	}
	return true
}

// queueCount counts accepted connections per queue.
type queueCount struct {
	mu sync.Mutex
	n  map[int]int
}

func (q *queueCount) add(queue int) {
	q.mu.Lock()
	if q.n == nil {
		q.n = map[int]int{}
	}
	q.n[queue]++
	q.mu.Unlock()
}

func (q *queueCount) String() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	keys := slices.Sorted(maps.Keys(q.n))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("q%d:%d", k, q.n[k])
	}
	return strings.Join(parts, " ")
}

// noteSteering records how a multi-core server's listener steered (Listener.Stats().Steering:
// BPF with its policy, whether the CPU policy is exact and why, or the kernel's hash and
// why) and the connections per queue.
func noteSteering(m *harness.Meter, e *zc.Engine, l *zc.Listener, q *queueCount) {
	cfg := e.Config()
	info := l.Stats().Steering
	var how string
	switch {
	case e.Stats().Queues == 1:
		how = "one queue (nothing to steer)"
	case info.BPF:
		how = "bpf (" + info.Policy.String() + " policy)"
		if info.Policy&bpf.PolicyCPU != 0 && !info.Exact {
			how += ", not exact"
		}
		how += ": " + info.PolicyReason
	case info.Fallback != "":
		how = "hash (fallback: " + info.Fallback + ")"
	default:
		how = "hash (" + cfg.Steering.String() + ")"
	}
	if cfg.NoPin {
		how += ", queues not pinned"
	}
	m.Note("steering", how)
	m.Note("per_queue", q.String())
}

// addZCStats reports the send side (zc_bytes: sent zero-copy; copied_bytes: sent by
// copying or copied by the kernel after all) and the mapped receive side
// (rx_mapped_bytes / rx_copied_bytes, RecvMapped only).
func addZCStats(m *harness.Meter, e *zc.Engine) {
	st := e.Stats()
	m.AddZeroCopy(st.Send.BytesZC, st.Send.BytesZCCopied+st.Send.BytesCopy)
	m.AddRecvMapped(st.Recv.BytesMapped, st.Recv.BytesMappedCopied)
}

// Server implements harness.Mode.
func (z ZC) Server(_ context.Context, c harness.Case, m *harness.Meter, ready func(string)) error {
	e, err := zc.New(z.config(c, true))
	if err != nil {
		return err
	}
	defer e.Close()
	var fail errs
	var wg sync.WaitGroup
	wg.Add(c.Conns)
	var accepted atomic.Int32
	var perQueue queueCount
	srv := &zcServer{c: c, fail: fail.set, done: wg.Done, mapped: z.mmap}
	l, err := e.Listen("tcp", c.Addr, func(conn *zc.Conn) zc.Handler {
		if accepted.Add(1) > int32(c.Conns) {
			return nil // not ours: closed
		}
		perQueue.add(conn.Stats().Queue)
		return &zcServerConn{zcServer: srv, v: m.NewVerifier()}
	})
	if err != nil {
		return err
	}
	ready(l.Addr().String())
	wg.Wait()
	m.Stop()
	if c.Scenario == harness.MultiCore {
		noteSteering(m, e, l, &perQueue)
	}
	l.Close()
	addZCStats(m, e)
	if st := e.Stats(); z.mmap && st.Recv.MappedFallbacks > 0 {
		fail.set(fmt.Errorf("%d of %d connections could not set up the mapped receive window", st.Recv.MappedFallbacks, c.Conns))
	}
	return fail.get()
}

// zcServer is what the connections of a zc server share (one per server, so that an idle
// connection carries only its own state, as a user's server would).
type zcServer struct {
	c      harness.Case
	fail   func(error)
	done   func()
	mapped bool // RecvMapped: Data may be pages of the socket, not a receive buffer
}

type zcServerConn struct {
	*zcServer
	v      *frame.Verifier
	failed bool
	eof    bool
	// echo: the request being gathered in a send buffer
	have   bool
	req    memreg.Buf
	filled int
}

func (s *zcServerConn) OnData(conn *zc.Conn, d zc.Data) {
	if s.failed {
		d.Release()
		return
	}
	p := d.Bytes()
	if !s.c.Scenario.RequestResponse() {
		err := s.v.Feed(p)
		d.Release()
		if err != nil {
			s.abort(conn, err)
		}
		return
	}
	if !s.have && len(p) == s.c.Size && !s.mapped {
		// The whole request in one receive buffer: send that very buffer back.
		if err := s.v.Feed(p); err != nil {
			d.Release()
			s.abort(conn, err)
			return
		}
		if err := conn.SendData(d); err != nil { // releases d
			s.abort(conn, fmt.Errorf("echo send: %w", err))
		}
		return
	}
	defer d.Release()
	for len(p) > 0 {
		if !s.have {
			b, err := conn.Buffer()
			if err != nil {
				s.abort(conn, fmt.Errorf("echo buffer: %w", err))
				return
			}
			s.req, s.have, s.filled = b, true, 0
		}
		n := copy(s.req.Bytes()[s.filled:s.c.Size], p)
		if err := s.v.Feed(p[:n]); err != nil {
			s.abort(conn, err)
			return
		}
		s.filled += n
		p = p[n:]
		if s.filled == s.c.Size {
			s.have = false
			if err := conn.Send(s.req, s.c.Size); err != nil {
				s.abort(conn, fmt.Errorf("echo send: %w", err))
				return
			}
		}
	}
}

func (s *zcServerConn) abort(conn *zc.Conn, err error) {
	s.failed = true
	s.fail(err)
	s.release()
	conn.Close()
}

func (s *zcServerConn) release() {
	if s.have {
		s.req.Release()
		s.have = false
	}
}

func (s *zcServerConn) OnEOF(conn *zc.Conn, err error) {
	s.eof = true
	if !s.failed {
		if errors.Is(err, io.EOF) {
			if verr := s.v.Close(); verr != nil {
				s.fail(verr)
			}
		} else {
			s.fail(fmt.Errorf("receive: %w", err))
		}
	}
	s.release()
	conn.Close()
}

func (s *zcServerConn) OnClose(_ *zc.Conn, err error) {
	if err != nil && !s.eof && !s.failed {
		s.fail(fmt.Errorf("connection: %w", err))
	}
	s.release()
	s.done()
}

// Client implements harness.Mode.
func (z ZC) Client(ctx context.Context, c harness.Case, m *harness.Meter) error {
	e, err := zc.New(z.config(c, false))
	if err != nil {
		return err
	}
	defer e.Close()
	var fail errs
	if c.Scenario.RequestResponse() {
		err = zcEchoClients(ctx, e, c, m, &fail)
	} else {
		err = zcSource(ctx, e, c, m, &fail)
	}
	m.Stop()
	addZCStats(m, e)
	if err != nil {
		return err
	}
	return fail.get()
}

// zcSource sends frames back to back on one connection, driven by the connection's
// queue goroutine: a posted function starts the sender, and every OnWritable (a batch of
// sends completed) refills it, so no goroutine hands sends across threads.
func zcSource(ctx context.Context, e *zc.Engine, c harness.Case, m *harness.Meter, fail *errs) error {
	s := &zcSender{c: c, m: m, src: m.NewSource(), fail: fail.set, direct: directSend(c),
		maxQueued: e.Config().MaxQueuedBytes}
	if s.direct {
		s.filled = map[uintptr]bool{}
	} else {
		s.frame = make([]byte, c.Size)
		s.src.Fill(s.frame)
		s.src.Stamp(s.frame)
	}
	conn, err := e.Dial(ctx, "tcp", c.Addr, s)
	if err != nil {
		return err
	}
	m.Start()
	if err := conn.Post(func() { s.pump(conn) }); err != nil {
		conn.Close()
		<-conn.Done()
		return fmt.Errorf("start sender: %w", err)
	}
	<-conn.Done() // the sender closes the connection when the time is up
	return nil
}

// zcSender is a loop-driven frame source (zc.Writable). All its methods run on the
// connection's queue goroutine.
type zcSender struct {
	c      harness.Case
	m      *harness.Meter
	src    *frame.Source
	fail   func(error)
	direct bool
	// maxQueued is the engine's MaxQueuedBytes: the direct sender queues up to it, then waits
	// for OnWritable (Conn.Send's documented way to keep a stream bounded). Taking buffers
	// until the pool ran dry instead kept every send buffer in flight (16 MiB at 1 MiB
	// writes): the kernel's copy out of them missed the cache, 1.1–1.2× the sender CPU per GB.
	maxQueued int
	filled    map[uintptr]bool // registered buffers that already hold the payload (direct)
	frame     []byte           // the stamped frame Written next (not direct)
	off       int              // bytes of frame already accepted by Write
	done      bool
}

func (s *zcSender) OnWritable(conn *zc.Conn) { s.pump(conn) }

// pump queues frames until zc pushes back, then returns; OnWritable calls it again.
func (s *zcSender) pump(conn *zc.Conn) {
	if s.done {
		return
	}
	if s.direct {
		for conn.Queued() < s.maxQueued {
			b, err := conn.Buffer()
			if err != nil {
				if errors.Is(err, memreg.ErrExhausted) {
					return // every buffer is queued or in flight: OnWritable comes again
				}
				s.finish(conn, fmt.Errorf("send buffer: %w", err))
				return
			}
			if !s.sendBuf(conn, b) {
				return
			}
		}
		return // MaxQueuedBytes queued: OnWritable comes again below half of it
	}
	for {
		n, err := conn.Write(s.frame[s.off:])
		s.off += n
		if err != nil {
			if errors.Is(err, zc.ErrWouldBlock) {
				return // queue or buffers full: the rest of the frame goes in OnWritable
			}
			s.finish(conn, fmt.Errorf("send: %w", err))
			return
		}
		s.off = 0
		s.src.Sent()
		if s.m.Stopped() {
			s.finish(conn, nil)
			return
		}
		s.src.Stamp(s.frame)
	}
}

// sendBuf stamps one frame into a registered buffer and sends it; false: stop.
func (s *zcSender) sendBuf(conn *zc.Conn, b memreg.Buf) bool {
	p := b.Bytes()[:s.c.Size]
	if !s.filled[b.Addr()] {
		s.src.Fill(p)
		s.filled[b.Addr()] = true
	}
	s.src.Stamp(p)
	if err := conn.Send(b, s.c.Size); err != nil {
		s.finish(conn, fmt.Errorf("send: %w", err))
		return false
	}
	s.src.Sent()
	if s.m.Stopped() {
		s.finish(conn, nil)
		return false
	}
	return true
}

func (s *zcSender) finish(conn *zc.Conn, err error) {
	s.done = true
	if err != nil {
		s.fail(err)
	}
	conn.Close() // queued sends still go out
}

func (s *zcSender) OnData(_ *zc.Conn, d zc.Data) { d.Release() }

func (s *zcSender) OnEOF(conn *zc.Conn, err error) {
	if s.done && errors.Is(err, io.EOF) {
		return
	}
	s.finish(conn, fmt.Errorf("bulk sender received EOF/error: %w", err))
}

func (s *zcSender) OnClose(_ *zc.Conn, err error) {
	if err != nil && !s.done {
		s.fail(fmt.Errorf("connection: %w", err))
	}
	s.done = true
}

// zcEchoClients keeps one request in flight on each of c.Conns connections, driven
// from the connections' handlers.
func zcEchoClients(ctx context.Context, e *zc.Engine, c harness.Case, m *harness.Meter, fail *errs) error {
	clients := make([]*zcEchoClient, 0, c.Conns)
	conns := make([]*zc.Conn, 0, c.Conns)
	closeAll := func() {
		for _, conn := range conns {
			conn.Close()
			<-conn.Done()
		}
	}
	for range c.Conns {
		cl := &zcEchoClient{c: c, m: m, src: m.NewSource(), v: m.NewVerifier(), rec: m.NewRecorder(), fail: fail.set}
		cl.frame = make([]byte, c.Size)
		cl.src.Fill(cl.frame)
		conn, err := e.Dial(ctx, "tcp", c.Addr, cl)
		if err != nil {
			closeAll()
			return err
		}
		clients = append(clients, cl)
		conns = append(conns, conn)
	}
	m.Start()
	for i, cl := range clients {
		if err := cl.send(conns[i]); err != nil {
			fail.set(err)
			conns[i].Close()
		}
	}
	for _, conn := range conns {
		<-conn.Done()
	}
	return nil
}

type zcEchoClient struct {
	c     harness.Case
	m     *harness.Meter
	src   *frame.Source
	v     *frame.Verifier
	rec   *stats.Recorder
	fail  func(error)
	frame []byte
	t0    time.Time
	got   int
	done  bool
}

func (cl *zcEchoClient) send(conn *zc.Conn) error {
	b, err := conn.Buffer()
	if err != nil {
		return fmt.Errorf("request buffer: %w", err)
	}
	p := b.Bytes()[:cl.c.Size]
	cl.src.Stamp(cl.frame)
	copy(p, cl.frame)
	// Everything about this request is recorded before Send: the response may reach
	// OnData (on the queue goroutine) before Send returns. A failed Send fails the run.
	cl.src.Sent()
	cl.t0 = time.Now()
	if err := conn.Send(b, cl.c.Size); err != nil {
		return fmt.Errorf("request: %w", err)
	}
	return nil
}

func (cl *zcEchoClient) OnData(conn *zc.Conn, d zc.Data) {
	defer d.Release()
	if cl.done {
		return
	}
	p := d.Bytes()
	if err := cl.v.Feed(p); err != nil {
		cl.stop(conn, err)
		return
	}
	cl.got += len(p)
	if cl.got < cl.c.Size {
		return
	}
	if cl.got > cl.c.Size {
		cl.stop(conn, fmt.Errorf("%d response bytes with one %d-byte request in flight", cl.got, cl.c.Size))
		return
	}
	cl.rec.Add(time.Since(cl.t0))
	cl.got = 0
	if cl.m.Stopped() {
		cl.stop(conn, nil)
		return
	}
	if err := cl.send(conn); err != nil {
		cl.stop(conn, err)
	}
}

func (cl *zcEchoClient) stop(conn *zc.Conn, err error) {
	cl.done = true
	if err != nil {
		cl.fail(err)
	}
	conn.Close()
}

func (cl *zcEchoClient) OnEOF(conn *zc.Conn, err error) {
	if !cl.done {
		cl.stop(conn, fmt.Errorf("server closed early: %w", err))
	}
}

func (cl *zcEchoClient) OnClose(_ *zc.Conn, err error) {
	if err != nil && !cl.done {
		cl.fail(fmt.Errorf("connection: %w", err))
	}
}
