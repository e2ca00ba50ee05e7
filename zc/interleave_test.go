package zc

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/zcnet/zcnet/zc/internal/be/fake"
	"io"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/memreg"
)

// The interleaving test: the connection core (core.go, conn.go, queue.go, handler.go,
// relay.go) runs over the fake kernel of zc/internal/be/fake, whose seeded scheduler
// delivers completions in random order, splits and delays them. Each seed builds one queue
// with a small send pool (fewer buffers than its connections want at once), a small receive
// pool, random socket buffer sizes and peers, and a mix of handlers:
//
//   - streamers (Buffer/Send, memreg.ErrExhausted → wait for OnWritable, as ExampleWritable),
//   - writers (Write on the loop, ErrWouldBlock → wait for OnWritable),
//   - echoes (SendData of what arrives, Close at EOF; the application pauses and resumes
//     their receiving; half of the time they Retain the Data and keep one of the two
//     references, released later from outside the loop, sending the other),
//   - sinks (keep some Data, released later from outside the loop; Close at EOF),
//   - relays (an accepted connection held paused, DialAsync, zc.Relay in done),
//   - in a third of the seeds one to three FanOuts, each with a publisher (Publish,
//     PublishShared or PublishData), a random policy and bound, and subscribers that join
//     some of them (interleave_fanout_test.go, which says what it checks),
//
// senders that end with CloseWrite and Close at the peer's EOF, streamers that give a buffer
// back unused; some seeds are crowds (a hundred small streams), some close the engine midway
// (closeAll: graceful closes, dials cancelled), a third play the plain backend (epoll mode),
// a third let graceful closes time out (fake.ActCloseExpire: CloseTimeout passes with sends
// queued; half of their peers stop reading once their connection closes), so aborts cancel
// sends in flight (the fake's cancelSend: -ECANCELED or the part taken, at a later step).
//
// Checked: every byte accepted by Send, Write or SendData is taken by the (fake) kernel
// exactly once and in order — or the connection ended with an error (OnClose err != nil);
// what was accepted and never taken is exactly ConnStats.BytesDropped, and a close that gave
// up with sends queued ended with a *CloseTimeoutError whose Unsent is that count; a send's
// buffers stay lent (and a cancelled send's bytes unchanged) until its completion;
// every byte delivered to OnData is the peer's, in order; a connection that ended cleanly did
// all its work; a zero-copy buffer is not reused before its notification; when nothing can
// happen any more (no completion, no event, no task; the close timers are an hour away) every
// connection has finished — one that has not waits for a wake-up nobody will deliver, and the
// failure shows its state and its last events; every buffer is back in its pool, every
// operation and notification is accounted for, the pool has no waiters left.
//
// A failing seed prints the command that runs it alone. Longer runs:
//
//	go test -run TestInterleave ./zc -interleave.seeds=5000 -interleave.base=-1 -interleave.scale=4

var (
	ilSeeds = flag.Int("interleave.seeds", 0, "interleaving test: seeds to run (0: the default, enough for 100,000 steps)")
	ilBase  = flag.Int64("interleave.base", 1, "interleaving test: first seed (-1: random, printed)")
	ilSeed  = flag.Int64("interleave.seed", 0, "interleaving test: run this one seed only (0: off)")
	ilScale = flag.Int("interleave.scale", 1, "interleaving test: workload size multiplier")
	ilVerb  = flag.Bool("interleave.v", false, "interleaving test: log every seed")
)

const (
	ilDefaultSeeds = 300
	ilMinSteps     = 100_000
)

func TestInterleave(t *testing.T) {
	seeds := *ilSeeds
	if seeds <= 0 {
		seeds = ilDefaultSeeds
	}
	base := *ilBase
	if base == -1 {
		base = time.Now().UnixNano() & (1<<40 - 1)
		t.Logf("interleave: seeds from %d", base)
	}
	if *ilSeed != 0 {
		base, seeds = *ilSeed, 1
	}
	var total simTotals
	for i := 0; i < seeds; i++ {
		seed := base + int64(i)
		st, err := runInterleave(t, seed, *ilScale)
		total.add(st)
		if *ilVerb {
			t.Logf("seed %d: %s", seed, &st)
		}
		if err != "" {
			t.Fatalf("seed %d failed (rerun: go test -run 'TestInterleave$' ./zc -interleave.seed=%d -interleave.scale=%d):\n%s",
				seed, seed, *ilScale, err)
		}
	}
	t.Logf("interleave: %d seeds, %s", seeds, &total)
	if *ilSeed == 0 && *ilSeeds == 0 && *ilScale == 1 {
		if total.steps < ilMinSteps {
			t.Errorf("only %d scheduler steps (want at least %d): the workloads shrank", total.steps, ilMinSteps)
		}
		for _, f := range total.floors() {
			t.Error(f)
		}
	}
}

// floors says which kinds of events the default run made too rarely to test them: a fake
// or a workload that stopped producing one (late sends, cancels, pool waits, ...) would
// otherwise still pass. Every scheduler action must happen; the outcomes below must reach
// about a quarter of what 300 seeds from seed 1 make (the run is deterministic: those counts
// are in the log line above).
func (s *simTotals) floors() []string {
	var bad []string
	for i, n := range s.counts {
		if n == 0 {
			bad = append(bad, fmt.Sprintf("no %q action in the default run", fake.ActNames[i]))
		}
	}
	for _, f := range []struct {
		what     string
		got, min uint64
	}{
		{"resets", uint64(s.resets), 100},
		{"engine closes", uint64(s.engineCloses), 15},
		{"close timeouts with work", uint64(s.expires), 90},
		{"connections finished with a send in the kernel", uint64(s.lateSends), 40},
		{"sends cancelled", uint64(s.cancels), 80},
		{"ENOBUFS", uint64(s.enobufs), 900},
		{"pool growths refused", uint64(s.growRefused), 20},
		{"pool waits", s.poolWaits, 400},
		{"credit pauses", s.creditPauses, 3000},
		{"zero-copy ops", s.zcOps, 4000},
		{"zero-copy bytes copied", s.zcCopied, 500_000},
		{"FanOuts", uint64(s.fans), 50},
		{"FanOut drops", s.fan.Drops, 90},
		{"FanOut closes", s.fan.Closes, 9},
		{"FanOut subscribers gone", s.fan.Gone, 15},
		{"FanOut pauses", s.fan.Pauses, 15},
		{"FanOut removes", uint64(s.fanRemoves), 13},
	} {
		if f.got < f.min {
			bad = append(bad, fmt.Sprintf("only %d %s in the default run (floor %d): the fake or the workload stopped producing them", f.got, f.what, f.min))
		}
	}
	return bad
}

// simTotals sums what the seeds did.
type simTotals struct {
	seeds, steps, conns               int
	counts                            [fake.NActKinds]int
	resets, enobufs, growRefused      int
	engineCloses, cancels, expires    int
	lateSends                         int
	poolWaits, creditPauses, zcCopied uint64
	sendOps, zcOps                    uint64
	bytes                             int64
	fans, fanRemoves                  int
	fan                               FanOutStats // summed over the seeds' FanOuts
}

func (s *simTotals) add(o simTotals) {
	s.seeds += o.seeds
	s.steps += o.steps
	s.conns += o.conns
	for i := range s.counts {
		s.counts[i] += o.counts[i]
	}
	s.resets += o.resets
	s.enobufs += o.enobufs
	s.growRefused += o.growRefused
	s.engineCloses += o.engineCloses
	s.cancels += o.cancels
	s.expires += o.expires
	s.lateSends += o.lateSends
	s.poolWaits += o.poolWaits
	s.creditPauses += o.creditPauses
	s.zcCopied += o.zcCopied
	s.sendOps += o.sendOps
	s.zcOps += o.zcOps
	s.bytes += o.bytes
	s.fans += o.fans
	s.fanRemoves += o.fanRemoves
	addFanStats(&s.fan, o.fan)
}

// addFanStats adds o's message counters to s.
func addFanStats(s *FanOutStats, o FanOutStats) {
	s.Published += o.Published
	s.Deliveries += o.Deliveries
	s.Drops += o.Drops
	s.Closes += o.Closes
	s.Gone += o.Gone
	s.Pauses += o.Pauses
}

func (s *simTotals) String() string {
	var k []string
	for i, n := range s.counts {
		k = append(k, fmt.Sprintf("%s %d", fake.ActNames[i], n))
	}
	return fmt.Sprintf("%d steps, %d connections, %d bytes through the kernel; %s; resets %d, engine closes %d, close timeouts with work %d, finished with a send in the kernel %d, sends cancelled %d, ENOBUFS %d, growths refused %d, pool waits %d, credit pauses %d, send ops %d, zero-copy ops %d (copied bytes %d); %d FanOuts: %d messages, %d deliveries, %d drops, %d closes, %d gone, %d pauses, %d removes",
		s.steps, s.conns, s.bytes, strings.Join(k, ", "), s.resets, s.engineCloses, s.expires, s.lateSends, s.cancels, s.enobufs, s.growRefused, s.poolWaits, s.creditPauses, s.sendOps, s.zcOps, s.zcCopied,
		s.fans, s.fan.Published, s.fan.Deliveries, s.fan.Drops, s.fan.Closes, s.fan.Gone, s.fan.Pauses, s.fanRemoves)
}

// simConn is the test's view of one connection: its role, what its handler accepted for
// sending, how it ended.
type simConn struct {
	kind     string // streamer, writer, echo, relay-front, relay-back
	s        *simRun
	fc       *fake.Conn
	c        *Conn
	inKey    int64  // the peer's stream toward it
	outKey   *int64 // the stream it sends (nil: none)
	ownKey   int64
	total    int64 // streamer, writer: bytes to send
	accepted int64 // bytes Send/Write/SendData accepted
	recvd    int64 // bytes OnData saw
	pausable bool
	closing  bool // the handler called Close

	halfClose  bool   // streamer, writer: CloseWrite when done, Close at the peer's EOF
	bufferWait bool   // streamer: BufferWait on the loop (ErrWouldBlock) instead of Buffer
	eof        bool   // OnEOF ran
	held       []Data // sink: data kept, released later by the scheduler (fake.ActAppRelease)
	wroteAll   bool

	partner *simConn
	relay   *RelayStats
	dialErr error

	closes   int
	closeErr error

	appOut    int       // streamer: SendBytes callbacks owed (each must run exactly once)
	published int64     // fan-pub: bytes published
	pubFan    *simFan   // fan-pub: its fan
	subFans   []*simFan // fan-sub: the fans it joins
	// fan-sub: its state in each fan it joined; fanCur, fanPos: the message partly sent
	// (nil: none) and the bytes of it sent (takeOther)
	fanSubs []*fanSubState
	fanCur  *fanSubState
	fanPos  int64
}

func (r *simConn) state() string {
	return fmt.Sprintf("accepted %d/%d recvd %d closes %d closeErr %v dialErr %v", r.accepted, r.total, r.recvd, r.closes, r.closeErr, r.dialErr)
}

func (r *simConn) failf(format string, args ...any) {
	r.s.k.Failf("%v: %s", r.fc, fmt.Sprintf(format, args...))
}

// simRun is one seed.
type simRun struct {
	fake.Options // the fake kernel's draws (rng, weight, growRefuse, epoll, dialFail, maxSteps)
	fake.Counts  // what it counted (counts, resets, enobufs, growRefused, cancels)

	t     *testing.T
	seed  int64
	scale int
	e     *Engine
	q     *queue
	k     *fake.Kernel
	l     *Listener

	plan         []*simConn // connections still to accept
	acceptPosted bool
	roles        []*simConn
	begun        bool
	doneCh       chan string
	steps        int

	// closeEngine: the engine closes mid-run (engineClosed once it did), as Engine.Close
	// does: no more connections, every connection closed gracefully.
	closeEngine, engineClosed bool
	crowd                     bool // many small connections
	// closeExpire: graceful closes may time out (fake.ActCloseExpire), and some peers stop
	// reading when their connection closes (fake.Conn.stall)
	closeExpire bool
	resetFrac   float64
	dialRoles   []*simConn // roles of connections being dialed, in DialAsync order

	expires   int // closes that gave up with work
	lateSends int // connections finished with a send in the kernel (fake.ActCloseExpire2)

	// FanOuts with their publishers and subscribers (interleave_fanout_test.go); fanBufs:
	// where each published message starts; fanRemoves: subscribers removed mid-stream
	fans       []*simFan
	fanBufs    map[fanBufKey]fanRef
	fanRemoves int
}

func (s *simRun) Done(failure string, steps int) {
	s.steps = steps
	if failure == "" {
		failure = s.check()
	}
	s.doneCh <- failure
}

func (s *simRun) PendingAccepts() int {
	if s.acceptPosted {
		return 0
	}
	return len(s.plan)
}

// runInterleave runs one seed; it returns what it did and a failure ("" if none).
func runInterleave(t *testing.T, seed int64, scale int) (simTotals, string) {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	s := &simRun{t: t, seed: seed, scale: scale, doneCh: make(chan string, 1)}
	s.Rng = rng
	for i := range s.Weight {
		s.Weight[i] = 1 + rng.IntN(10)
	}
	if rng.IntN(4) == 0 {
		s.Weight[fake.ActPeerRead] = 1 // a slow reader
	}
	if rng.IntN(4) == 0 {
		s.Weight[fake.ActNotif] = 1 // late notifications
	}
	s.Weight[fake.ActReset] = 1
	s.Weight[fake.ActUserPause] = 1
	s.GrowRefuse = []float64{0, 0, 0.3, 1}[rng.IntN(4)]
	s.DialFail = []float64{0, 0, 0.2}[rng.IntN(3)]
	s.resetFrac = []float64{0, 0.1, 0.3}[rng.IntN(3)]
	s.MaxSteps = 2_000_000
	s.Epoll = rng.IntN(3) == 0
	s.closeEngine = rng.IntN(5) == 0
	s.closeExpire = rng.IntN(3) == 0

	sbs := []int{256, 512, 1024, 4096}[rng.IntN(4)]
	rbs := []int{256, 512, 2048}[rng.IntN(3)]
	cfg := Config{
		Queues:         1,
		NoPin:          true,
		SendPath:       SendPath(rng.IntN(3)),
		ZCThreshold:    sbs / (1 + rng.IntN(4)),
		ZCReprobe:      1 + rng.IntN(8),
		SendBufSize:    sbs,
		SendBufs:       1 + rng.IntN(3),
		RecvBufSize:    rbs,
		RecvBufs:       1 + rng.IntN(4),
		MaxQueuedBytes: sbs * (1 + rng.IntN(6)),
		CloseTimeout:   time.Hour, // never: a connection left to its close timer is a failure
		Debug:          DebugOptions{Buffers: rng.IntN(4) == 0},
	}
	cfg.SendPoolMax = cfg.SendBufSize * max(cfg.SendBufs, 2+rng.IntN(12))
	cfg.RecvPoolMax = cfg.RecvBufSize * max(cfg.RecvBufs, 2+rng.IntN(24))
	cfg.MaxRecvHeld = cfg.RecvBufSize * (1 + rng.IntN(6))
	misuses := 0
	cfg.Debug.OnMisuse = func(err error) { misuses++ }

	// The connections: more streams than the send pool serves at once. A crowd: a hundred
	// small streams on a pool that grows to serve many of them at once (many grants in one
	// turn).
	n := 3 + rng.IntN(10)
	kinds := []string{"streamer", "writer", "echo", "relay-front", "sink"}
	if s.crowd = rng.IntN(12) == 0; s.crowd {
		n = 70 + rng.IntN(60)
		kinds = []string{"streamer", "streamer", "writer", "writer", "echo"}
		cfg.MaxQueuedBytes = cfg.SendBufSize
		cfg.SendBufs = 16 + rng.IntN(32)
		cfg.SendPoolMax = cfg.SendBufSize * cfg.SendBufs * 8
	}
	for i := 0; i < n; i++ {
		r := &simConn{s: s, kind: kinds[rng.IntN(len(kinds))]}
		r.halfClose = rng.IntN(3) == 0
		r.bufferWait = rng.IntN(3) == 0
		s.plan = append(s.plan, r)
	}
	if !s.crowd && rng.IntN(3) == 0 {
		// FanOuts: publishers and subscribers, accepted among the others in any order.
		if err := s.planFans(); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}

	e, err := startFakeEngine(cfg, s)
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	s.e = e
	s.q = e.queues[0]
	s.l = &Listener{e: e, network: "tcp", family: unix.AF_INET, accept: s.accept, done: make(chan struct{})}
	s.q.Post(func() { s.begun = true })
	var failure string
	select {
	case failure = <-s.doneCh:
	case <-time.After(5 * time.Minute):
		// Not a timing assertion: a guard against a loop that stopped running at all.
		t.Fatalf("seed %d: the simulation did not end (the queue's loop is stuck)", seed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if s.engineClosed {
		e.shutdown(ctx) // closed already (the simulation's Engine.Close): stop its queue
	} else {
		e.CloseContext(ctx)
	}
	cancel()
	if failure == "" && misuses > 0 {
		failure = fmt.Sprintf("Config.Debug reported %d misuses", misuses)
	}

	st := simTotals{seeds: 1, steps: s.steps, conns: len(s.roles), counts: s.Acts, resets: s.Resets, enobufs: s.Enobufs, growRefused: s.GrowRefused,
		cancels: s.Cancels, expires: s.expires, lateSends: s.lateSends}
	if s.engineClosed {
		st.engineCloses = 1
	}
	st.fans, st.fanRemoves = len(s.fans), s.fanRemoves
	for _, sf := range s.fans {
		addFanStats(&st.fan, sf.f.Stats())
	}
	es := e.Stats()
	st.poolWaits, st.creditPauses, st.zcCopied, st.sendOps, st.zcOps = es.Send.PoolWaits, es.Recv.CreditPauses, es.Send.BytesZCCopied, es.Send.Ops, es.Send.ZCOps
	for _, r := range s.roles {
		if r.fc != nil {
			st.bytes += r.fc.KAcc
		}
	}
	if failure != "" {
		failure = fmt.Sprintf("config %+v\nepoll mode %v, engine close %v, close timeouts %v, crowd %v, weights %v, growth refused %.1f, dial failures %.1f, resets %.1f\n%s",
			cfgSummary(cfg), s.Epoll, s.closeEngine, s.closeExpire, s.crowd, s.Weight, s.GrowRefuse, s.DialFail, s.resetFrac, failure)
	}
	return st, failure
}

func cfgSummary(c Config) string {
	return fmt.Sprintf("SendPath %v ZCThreshold %d SendBufSize %d SendBufs %d SendPoolMax %d RecvBufSize %d RecvBufs %d RecvPoolMax %d MaxQueuedBytes %d MaxRecvHeld %d Debug.Buffers %v",
		c.SendPath, c.ZCThreshold, c.SendBufSize, c.SendBufs, c.SendPoolMax, c.RecvBufSize, c.RecvBufs, c.RecvPoolMax, c.MaxQueuedBytes, c.MaxRecvHeld, c.Debug.Buffers)
}

// startFakeEngine builds an engine of one queue over the fake kernel (what startEngine does
// for a real backend).
func startFakeEngine(cfg Config, s *simRun) (*Engine, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, listeners: map[*Listener]struct{}{}, done: make(chan struct{}), backend: BackendAuto}
	e.makeParts()
	e.dbg = newDebug(e, cfg.Debug)
	q := &queue{e: e, idx: 0, cpu: 0, space: make(chan struct{}, 1)}
	q.makeParts()
	lq, err := loop.Start(loop.Config{ID: 0, CPU: -1, NoPin: true}, func(lq *loop.Queue) (loop.Driver, error) {
		q.Queue = lq
		lq.AtStop(q.abortAll)
		k, err := fake.New((*beQueue)(q), s, &s.Options, &s.Counts)
		if err == nil {
			q.setBackend(k)
		}
		s.k = k
		return k.Driver(), err
	})
	if err != nil {
		return nil, err
	}
	_ = lq // q.Queue was set by init, on the loop, which already runs
	e.queues = []*queue{q}
	if e.dbg != nil {
		e.dbg.start()
	}
	return e, nil
}

// acceptNext accepts the next planned connection (loop only): a socketpair end stands for
// the accepted socket (nothing moves through it).
func (s *simRun) acceptNext() {
	s.acceptPosted = false
	if len(s.plan) == 0 {
		return
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		s.k.Failf("socketpair: %v", err)
		return
	}
	unix.Close(fds[1])
	s.l.create(s.q, fds[0])
}

// accept is the listener's accept function: the planned role's handler.
func (s *simRun) accept(c *Conn) Handler {
	r := s.plan[0]
	s.plan = s.plan[1:]
	s.roles = append(s.roles, r)
	r.c = c
	c.raddr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 1}), uint16(len(s.roles)))
	r.inKey = s.Rng.Int64N(1 << 40)
	fc := s.k.AddConn((*beConn)(c), r)
	switch r.kind {
	case "streamer", "writer":
		r.ownKey = s.Rng.Int64N(1 << 40)
		r.outKey = &r.ownKey
		r.total = int64(s.scale) * (1 + s.Rng.Int64N(24<<10))
		if s.crowd {
			r.total = int64(s.scale) * (1 + s.Rng.Int64N(int64(4*s.e.cfg.SendBufSize)))
		}
	case "echo":
		r.outKey = &r.inKey
		r.pausable = s.Rng.IntN(2) == 0
	case "sink":
		r.pausable = s.Rng.IntN(2) == 0
	case "fan-pub":
		r.total = int64(s.scale) * (1 + s.Rng.Int64N(24<<10))
	case "fan-sub":
		r.outKey = &r.ownKey // (its bytes are checked against the fans' messages: takeFan)
	case "relay-front":
		back := &simConn{s: s, kind: "relay-back", partner: r, inKey: s.Rng.Int64N(1 << 40)}
		r.partner = back
		r.outKey, back.outKey = &back.inKey, &r.inKey
	}
	s.SetupPeer(fc)
	switch r.kind {
	case "streamer":
		h := &simStreamer{simBase{r}}
		if s.Rng.IntN(2) == 0 {
			h.pump(c) // sends queued by the accept function
		} else {
			c.Post(func() { h.pump(c) })
		}
		return h
	case "writer":
		h := &simWriter{simBase: simBase{r}}
		c.Post(func() { h.pump(c) })
		return h
	case "echo":
		return &simEcho{simBase{r}}
	case "sink":
		return &simSink{simBase{r}}
	case "fan-pub", "fan-sub":
		return s.acceptFan(r, c)
	}
	// relay-front: hold the client until the backend is connected.
	back := r.partner
	c.SetReceivePaused(true)
	s.dialRoles = append(s.dialRoles, back)
	s.roles = append(s.roles, back)
	err := s.e.DialAsync(context.Background(), "tcp", "127.0.0.1:9", HandlerFuncs{}, func(bc *Conn, err error) {
		if err != nil {
			back.dialErr = err
			c.Close()
			return
		}
		back.c = bc
		rs, err := Relay(c, bc)
		if err != nil {
			r.failf("Relay: %v", err)
			return
		}
		r.relay, back.relay = rs, rs
	})
	if err != nil {
		r.failf("DialAsync: %v", err)
		s.dialRoles = s.dialRoles[:len(s.dialRoles)-1]
	}
	return &simHolder{r: r}
}

// setupPeer draws the peer of a connection.
func (s *simRun) SetupPeer(fc *fake.Conn) {
	r, ok := fc.Role.(*simConn)
	if !ok {
		r = &simConn{kind: fc.Role.Name()}
	}
	cfg := &s.e.cfg
	fc.InKey, fc.OutKey = r.inKey, r.outKey
	switch r.kind {
	case "streamer", "writer":
		fc.InTotal = s.Rng.Int64N(int64(2 * cfg.RecvBufSize))
		fc.NoFin = !r.halfClose && s.Rng.IntN(3) == 0
	default:
		fc.InTotal = int64(s.scale) * (1 + s.Rng.Int64N(16<<10))
		if s.crowd {
			fc.InTotal = int64(s.scale) * (1 + s.Rng.Int64N(2<<10))
		}
	}
	fc.Window = int64(cfg.RecvBufSize) * (1 + s.Rng.Int64N(8))
	fc.SndCap = 1 + s.Rng.Int64N(int64(4*cfg.SendBufSize))
	fc.ResetOK = s.Rng.Float64() < s.resetFrac
	fc.Stall = s.closeExpire && s.Rng.IntN(2) == 0
}

// check runs once nothing can happen any more and every connection finished (loop only).
func (s *simRun) check() string {
	var errs []string
	bad := func(r *simConn, format string, args ...any) {
		errs = append(errs, fmt.Sprintf("%v: %s (%s)\n    %s", r.fc, fmt.Sprintf(format, args...), r.state(), strings.Join(r.fc.Trace, "\n    ")))
	}
	for _, r := range s.roles {
		if r.appOut != 0 {
			bad(r, "%d SendBytes callbacks never ran", r.appOut)
		}
		fc := r.fc
		if fc == nil {
			if r.dialErr == nil {
				bad(r, "never dialed")
			}
			continue
		}
		c := connOf(fc)
		closeErr := c.closeErr
		switch r.kind {
		case "streamer", "writer", "echo", "sink", "fan-pub", "fan-sub":
			if r.closes != 1 {
				bad(r, "OnClose ran %d times", r.closes)
			}
			if r.kind == "fan-pub" || r.kind == "fan-sub" {
				r.accepted = fc.KAcc // the FanOut queued its sends: checked by checkFan
				for _, e := range s.checkFan(r) {
					bad(r, "%s", e)
				}
			}
		case "relay-front", "relay-back":
			if r.relay != nil {
				if r.kind == "relay-front" {
					r.accepted = int64(r.relay.BtoA.Load())
				} else {
					r.accepted = int64(r.relay.AtoB.Load())
				}
			}
		}
		if r.dialErr != nil {
			if fc.KAcc != 0 || r.accepted != 0 {
				bad(r, "dial failed, yet %d bytes were sent", fc.KAcc)
			}
			continue
		}
		// Exactly once, in order (checked as the kernel took them), and nothing lost unless
		// the connection failed.
		switch {
		case fc.KAcc > r.accepted:
			bad(r, "the kernel took %d bytes, the handler had %d accepted", fc.KAcc, r.accepted)
		case closeErr == nil && fc.KAcc != r.accepted:
			bad(r, "closed without error, but only %d of %d accepted bytes reached the kernel", fc.KAcc, r.accepted)
		}
		for _, e := range s.checkDropped(r, closeErr) {
			bad(r, "%s", e)
		}
		if closeErr == nil && !fc.Reset && !s.engineClosed {
			switch r.kind {
			case "streamer", "writer":
				if r.accepted != r.total {
					bad(r, "closed without error after sending %d of %d bytes", r.accepted, r.total)
				}
			case "echo":
				if r.accepted != fc.InTotal {
					bad(r, "closed without error after echoing %d of %d bytes", r.accepted, fc.InTotal)
				}
			case "sink":
				if r.recvd != fc.InTotal {
					bad(r, "closed without error after receiving %d of %d bytes", r.recvd, fc.InTotal)
				}
			case "relay-front":
				p := r.partner
				if p.fc != nil && p.dialErr == nil && p.c.closeErr == nil && !p.fc.Reset && r.relay != nil {
					if r.relay.AtoB.Load() != uint64(fc.InTotal) || r.relay.BtoA.Load() != uint64(p.fc.InTotal) {
						bad(r, "relay ended cleanly having forwarded %d of %d and %d of %d bytes",
							r.relay.AtoB.Load(), fc.InTotal, r.relay.BtoA.Load(), p.fc.InTotal)
					}
				}
			}
		}
		if fc.Rud != 0 || fc.Sud != 0 || len(fc.Notifs) > 0 || fc.Cud != 0 {
			bad(r, "operations left in the kernel after it finished")
		}
	}
	errs = append(errs, s.checkFanTotals()...)
	q := s.q
	if f, n := q.send.Free(), q.send.Buffers(); f != n {
		errs = append(errs, fmt.Sprintf("send pool: %d of %d buffers back", f, n))
	}
	if f, n := s.k.Recv().Free(), s.k.Recv().Buffers(); f != n {
		errs = append(errs, fmt.Sprintf("receive pool: %d of %d buffers back", f, n))
	}
	if n := q.notifsPending.Load(); n != 0 {
		errs = append(errs, fmt.Sprintf("%d notifications pending", n))
	}
	if n := s.e.shareCtr.appHeld.Load(); n != 0 {
		errs = append(errs, fmt.Sprintf("%d SendBytes slices still pinned", n))
	}
	// Stray events: none, except a connect completing after Engine.Close gave up on it.
	if ls := q.Queue.Stats(); ls.OpsLive != 0 || ls.Stray != 0 && !s.engineClosed {
		errs = append(errs, fmt.Sprintf("operations live %d, stray events %d", ls.OpsLive, ls.Stray))
	}
	q.wmu.Lock()
	if len(q.waiters) != 0 || len(q.waiting) != 0 || len(q.granted) != 0 {
		errs = append(errs, fmt.Sprintf("pool waiters left: %d waiting, %d in the map, %d granted", len(q.waiters), len(q.waiting), len(q.granted)))
	}
	q.wmu.Unlock()
	if n := q.ctr.notifsUnexpected.Load(); n != 0 {
		errs = append(errs, fmt.Sprintf("%d unexpected notifications", n))
	}
	return strings.Join(errs, "\n")
}

// checkDropped checks that the losses are reported (simRun.check): what the handler had
// accepted and the kernel never took is what the core counted as dropped
// (ConnStats.BytesDropped), and a close that gave up with sends queued (fake.ActCloseExpire)
// ends with a *CloseTimeoutError whose Unsent is that count. A FanOut subscriber's accepted
// bytes are the FanOut's (only Unsent = BytesDropped is checked there).
func (s *simRun) checkDropped(r *simConn, closeErr error) []string {
	var errs []string
	fc := r.fc
	lost := r.accepted - fc.KAcc
	dropped := int64(connOf(fc).droppedBytes())
	if r.kind != "fan-sub" && lost != dropped {
		errs = append(errs, fmt.Sprintf("accepted %d, the kernel took %d, yet BytesDropped is %d", r.accepted, fc.KAcc, dropped))
	}
	var te *CloseTimeoutError
	timedOut := errors.As(closeErr, &te)
	switch {
	case fc.Expired && !timedOut:
		errs = append(errs, fmt.Sprintf("the close gave up with sends queued, yet OnClose got %v", closeErr))
	case timedOut && !fc.Expired:
		errs = append(errs, fmt.Sprintf("OnClose got %v, yet no close gave up with work", closeErr))
	case timedOut && (int64(te.Unsent) != dropped && !fc.Late || int64(te.Unsent) > dropped):
		errs = append(errs, fmt.Sprintf("the close gave up: Unsent %d, BytesDropped %d (accepted %d, taken %d)", te.Unsent, dropped, r.accepted, fc.KAcc))
	case timedOut && !errors.Is(closeErr, ErrCloseTimeout):
		errs = append(errs, fmt.Sprintf("OnClose's %v does not match ErrCloseTimeout", closeErr))
	}
	return errs
}

// ---- handlers ------------------------------------------------------------------------

// simBase records the events every test handler sees.
type simBase struct{ r *simConn }

func (h *simBase) OnData(c *Conn, d Data) {
	h.checkData(c, d)
	d.Release()
}

// checkData checks that d is the peer's next bytes.
func (h *simBase) checkData(c *Conn, d Data) {
	r := h.r
	if r.closes > 0 {
		r.failf("OnData after OnClose")
	}
	if !fake.Matches(d.Bytes(), r.inKey, r.recvd) {
		r.failf("OnData: bytes %d..%d are not the peer's", r.recvd, r.recvd+int64(d.Len()))
	}
	r.recvd += int64(d.Len())
}

func (h *simBase) OnEOF(c *Conn, err error) {
	if h.r.closes > 0 {
		h.r.failf("OnEOF after OnClose")
	}
	if h.r.eof {
		h.r.failf("OnEOF twice")
	}
	h.r.eof = true
	if err == io.EOF && h.r.wroteAll {
		h.close(c) // half-closed when done: the peer's EOF ends it
	}
}

// done ends a sender's stream: Close, or CloseWrite and Close at the peer's EOF.
func (h *simBase) done(c *Conn) {
	r := h.r
	if !r.halfClose {
		h.close(c)
		return
	}
	if r.wroteAll {
		return
	}
	r.wroteAll = true
	if err := c.CloseWrite(); err != nil {
		h.unexpected(c, "CloseWrite", err)
		return
	}
	if r.eof {
		h.close(c)
	}
}

func (h *simBase) OnClose(c *Conn, err error) {
	h.r.closes++
	h.r.closeErr = err
}

// unexpected records an error a handler should not have met (it only runs while its
// connection is open).
func (h *simBase) unexpected(c *Conn, what string, err error) {
	h.r.failf("%s: %v", what, err)
	h.close(c)
}

func (h *simBase) close(c *Conn) {
	if !h.r.closing {
		h.r.fc.Tracef("Close")
		h.r.closing = true
		c.Close()
	}
}

// simStreamer is ExampleWritable's streamer: Buffer/Send until MaxQueuedBytes is queued,
// ErrExhausted means OnWritable follows.
type simStreamer struct{ simBase }

func (h *simStreamer) OnWritable(c *Conn) { h.pump(c) }

func (h *simStreamer) pump(c *Conn) {
	r := h.r
	if r.closes > 0 {
		r.failf("OnWritable after OnClose")
		return
	}
	max := r.s.e.cfg.MaxQueuedBytes
	for r.accepted < r.total && c.Queued() < max {
		if r.s.Rng.IntN(4) == 0 {
			h.sendBytes(c)
			continue
		}
		var b memreg.Buf
		var err error
		if r.bufferWait {
			b, err = c.BufferWait(0)
			if errors.Is(err, ErrWouldBlock) {
				return // OnWritable follows
			}
		} else {
			b, err = c.Buffer()
			if errors.Is(err, memreg.ErrExhausted) {
				return // OnWritable follows
			}
		}
		if err != nil {
			h.unexpected(c, "Buffer", err)
			return
		}
		if r.s.Rng.IntN(12) == 0 {
			b.Release() // changed its mind: the buffer goes back (to the next waiter)
			continue
		}
		n := int(min(int64(len(b.Bytes())), r.total-r.accepted))
		if r.s.Rng.IntN(3) == 0 {
			n = 1 + r.s.Rng.IntN(n)
		}
		fake.Stream(b.Bytes()[:n], *r.outKey, r.accepted)
		if err := c.Send(b, n); err != nil {
			h.unexpected(c, "Send", err)
			return
		}
		r.accepted += int64(n)
	}
	if r.accepted == r.total {
		h.done(c)
	}
}

// sendBytes sends the next bytes of the stream from a slice of the application's own
// (SendBytes). Its callback, when it has one, must run exactly once and only once the
// kernel is done: it scribbles over the slice, so a callback that ran early shows as
// damaged bytes at the peer (and the fake kernel's notification check).
func (h *simStreamer) sendBytes(c *Conn) {
	r := h.r
	if r.s.Rng.IntN(3) == 0 {
		// A header written before the body: Write's staging buffer stays open across
		// the flush the SendBytes makes (flushStageLocked(true)), shared with its send.
		hdr := make([]byte, int(min(int64(1+r.s.Rng.IntN(64)), r.total-r.accepted)))
		fake.Stream(hdr, *r.outKey, r.accepted)
		k, err := c.Write(hdr)
		r.accepted += int64(k)
		if err != nil {
			if !errors.Is(err, ErrWouldBlock) {
				h.unexpected(c, "Write", err)
			}
			return // ErrWouldBlock: OnWritable follows
		}
		if r.accepted == r.total {
			return
		}
	}
	n := int(min(int64(1+r.s.Rng.IntN(24<<10)), r.total-r.accepted))
	p := make([]byte, n)
	fake.Stream(p, *r.outKey, r.accepted)
	var done func(error)
	if r.s.Rng.IntN(4) != 0 {
		called := false
		done = func(err error) {
			if called {
				r.failf("a SendBytes callback ran twice")
			}
			called = true
			r.appOut--
			for i := range p {
				p[i] = 0xA5
			}
		}
		r.appOut++
	}
	if err := c.SendBytes(p, done); err != nil {
		if done != nil {
			r.appOut--
		}
		h.unexpected(c, "SendBytes", err)
		return
	}
	r.accepted += int64(n)
}

// simWriter writes with Write on the loop: ErrWouldBlock means OnWritable follows.
type simWriter struct {
	simBase
	buf []byte
}

func (h *simWriter) OnWritable(c *Conn) { h.pump(c) }

func (h *simWriter) pump(c *Conn) {
	r := h.r
	if r.closes > 0 {
		r.failf("OnWritable after OnClose")
		return
	}
	sbs := r.s.e.cfg.SendBufSize
	for r.accepted < r.total {
		n := int(min(int64(1+r.s.Rng.IntN(3*sbs)), r.total-r.accepted))
		if cap(h.buf) < n {
			h.buf = make([]byte, n)
		}
		p := h.buf[:n]
		fake.Stream(p, *r.outKey, r.accepted)
		w, err := c.Write(p)
		r.fc.Tracef("Write(%d) = %d, %v (queued %d)", n, w, err, c.Queued())
		if w < 0 || w > n {
			r.failf("Write returned %d of %d", w, n)
			return
		}
		r.accepted += int64(w)
		if errors.Is(err, ErrWouldBlock) {
			return // OnWritable follows
		}
		if err != nil {
			h.unexpected(c, "Write", err)
			return
		}
		if w != n {
			r.failf("Write returned %d of %d and no error", w, n)
		}
	}
	h.done(c)
}

// simEcho sends back what arrives with SendData; it closes at the peer's EOF.
type simEcho struct{ simBase }

func (h *simEcho) OnData(c *Conn, d Data) {
	r := h.r
	h.checkData(c, d)
	if r.closing {
		d.Release()
		return
	}
	n := d.Len()
	// Shared buffers: a quarter of the time the echo keeps a second reference to what it
	// sends back (released later from outside the loop), another quarter it sends the
	// reference and keeps the Data: either way the buffer (and the receive credit) must
	// come back only with the last of the two.
	switch r.s.Rng.IntN(4) {
	case 0, 1:
		ref, err := d.Retain()
		if err != nil {
			h.unexpected(c, "Retain", err)
			d.Release()
			return
		}
		if r.s.Rng.IntN(2) == 0 {
			d, ref = ref, d
		}
		r.held = append(r.held, ref)
	}
	if err := c.SendData(d); err != nil {
		h.unexpected(c, "SendData", err)
		return
	}
	r.accepted += int64(n)
}

func (h *simEcho) OnEOF(c *Conn, err error) {
	h.simBase.OnEOF(c, err)
	if err == io.EOF {
		h.close(c)
	}
}

// simHolder is a relay's client side until the backend is connected (Relay replaces it).
type simHolder struct{ r *simConn }

func (h *simHolder) OnData(c *Conn, d Data) {
	h.r.failf("OnData while held paused")
	d.Release()
}
func (h *simHolder) OnEOF(c *Conn, err error)   {}
func (h *simHolder) OnClose(c *Conn, err error) {}

// simSink keeps some of what arrives (the scheduler releases it later, as an application
// releasing from another goroutine) and closes at the peer's EOF once it released all.
type simSink struct{ simBase }

func (h *simSink) OnData(c *Conn, d Data) {
	h.checkData(c, d)
	if h.r.s.Rng.IntN(3) == 0 {
		d.Release()
		return
	}
	h.r.held = append(h.r.held, d)
}

func (h *simSink) OnEOF(c *Conn, err error) {
	h.simBase.OnEOF(c, err)
	if err == io.EOF && len(h.r.held) == 0 {
		h.close(c)
	}
}

// ---- the fake kernel's side of the test (fake.Sim) ----------------------------------------

// connOf is the test's *Conn of the fake kernel's connection.
func connOf(fc *fake.Conn) *Conn { return (*Conn)(fc.B.(*beConn)) }

func (r *simConn) Name() string         { return r.kind }
func (r *simConn) Attach(fc *fake.Conn) { r.fc = fc }

func (s *simRun) Begun() bool { return s.begun }

func (s *simRun) PostAccept() {
	s.acceptPosted = true
	s.q.Post(s.acceptNext)
}

// dialRole is the role of the next DialAsync (its roles queue in dialRoles).
func (s *simRun) DialRole() fake.Role {
	if len(s.dialRoles) == 0 {
		return nil
	}
	r := s.dialRoles[0]
	s.dialRoles = s.dialRoles[1:]
	return r
}

func (s *simRun) EngineActs(a []fake.Act) []fake.Act {
	if s.closeEngine && !s.engineClosed {
		a = append(a, fake.Act{Kind: fake.ActEngineClose})
	}
	return a
}

func (s *simRun) CloseActs(fc *fake.Conn, a []fake.Act) []fake.Act {
	c := connOf(fc)
	if s.closeExpire && c.inClose() && !c.ended() && c.closeErr == nil && !c.st.SockClosed() {
		// A graceful close waiting for its sends: CloseTimeout may pass now.
		a = append(a, fake.Act{Kind: fake.ActCloseExpire, FC: fc})
	}
	if s.closeExpire && c.inClose() && !c.ended() && c.st.SockClosed() && fc.Sud != 0 {
		// The socket is closed and a send is still in the kernel (its cancel has not
		// ended it yet): the second deadline may pass now, and the connection finish
		// with it in flight.
		a = append(a, fake.Act{Kind: fake.ActCloseExpire2, FC: fc})
	}
	return a
}

func (s *simRun) AppActs(fc *fake.Conn, a []fake.Act) []fake.Act {
	c := connOf(fc)
	r, ok := fc.Role.(*simConn)
	if !ok {
		return a
	}
	if len(r.held) > 0 {
		a = append(a, fake.Act{Kind: fake.ActAppRelease, FC: fc}) // even after OnClose: the Data is the application's
	}
	if r.pausable && c.opened() && !c.inClose() {
		a = append(a, fake.Act{Kind: fake.ActUserPause, FC: fc}) // the application's, not the peer's
	}
	return a
}

// doAct performs an action of the application or the engine (loop only).
func (s *simRun) DoAct(a fake.Act) {
	fc := a.FC
	switch a.Kind {
	case fake.ActEngineClose:
		// Engine.Close while everything runs: no more connections, each one closed
		// gracefully (queued bytes still go out), dials cancelled.
		if s.Rng.IntN(30) == 0 {
			s.engineClosed = true
			s.plan = nil
			s.q.e.closed.Store(true)
			s.q.Post(s.q.closeAll)
			s.k.Tracef("engine close")
		}
	case fake.ActAppRelease:
		// The application releases a Data it kept (from its own goroutine, as it may).
		r := fc.Role.(*simConn)
		i := s.Rng.IntN(len(r.held))
		d := r.held[i]
		r.held = append(r.held[:i], r.held[i+1:]...)
		if err := d.Release(); err != nil {
			s.k.Failf("%v: Release of held data: %v", fc, err)
		}
		fc.Tracef("app-release (%d held)", len(r.held))
		if len(r.held) == 0 && r.eof && !r.closing {
			r.closing = true
			connOf(fc).Close()
		}
	case fake.ActUserPause:
		c := connOf(fc)
		on := c.paused&pauseUser == 0
		c.Post(func() { c.SetReceivePaused(on) })
	case fake.ActCloseExpire:
		// CloseTimeout passes (its timer is an hour away: the deadline moves instead). With
		// sends still queued the close gives up: the sends are aborted, the one in flight
		// cancelled, and OnClose must get a *CloseTimeoutError.
		c := connOf(fc)
		c.mu.Lock()
		producer := len(c.out) > 0 || c.staged() || c.holdClose
		c.mu.Unlock()
		if c.pendLen() > 0 || s.k.Sending(fc.B) || producer {
			fc.Expired = true
			s.expires++
		}
		fc.Tracef("close-expire (work %v, sending %v, pend %d)", fc.Expired, s.k.Sending(fc.B), c.pendLen())
		s.k.Tracef("%v: close-expire (work %v)", fc, fc.Expired)
		c.cl.deadline = time.Now().Add(-time.Nanosecond)
		c.advanceClose()
	case fake.ActCloseExpire2:
		// Twice CloseTimeout passed: the connection finishes with its send in flight. Its
		// buffers must stay lent until that send completes (doSend checks them).
		c := connOf(fc)
		fc.Tracef("close-expire-2 (ops %d, pend %d)", c.ops, c.pendLen())
		s.k.Tracef("%v: close-expire-2", fc)
		c.cl.deadline = time.Now().Add(-2*c.e.cfg.CloseTimeout - time.Nanosecond)
		c.advanceClose()
		if c.ended() && fc.Sud != 0 {
			fc.Late = true
			s.lateSends++
		}
	}
}

// queueState describes the queue's send pool and waiters (loop only).
func (s *simRun) QueueState() string {
	k, q := s.k, s.q
	q.wmu.Lock()
	defer q.wmu.Unlock()
	var w []string
	for _, x := range q.waiters {
		if x.c != nil {
			w = append(w, fmt.Sprint(k.ConnOf((*beConn)(x.c)).ID))
		} else {
			w = append(w, "goroutine")
		}
	}
	return fmt.Sprintf("queue: %d conns, send pool %d/%d free (cap %d, memlock-capped %v), recv pool %d/%d free, waiters [%s], granted %d, grantsUp %v, starved %d",
		len(q.conns), q.send.Free(), q.send.Buffers(), q.send.MaxBytes()/q.send.BufSize(), q.memCap.Load(),
		k.Recv().Free(), k.Recv().Buffers(), strings.Join(w, " "), len(q.granted), q.grantsUp.Load(), k.Starved())
}

// describe is engineDump's line for one connection plus the fake kernel's view (loop only).
func (s *simRun) Describe(fc *fake.Conn) string {
	c, r := connOf(fc), fc.Role.(*simConn)
	c.mu.Lock()
	out, queued, kicked, staged, werr := len(c.out), c.queued, c.kicked, c.staged(), c.werr
	c.mu.Unlock()
	_, waiting := s.q.waiting[c]
	return fmt.Sprintf("  %v: pend %d out %d staged %v queued %d kicked %v ops %d zwait %d armed %v paused %b held %d eof %v closing %v fdClosed %v werr %v poolWaiter %v | fake: rud %d cancel %v sud %d notifs %d rcvq %d in %d/%d/%d fin %v sndq %d/%d kAcc %d reset %v | test: %s",
		fc, c.pendLen(), out, staged, queued, kicked, c.ops, c.zwaitLen(), c.recvArmed, c.paused, c.held.Load(), c.eof, c.inClose(), c.st.SockClosed(), werr, waiting,
		fc.Rud, fc.Rcancel, fc.Sud, len(fc.Notifs), fc.Rcvq, fc.InRecv, fc.InWrote, fc.InTotal, fc.FinSent, fc.Sndq, fc.SndCap, fc.KAcc, fc.Reset, r.state())
}
