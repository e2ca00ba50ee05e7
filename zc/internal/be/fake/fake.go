// Package fake is a fake kernel for zc's connection core: the backend and loop driver of the
// interleaving test (zc/interleave_test.go, zc/fake_cases_test.go). It imports only the
// backends' contract (zc/internal/becontract) and the floors, as the real backends do.
//
// Kernel is both a queue's loop.Driver and its backend: no byte moves through a real
// socket. Its Wait runs a seeded scheduler that picks, at random, one of the things a kernel
// (or the peer behind it) could do next and does it: complete a send (whole, short, EAGAIN,
// or failed after a reset), deliver a zero-copy notification (out of order, copied or not),
// complete a receive (a random number of bytes into a buffer of the queue's receive pool,
// ENOBUFS when the pool is dry, EOF after the peer's FIN, ECONNRESET, ECANCELED after a
// stop), end a multishot receive, complete a connect, let the peer write, read (drain the
// simulated socket send buffer) or send its FIN, reset a connection, accept a new one, and
// what the application does from outside (pause a receiver, release kept Data, Engine.Close).
// Events reach the core through Queue.Dispatch and OnEvent as io_uring completions do (the
// same calls as zc/internal/be/uring), so the core cannot tell the difference. In epoll mode
// it plays the plain backend instead (zc/internal/be/epoll's calls: writev at once with short
// writes and EAGAIN, then EPOLLOUT; reads on EPOLLIN; no zero-copy).
//
// It is a becontract.Backend, set on the queue as the real backends are (setBackend), and as
// a backend it sees a connection only as a becontract.Conn (Conn.B): the core calls it and
// hears its reports through the same contract as the backends' packages. Everything else
// it needs of zc (the application's and the engine's actions and their conditions, the
// peers' draws, the FanOut check, the core's state for a report) it asks the test through
// Sim, which interleave_test.go's simRun implements (a package outside zc can read none of
// zc's private state: the compiler holds the seam).
//
// The send pool is the queue's own (zc/queue.go: waiters, grants), its growth sometimes
// refused as RLIMIT_MEMLOCK would; the receive pool is small, so receives meet ENOBUFS.
//
// Connections are real descriptors (an AF_UNIX socketpair end, or the unconnected socket
// DialAsync makes) so the raw calls the core makes on c.fd (shutdown, SO_LINGER,
// TCP_NODELAY) are harmless; everything they carry goes through the fake.
package fake

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/zc/internal/becontract"
)

// table is the content of every simulated byte stream: stream key k at offset off carries
// table[(k+off)%len]. A prime length, so a shifted, repeated or dropped range shows.
var table = func() []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, 65521)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}()

// Stream fills p with stream key's bytes from offset off.
func Stream(p []byte, key, off int64) {
	i := int((key + off) % int64(len(table)))
	for len(p) > 0 {
		k := copy(p, table[i:])
		p = p[k:]
		i = 0
	}
}

// Matches reports whether p is stream key's bytes from offset off.
func Matches(p []byte, key, off int64) bool {
	i := int((key + off) % int64(len(table)))
	for len(p) > 0 {
		k := min(len(p), len(table)-i)
		if !bytes.Equal(p[:k], table[i:i+k]) {
			return false
		}
		p = p[k:]
		i = 0
	}
	return true
}

// notif is a zero-copy send whose notification is still to come: the bytes the kernel
// took, to check that the buffer was not reused before the notification.
type notif struct {
	ud   uint64
	mem  []byte // the buffer's memory the send covered
	want []byte // what it held when the send completed
}

// held is a segment of a cancelled send in flight: what it held.
type held struct {
	mem  []byte
	want []byte
}

// Conn is the fake kernel's side of one connection: its socket buffers and its peer.
type Conn struct {
	k    *Kernel
	ID   int
	B    becontract.Conn // the connection, as the contract shows it to a backend
	Role Role            // the test's view (interleave_test.go's *simConn)

	// The peer's stream toward the connection: key, total, written so far, not yet received.
	InKey            int64
	InTotal, InWrote int64
	InRecv           int64 // delivered to the core
	Rcvq             int64 // written, not yet received
	Window           int64 // the peer stops writing while rcvq is at the window
	FinSent          bool
	NoFin            bool // the peer never half-closes (the connection closes itself)

	// The connection's stream toward the peer: what the kernel accepted (checked against
	// outKey's bytes as it is taken), and the socket send buffer the peer drains.
	OutKey *int64 // nil: the connection sends nothing (a sink)
	KAcc   int64
	// other: the test checks its sends (takeOther: a FanOut subscriber's are published
	// messages, interleave_fanout_test.go)
	Other  bool
	Sndq   int64
	SndCap int64

	ResetOK bool // this connection may be reset by its peer
	Reset   bool
	closed  bool // closeSocket ran
	// stall: the peer stops reading once the connection closes (its close can only end by
	// CloseTimeout: ActCloseExpire); expired: CloseTimeout passed with sends still queued
	Stall   bool
	Expired bool
	// late: the connection finished with a send in the kernel (ActCloseExpire2); what that
	// send does not take is dropped after OnClose, so Unsent may be below BytesDropped
	Late bool

	// Operations in the fake kernel.
	Rud     uint64 // the receive (0: none); epoll mode: the registration
	rmulti  bool
	Rcancel bool
	rbuf    memreg.Buf // the buffer of the receive completion being dispatched
	Sud     uint64     // the send in flight
	Szc     bool
	ssegs   int
	sbytes  int64
	Notifs  []notif
	// sloans: the loans of the send's segments, which must stand until it completes.
	// scancel: the core cancelled the send in flight (cancelSend, on an abort); it completes
	// later with -ECANCELED or the part it took. sheld: its segments' bytes at the cancel,
	// which must stay unchanged until that completion.
	sloans  []memreg.Loan
	Scancel bool
	sheld   []held
	Cud     uint64 // the connect
	ccancel bool

	Trace []string
}

// tracef records an event of this connection; the last ones are kept.
func (fc *Conn) Tracef(format string, args ...any) {
	const traceLen = 30
	if len(fc.Trace) == traceLen {
		copy(fc.Trace, fc.Trace[1:])
		fc.Trace = fc.Trace[:traceLen-1]
	}
	fc.Trace = append(fc.Trace, fmt.Sprintf("%d: ", fc.k.steps)+fmt.Sprintf(format, args...))
}

func (fc *Conn) String() string {
	return fmt.Sprintf("Conn %d (%s)", fc.ID, fc.Role.Name())
}

// OnEvent handles the fake completions as zc/internal/be/uring handles io_uring's.
func (fc *Conn) OnEvent(lq *loop.Queue, ev loop.Event) {
	c := fc.B
	k := fc.k
	more := ev.Flags&uring.CQEFMore != 0
	switch ev.Tag {
	case becontract.TagRecv:
		if k.epoll {
			k.onReady(fc, ev.Flags)
			return
		}
		k.onRecv(fc, ev, more)
	case becontract.TagSend:
		k.FreeOp(c, ev.UD)
		fk(c).tx.ud, fk(c).tx.segs = 0, 0
		becontract.AfterSend(c, ev.Res, &fk(c).tx.pollFirst)
	case becontract.TagSendZC:
		if ev.Flags&uring.CQEFNotif != 0 {
			c.ZCNotified(ev.UD, uint32(ev.Res)&uring.NotifUsageZCCopied != 0)
			return
		}
		fk(c).tx.ud, fk(c).tx.segs, fk(c).tx.zcOp = 0, 0, false
		becontract.AfterSendZC(c, ev.UD, ev.Res, more, &fk(c).tx.pollFirst)
	case becontract.TagConnect:
		k.FreeOp(c, ev.UD)
		fc.Cud = 0
		c.DialDone(ev.Res)
	default:
		k.Failf("%v: event with tag %d", fc, ev.Tag)
	}
}

// Sim is the test's side of the fake kernel (interleave_test.go's simRun): the
// application's and the engine's actions and the facts of zc's core they are scheduled by,
// the peers' draws, the FanOut check of a subscriber's sends, and the core's state in a
// failure's report. The kernel half of this file reaches zc only through it, the contract
// (Conn.B), its *loop.Queue and becontract.Queue: the seam a package zc/internal/be/fake
// would keep (doc/notes/issue-30-s13-floor30b.md).
type Sim interface {
	// simBegun: the run began (before, Wait only waits for the loop's wake-ups).
	Begun() bool
	// pendingAccepts is the number of accepts the test wants now; postAccept posts the next
	// on the loop.
	PendingAccepts() int
	PostAccept()
	// dialRole is the role of the connection being dialed (nil: none, a failure).
	DialRole() Role
	// setupPeer draws fc's peer (its streams, window, send buffer, resets, stalls).
	SetupPeer(fc *Conn)
	// engineActs, closeActs and appActs append the actions of the engine (Close), of fc's
	// CloseTimeout and of fc's application enabled now, at their places in enabled()'s
	// list (the order of the random draws depends on it); doAct performs one of them.
	EngineActs(a []Act) []Act
	CloseActs(fc *Conn, a []Act) []Act
	AppActs(fc *Conn, a []Act) []Act
	DoAct(a Act)
	// takeOther checks p, the next bytes of segment s that fc's send takes, for a
	// connection without a stream of its own (a FanOut subscriber).
	TakeOther(fc *Conn, s becontract.Seg, p []byte) bool
	// describe and queueState are the core's state for a failure's report.
	Describe(fc *Conn) string
	QueueState() string
	// done: the run ended (failure "" if none).
	Done(failure string, steps int)
}

// Role is the test's role of a connection (a *simConn), or a placeholder's name until
// the test gives one.
type Role interface {
	Name() string
	Attach(fc *Conn) // the role's connection in the fake kernel
}

type Placeholder string

func (n Placeholder) Name() string { return string(n) }
func (Placeholder) Attach(*Conn)   {}

// Options are a run's draws the kernel acts by (simRun embeds them).
type Options struct {
	Rng        *rand.Rand
	Weight     [NActKinds]int
	GrowRefuse float64 // chance that a send pool growth is refused for lack of locked memory
	Epoll      bool
	DialFail   float64 // chance that a connect is refused
	MaxSteps   int
}

// Counts is what the kernel counts (simRun embeds it).
type Counts struct {
	Acts                         [NActKinds]int
	Resets, Enobufs, GrowRefused int
	Cancels                      int // sends cancelled in flight
}

// Kernel is a queue's driver and backend.
type Kernel struct {
	bq   becontract.Queue
	lq   *loop.Queue
	sim  Sim // the test (interleave_test.go)
	opt  *Options
	cnt  *Counts
	rng  *rand.Rand
	recv *memreg.Pool

	conns   []*Conn // in creation order (the scheduler iterates these: no map order)
	byConn  map[becontract.Conn]*Conn
	starved []becontract.Conn // waiting for a receive buffer
	wakeReq bool

	growRefuse float64 // chance that a send pool growth is refused for lack of locked memory
	// epoll: readiness mode, as the plain backend (zc/internal/be/epoll): sends are written at once
	// (short writes, EAGAIN, then EPOLLOUT), receives read on EPOLLIN; no zero-copy.
	epoll    bool
	Tame     bool // scripted cases: sends take all they can at once (no EAGAIN, no short writes)
	initDone bool

	steps    int
	maxSteps int
	acts     []Act
	Failure  string
	Trace    []string // the last actions (a failure shows them)
	quiet    bool     // reported quiescence (or a failure): Wait now only waits for the eventfd
}

func New(bq becontract.Queue, sim Sim, opt *Options, cnt *Counts) (*Kernel, error) {
	cfg := bq.Config()
	k := &Kernel{bq: bq, lq: bq.Loop(), sim: sim, opt: opt, cnt: cnt, rng: opt.Rng, byConn: map[becontract.Conn]*Conn{},
		growRefuse: opt.GrowRefuse, maxSteps: opt.MaxSteps, epoll: opt.Epoll}
	var err error
	k.recv, err = memreg.NewPool(cfg.Pool(memreg.PoolOptions{BufSize: cfg.RecvBufSize, Initial: cfg.RecvBufs,
		MaxBytes: cfg.RecvPoolMax, OnFree: k.recvFreed}, false))
	if err != nil {
		return nil, err
	}
	send, err := memreg.NewPool(cfg.Pool(memreg.PoolOptions{BufSize: cfg.SendBufSize, Initial: cfg.SendBufs,
		MaxBytes: cfg.SendPoolMax, OnFree: bq.SendBufFreed, OnGrow: k.sendPoolGrow}, true))
	if err != nil {
		k.recv.CloseWhenReleased()
		return nil, err
	}
	bq.SetSendPool(send)
	k.initDone = true
	return k, nil
}

// sendPoolGrow refuses some growths as RLIMIT_MEMLOCK would (the limit read now, so the
// queue's memCapped sees it unchanged and keeps the cap).
func (k *Kernel) sendPoolGrow(r *memreg.Region, _ int) error {
	if k.initDone && k.rng.Float64() < k.growRefuse {
		k.cnt.GrowRefused++
		return memreg.NewMemlockError(r.Count()*r.BufSize(), unix.ENOMEM)
	}
	return nil
}

func (k *Kernel) Failf(format string, args ...any) {
	if k.Failure == "" {
		k.Failure = fmt.Sprintf(format, args...)
		if len(k.Trace) > 0 {
			k.Failure += "\nlast actions:\n  " + strings.Join(k.Trace, "\n  ")
		}
	}
}

// tracef records an action; the last traceLen are kept.
func (k *Kernel) Tracef(format string, args ...any) {
	const traceLen = 40
	if len(k.Trace) == traceLen {
		copy(k.Trace, k.Trace[1:])
		k.Trace = k.Trace[:traceLen-1]
	}
	k.Trace = append(k.Trace, fmt.Sprintf("%d: ", k.steps)+fmt.Sprintf(format, args...))
}

// get finds the fake kernel's side of the connection the core handed it (by the contract's
// view: the fake's own state of it holds its Conn once it has one).
func (k *Kernel) get(bc becontract.Conn) *Conn {
	if fc := fk(bc).fc; fc != nil {
		return fc
	}
	fc := k.byConn[bc]
	if fc == nil {
		k.Failf("connection %p unknown to the fake kernel", bc)
		fc = &Conn{k: k, B: bc, Role: Placeholder("unknown")}
		k.byConn[bc] = fc
	}
	fk(bc).fc = fc
	return fc
}

// addConn makes the fake kernel's side of connection bc for the test's role.
func (k *Kernel) AddConn(bc becontract.Conn, role Role) *Conn {
	fc := k.byConn[bc] // started already (epoll mode registers in start)
	if fc == nil {
		fc = &Conn{k: k, ID: len(k.conns), B: bc}
		k.conns = append(k.conns, fc)
		k.byConn[bc] = fc
	}
	fc.Role = role
	role.Attach(fc)
	return fc
}

func (k *Kernel) newOp(c becontract.Conn, fc *Conn, tag uint32) uint64 {
	c.OpStarted()
	return k.lq.NewOp(fc, tag)
}

// ---- backend ---------------------------------------------------------------------------

func (k *Kernel) Kind() becontract.Kind  { return becontract.KindAuto }
func (k *Kernel) ZeroCopy() bool         { return !k.epoll }
func (k *Kernel) DirectOK() bool         { return false }
func (k *Kernel) AppDirect() bool        { return true }
func (k *Kernel) RecvPool() *memreg.Pool { return k.recv }
func (k *Kernel) Close() {
	k.recv.CloseWhenReleased()
	k.bq.SendPool().CloseWhenReleased()
}

// Start registers the socket (epoll mode: one registration for both directions).
func (k *Kernel) Start(c becontract.Conn) error {
	if !k.epoll {
		return nil
	}
	fc := k.byConn[c]
	if fc == nil {
		fc = k.AddConn(c, Placeholder("starting"))
	}
	fk(c).recvUD = k.newOp(c, fc, becontract.TagRecv)
	fc.Rud = fk(c).recvUD
	return nil
}

func (k *Kernel) Sending(c becontract.Conn) bool {
	if k.epoll {
		return fk(c).wantOut
	}
	return fk(c).tx.ud != 0
}

func (k *Kernel) InFlightSegs(c becontract.Conn) int {
	if t := &fk(c).tx; !k.epoll && t.ud != 0 {
		return t.segs
	}
	return 0
}

// bk is the fake backend's own state of a connection (Conn.bk): the io_uring and the
// plain backend's fields, as each of them keeps it.
type bk struct {
	c                becontract.Conn
	fc               *Conn // the fake kernel's side, once known (get)
	recvUD, dialUD   uint64
	wantOut, needArm bool
	tx               fakeTx
}

// fakeTx is the send side's state, as the io_uring backend keeps it.
type fakeTx struct {
	ud              uint64
	segs            int
	zcOp, pollFirst bool
}

func (*bk) ConnState() {}

func fk(c becontract.Conn) *bk { return c.BackendState().(*bk) }

func (k *Kernel) NewConnState(c becontract.Conn) becontract.ConnState { return &bk{c: c} }

// cancelSend is io_uring's ASYNC_CANCEL of the send in flight: the send completes when the
// scheduler picks it (room or not), with -ECANCELED, with the part it had taken (the
// kernel's done_io), or whole (the cancel came too late). Until then its buffers are the
// kernel's: their loans and bytes are recorded here and checked at the completion. The plain
// backend's sends are write(2) calls: nothing to cancel.
func (k *Kernel) CancelSend(c becontract.Conn) {
	if k.epoll {
		return
	}
	fc := k.get(c)
	if fc.Sud == 0 || fc.Scancel {
		return
	}
	fc.Scancel = true
	k.cnt.Cancels++
	fc.Tracef("cancel send (%d bytes in %d segments)", fc.sbytes, fc.ssegs)
	for i := 0; i < fc.ssegs && i < c.PendLen(); i++ {
		if s := c.Pend(i); s.Ptr != nil {
			mem := s.Bytes()
			fc.sheld = append(fc.sheld, held{mem: mem, want: bytes.Clone(mem)})
		}
	}
}

func (k *Kernel) FreeOp(c becontract.Conn, ud uint64) {
	if k.lq.OpLive(ud) {
		k.lq.FreeOp(ud)
		c.OpEnded()
	}
}

func (k *Kernel) ArmRecv(c becontract.Conn) {
	if k.epoll {
		c.RecvStarted()
		return
	}
	fc := k.get(c)
	if fc.Rud != 0 {
		k.Failf("%v: receive armed twice (recvArmed %v)", fc, c.RecvArmed())
	}
	fk(c).recvUD = k.newOp(c, fc, becontract.TagRecv)
	fc.Rud, fc.rmulti, fc.Rcancel = fk(c).recvUD, k.rng.IntN(3) != 0, false
	c.RecvStarted()
	fk(c).needArm = false
}

func (k *Kernel) StopRecv(c becontract.Conn) {
	if k.epoll {
		c.RecvEnded()
		return
	}
	if c.RecvArmed() && fk(c).recvUD != 0 {
		k.get(c).Rcancel = true
	}
}

func (k *Kernel) Send(c becontract.Conn) {
	if k.epoll {
		k.sendSync(c)
		return
	}
	if c.PendLen() == 0 || fk(c).tx.ud != 0 || c.SockClosed() {
		return
	}
	fc := k.get(c)
	head := c.Pend(0)
	left := head.Len
	zc := c.ZC()
	if zc.Use(left) {
		ud := k.newOp(c, fc, becontract.TagSendZC)
		fk(c).tx.ud, fk(c).tx.segs, fk(c).tx.zcOp = ud, 1, true
		c.ZCStart(ud)
		fc.Sud, fc.Szc, fc.ssegs, fc.sbytes = ud, true, 1, int64(left)
		fc.sloans = append(fc.sloans[:0], head.Loan)
		c.CountSend(true)
		return
	}
	limit := 1 + k.rng.IntN(becontract.MaxIov) // batches of every size
	n, nb := 1, left
	fc.sloans = append(fc.sloans[:0], head.Loan)
	for n < c.PendLen() && n < limit && nb < becontract.MaxSendBatch {
		s := c.Pend(n)
		if zc.WouldUse(s.Len) {
			break
		}
		zc.CountCopy(s.Len)
		fc.sloans = append(fc.sloans, s.Loan)
		nb += s.Len
		n++
	}
	ud := k.newOp(c, fc, becontract.TagSend)
	fk(c).tx.ud, fk(c).tx.segs, fk(c).tx.zcOp = ud, n, false
	fc.Sud, fc.Szc, fc.ssegs, fc.sbytes = ud, false, n, int64(nb)
	c.CountSend(false)
}

func (k *Kernel) CloseSocket(c becontract.Conn) {
	if k.epoll {
		fc := k.get(c)
		if fk(c).recvUD != 0 {
			k.lq.FreeOp(fk(c).recvUD)
			fk(c).recvUD = 0
			c.OpEnded()
			fc.Rud = 0
		}
		fk(c).wantOut = false
	}
	k.StopRecv(c)
	c.Socket().Close()
	k.get(c).closed = true
}

func (k *Kernel) Dial(c becontract.Conn) {
	role := k.sim.DialRole()
	if role == nil {
		k.Failf("dial with no role")
		role = Placeholder("unknown")
	}
	fc := k.AddConn(c, role)
	k.sim.SetupPeer(fc)
	fk(c).dialUD = k.newOp(c, fc, becontract.TagConnect)
	fc.Cud = fk(c).dialUD
}

func (k *Kernel) DropDial(c becontract.Conn) { k.FreeOp(c, fk(c).dialUD) }

func (k *Kernel) CancelDial(c becontract.Conn) {
	if c.DialAddr() != nil && k.lq.OpLive(fk(c).dialUD) {
		k.get(c).ccancel = true
	}
}

func (k *Kernel) Listen(p becontract.Listener)      { k.Failf("listen: not simulated") }
func (k *Kernel) StopListen(p becontract.Listener)  { p.Finish() }
func (k *Kernel) PauseListen(p becontract.Listener) {}

// onRecv is zc/internal/be/uring's onRecv over the fake ring.
func (k *Kernel) onRecv(fc *Conn, ev loop.Event, more bool) {
	c := fc.B
	if !more {
		k.FreeOp(c, ev.UD)
		fk(c).recvUD = 0
		c.RecvEnded()
		fc.Rud, fc.Rcancel = 0, false
	}
	switch res := ev.Res; {
	case res > 0:
		buf := fc.rbuf
		fc.rbuf = memreg.Buf{}
		c.Deliver(buf, int(res))
	case res == 0:
		c.GotEOF(nil)
	case res == -int32(unix.ENOBUFS):
		if !c.RecvArmed() && !c.InClose() {
			fk(c).needArm = true
			k.waitBuffers(c)
		}
		return
	case res == -int32(unix.ECANCELED), res == -int32(unix.EAGAIN):
	default:
		c.GotEOF(unix.Errno(-res))
	}
	becontract.AfterRecv(c)
}

// waitBuffers: c found no receive buffer; it re-arms when one is back (at once when the pool
// has one free or can grow, as the receive ring's WaitBuffers does).
func (k *Kernel) waitBuffers(c becontract.Conn) {
	if k.recv.Free() > 0 || k.growRecv() {
		k.lq.MarkDirty((*fakeRearm)(fk(c)))
		return
	}
	k.starved = append(k.starved, c)
}

// fakeRearm is the fake's state of a connection as the loop.Flusher that re-arms its receive
// once buffers are back (the io_uring backend's rearm).
type fakeRearm bk

func (r *fakeRearm) Flush(*loop.Queue) {
	if r.needArm {
		r.needArm = false
		r.c.Rearm()
	}
}

func (k *Kernel) growRecv() bool {
	if !k.recv.CanGrow() {
		return false
	}
	_, err := k.recv.Grow()
	return err == nil
}

// recvFreed runs when a receive buffer returns (any goroutine): starved connections re-arm.
func (k *Kernel) recvFreed() {
	if len(k.starved) == 0 || k.wakeReq {
		return // loop-only state: every release in the simulation happens on the loop
	}
	k.wakeReq = true
	if k.lq.Post(k.retryStarved) != nil {
		k.wakeReq = false
	}
}

func (k *Kernel) retryStarved() {
	k.wakeReq = false
	st := k.starved
	k.starved = nil
	for _, c := range st {
		if fk(c).needArm {
			fk(c).needArm = false
			c.Rearm()
		}
	}
}

// ---- the scheduler (loop.Driver) --------------------------------------------------------

type ActKind int

const (
	ActAccept ActKind = iota
	ActRecv
	ActSend
	ActNotif
	ActConnect
	ActPeerWrite
	ActPeerRead
	ActPeerFin
	ActReset
	ActUserPause
	ActAppRelease
	ActEngineClose
	ActCloseExpire
	ActCloseExpire2
	NActKinds
)

var ActNames = [...]string{"accept", "recv", "send", "notif", "connect", "peer-write", "peer-read", "peer-fin", "reset", "user-pause", "app-release", "engine-close", "close-expire", "close-expire-2"}

type Act struct {
	Kind ActKind
	FC   *Conn
	I    int
}

// enabled lists what can happen now.
func (k *Kernel) enabled() []Act {
	a := k.acts[:0]
	if k.sim.PendingAccepts() > 0 {
		a = append(a, Act{Kind: ActAccept})
	}
	a = k.sim.EngineActs(a)
	for _, fc := range k.conns {
		if k.epoll {
			// Level-triggered readiness for what the connection asks for.
			if fc.Rud != 0 && fc.B.RecvArmed() && (fc.Reset || fc.Rcvq > 0 || fc.FinSent) {
				a = append(a, Act{Kind: ActRecv, FC: fc})
			}
			if fc.Rud != 0 && fk(fc.B).wantOut && (fc.Reset || fc.Sndq < fc.SndCap) {
				a = append(a, Act{Kind: ActSend, FC: fc})
			}
		} else {
			if fc.Rud != 0 && (fc.Rcancel || fc.Reset || fc.Rcvq > 0 || fc.FinSent) {
				a = append(a, Act{Kind: ActRecv, FC: fc})
			}
			if fc.Sud != 0 && (fc.Reset || fc.Scancel || fc.Sndq < fc.SndCap) {
				a = append(a, Act{Kind: ActSend, FC: fc})
			}
		}
		a = k.sim.CloseActs(fc, a)
		for i := range fc.Notifs {
			a = append(a, Act{Kind: ActNotif, FC: fc, I: i})
		}
		if fc.Cud != 0 {
			a = append(a, Act{Kind: ActConnect, FC: fc})
		}
		a = k.sim.AppActs(fc, a)
		if fc.Reset {
			continue
		}
		if fc.Sndq > 0 && !(fc.Stall && (fc.B.InClose() || fc.B.Ended())) {
			a = append(a, Act{Kind: ActPeerRead, FC: fc}) // after a close too: the socket lingers
		}
		if fc.closed || fc.B.Ended() {
			continue
		}
		if fc.started() && fc.InWrote < fc.InTotal && fc.Rcvq < fc.Window {
			a = append(a, Act{Kind: ActPeerWrite, FC: fc})
		}
		if fc.started() && fc.InWrote == fc.InTotal && !fc.FinSent && !fc.NoFin {
			a = append(a, Act{Kind: ActPeerFin, FC: fc})
		}
		if fc.ResetOK && fc.started() {
			a = append(a, Act{Kind: ActReset, FC: fc})
		}
	}
	k.acts = a
	return a
}

func (fc *Conn) started() bool { return fc.Cud == 0 && fc.B.DialAddr() == nil }

// pick chooses an action, weighted by kind (the weights are the seed's: a slow peer, a
// flaky network ...).
func (k *Kernel) pick(acts []Act) Act {
	total := 0
	for _, a := range acts {
		total += k.opt.Weight[a.Kind]
	}
	if total <= 0 {
		return acts[k.rng.IntN(len(acts))]
	}
	x := k.rng.IntN(total)
	for _, a := range acts {
		x -= k.opt.Weight[a.Kind]
		if x < 0 {
			return a
		}
	}
	return acts[len(acts)-1]
}

// Wait runs the scheduler: a few actions, then back to the loop (its tasks, flushes and
// timers run between batches, as between two io_uring_enter calls). With nothing left to
// do it checks that nothing waits.
func (k *Kernel) Wait(timeout time.Duration) error {
	if k.quiet || !k.sim.Begun() {
		k.waitWake(timeout)
		return nil
	}
	batch := 1 + k.rng.IntN(6)
	if k.rng.IntN(20) == 0 {
		batch = 1 + k.rng.IntN(200) // a long completion queue: many buffers back at once
	}
	for i := 0; i < batch; i++ {
		acts := k.enabled()
		if len(acts) == 0 {
			if i > 0 || timeout == 0 {
				return nil // the loop has work of its own first
			}
			k.quiescent()
			return nil
		}
		k.steps++
		a := k.pick(acts)
		k.cnt.Acts[a.Kind]++
		k.do(a)
		if k.Failure != "" || k.steps >= k.maxSteps {
			if k.Failure == "" {
				k.Failf("no quiescence after %d steps (livelock?)", k.steps)
			}
			k.finish()
			return nil
		}
	}
	k.drainWake()
	return nil
}

// quiescent: nothing can happen any more. Every connection must have finished; one that has
// not waits for an event nobody will deliver (a lost wake-up).
func (k *Kernel) quiescent() {
	var stuck []string
	for _, fc := range k.conns {
		if !fc.B.Ended() {
			stuck = append(stuck, k.sim.Describe(fc)+"\n    its last events:\n      "+strings.Join(fc.Trace, "\n      "))
		}
	}
	if len(stuck) > 0 {
		k.Failf("quiescent after %d steps, but %d connection(s) not finished (a lost wake-up):\n%s\n%s",
			k.steps, len(stuck), strings.Join(stuck, "\n"), k.sim.QueueState())
	}
	k.finish()
}

func (k *Kernel) finish() {
	k.quiet = true
	k.sim.Done(k.Failure, k.steps)
}

// waitWake sleeps until the queue's eventfd is written (or timeout passes) and consumes it.
func (k *Kernel) waitWake(timeout time.Duration) {
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	fds := []unix.PollFd{{Fd: int32(k.lq.WakeFD()), Events: unix.POLLIN}}
	if n, _ := unix.Poll(fds, ms); n > 0 {
		var b [8]byte
		unix.Read(k.lq.WakeFD(), b[:])
	}
}

// drainWake consumes a pending eventfd write without blocking.
func (k *Kernel) drainWake() { k.waitWake(0) }

// driver is the fake kernel as the queue's loop.Driver (its Close is not the backend's).
type driver Kernel

func (d *driver) Wait(timeout time.Duration) error { return (*Kernel)(d).Wait(timeout) }
func (d *driver) Close()                           {}

// dispatch delivers a completion to the core, as a driver does.
func (k *Kernel) Dispatch(fc *Conn, what string, ev loop.Event) {
	k.Tracef("%v: %s res %d flags %#x", fc, what, ev.Res, ev.Flags)
	fc.Tracef("%s res %d flags %#x", what, ev.Res, ev.Flags)
	k.lq.Dispatch(ev)
}

// do performs one action.
func (k *Kernel) do(a Act) {
	fc := a.FC
	switch a.Kind {
	case ActAccept:
		k.sim.PostAccept()
	case ActRecv, ActSend:
		if k.epoll {
			ev := unix.EPOLLIN
			if a.Kind == ActSend {
				ev = unix.EPOLLOUT
			}
			if k.rng.IntN(3) == 0 {
				ev = unix.EPOLLIN | unix.EPOLLOUT // whatever else is ready comes along
			}
			k.Dispatch(fc, "ready", loop.Event{UD: fc.Rud, Flags: uint32(ev)})
		} else if a.Kind == ActRecv {
			k.doRecv(fc)
		} else {
			k.DoSend(fc)
		}
	case ActNotif:
		k.doNotif(fc, a.I)
	case ActConnect:
		res := int32(0)
		switch {
		case fc.ccancel:
			res = -int32(unix.ECANCELED)
		case k.rng.Float64() < k.opt.DialFail:
			res = -int32(unix.ECONNREFUSED)
		}
		ud := fc.Cud
		fc.Cud = 0 // completes once, whether the core still waits for it or not
		k.Dispatch(fc, "connect", loop.Event{UD: ud, Res: res})
	case ActPeerWrite, ActPeerRead, ActPeerFin, ActReset, ActUserPause:
		defer func() {
			k.Tracef("%v: %s (rcvq %d sndq %d reset %v)", fc, ActNames[a.Kind], fc.Rcvq, fc.Sndq, fc.Reset)
			if a.Kind != ActPeerRead && a.Kind != ActPeerWrite {
				fc.Tracef("%s (rcvq %d sndq %d reset %v)", ActNames[a.Kind], fc.Rcvq, fc.Sndq, fc.Reset)
			}
		}()
	}
	switch a.Kind {
	case ActPeerWrite:
		n := 1 + k.rng.Int64N(min(fc.InTotal-fc.InWrote, fc.Window-fc.Rcvq, 8<<10))
		fc.InWrote += n
		fc.Rcvq += n
	case ActPeerRead:
		fc.Sndq -= 1 + k.rng.Int64N(fc.Sndq)
	case ActPeerFin:
		fc.FinSent = true
	case ActReset:
		if k.rng.IntN(4) == 0 { // resets come late as often as early
			fc.Reset = true
			fc.Sndq, fc.Rcvq = 0, 0
			k.cnt.Resets++
		}
	case ActEngineClose, ActAppRelease, ActUserPause, ActCloseExpire, ActCloseExpire2:
		k.sim.DoAct(a)
	}
}

func (k *Kernel) doRecv(fc *Conn) {
	ev := loop.Event{UD: fc.Rud}
	switch {
	case fc.Rcancel:
		ev.Res = -int32(unix.ECANCELED)
	case fc.Reset:
		ev.Res = -int32(unix.ECONNRESET)
	case fc.Rcvq > 0:
		buf, err := k.recv.Get()
		if err != nil && k.growRecv() {
			buf, err = k.recv.Get()
		}
		if err != nil || k.rng.IntN(50) == 0 {
			if err == nil {
				buf.Release() // a spurious ENOBUFS (another ring's buffers): re-armed at once
			}
			ev.Res = -int32(unix.ENOBUFS)
			k.cnt.Enobufs++
			break
		}
		p := buf.Bytes()
		n := 1 + k.rng.Int64N(min(fc.Rcvq, int64(len(p))))
		if k.rng.IntN(2) == 0 {
			n = min(fc.Rcvq, int64(len(p))) // as much as fits, often
		}
		Stream(p[:n], fc.InKey, fc.InRecv)
		fc.InRecv += n
		fc.Rcvq -= n
		fc.rbuf = buf
		ev.Res = int32(n)
		if fc.rmulti && k.rng.IntN(8) != 0 {
			ev.Flags |= uring.CQEFMore
		}
	default: // the peer's FIN, all read
		ev.Res = 0
	}
	k.Dispatch(fc, "recv", ev)
	if fc.rbuf.Valid() {
		k.Failf("%v: receive buffer not taken by the completion", fc)
	}
}

func (k *Kernel) DoSend(fc *Conn) {
	ud := fc.Sud
	fc.Sud = 0
	ev := loop.Event{UD: ud, Res: int32(fc.sbytes)}
	for i, l := range fc.sloans {
		if l.Region() != nil && !l.Valid() {
			k.Failf("%v: segment %d of a send in flight (cancelled %v) went back to its pool before the send completed", fc, i, fc.Scancel)
			return
		}
	}
	fc.sloans = fc.sloans[:0]
	cancelled := fc.Scancel
	if cancelled {
		fc.Scancel = false
		for i, h := range fc.sheld {
			if !bytes.Equal(h.mem, h.want) {
				k.Failf("%v: segment %d of a cancelled send changed before the send completed (reused early)", fc, i)
				return
			}
		}
		fc.sheld = nil
	}
	room := fc.SndCap - fc.Sndq
	switch {
	case fc.Reset:
		ev.Res = -int32(unix.ECONNRESET)
		if fc.Szc && k.rng.IntN(2) == 0 {
			// io_uring reports most failed SEND_ZC with F_MORE: the notification follows.
			ev.Res = -int32(unix.EPIPE)
			ev.Flags = uring.CQEFMore
			fc.Notifs = append(fc.Notifs, notif{ud: ud})
		}
	case cancelled && (room <= 0 || k.rng.IntN(3) != 0):
		// Cancelled: -ECANCELED, or the part taken before the cancel (io_uring reports
		// done_io). A SEND_ZC's notification follows either way (F_MORE).
		n := int64(0)
		if fc.sbytes > 1 && k.rng.IntN(2) == 0 {
			n = 1 + k.rng.Int64N(fc.sbytes-1)
		}
		if n == 0 {
			ev.Res = -int32(unix.ECANCELED)
			if fc.Szc {
				ev.Flags = uring.CQEFMore
				fc.Notifs = append(fc.Notifs, notif{ud: ud})
			}
		} else {
			if !k.Take(fc, n) {
				return
			}
			ev.Res = int32(n)
			if fc.Szc {
				ev.Flags = uring.CQEFMore
				mem := fc.B.Pend(0).Bytes()[:n]
				fc.Notifs = append(fc.Notifs, notif{ud: ud, mem: mem, want: bytes.Clone(mem)})
			}
		}
		what := "send (cancelled)"
		if fc.Szc {
			what = "send-zc (cancelled)"
		}
		k.Dispatch(fc, what, ev)
		return
	case k.rng.IntN(20) == 0:
		ev.Res = -int32(unix.EAGAIN)
	case fc.Szc:
		// MSG_WAITALL: whole, or short only when the connection failed meanwhile (io_uring
		// then reports what went out and the next operation meets the error).
		n := fc.sbytes
		if fc.ResetOK && k.rng.IntN(10) == 0 {
			n = 1 + k.rng.Int64N(n)
			fc.Reset = true
			k.cnt.Resets++
		}
		if !k.Take(fc, n) {
			return
		}
		if fc.Reset {
			fc.Sndq = 0
		}
		ev.Res = int32(n)
		ev.Flags = uring.CQEFMore
		if k.rng.IntN(16) == 0 {
			// The notification before the completion (not seen on Linux; the core takes it).
			k.Dispatch(fc, "notif (early)", loop.Event{UD: ud, Flags: uring.CQEFNotif})
			break
		}
		mem := fc.B.Pend(0).Bytes()[:n]
		fc.Notifs = append(fc.Notifs, notif{ud: ud, mem: mem, want: bytes.Clone(mem)})
	default:
		// Short sends: at most the room left in the socket buffer, often less.
		n := min(fc.sbytes, fc.SndCap-fc.Sndq)
		if k.rng.IntN(3) == 0 {
			n = 1 + k.rng.Int64N(n)
		}
		if !k.Take(fc, n) {
			return
		}
		ev.Res = int32(n)
	}
	what := "send"
	if fc.Szc {
		what = "send-zc"
	}
	k.Dispatch(fc, what, ev)
}

// take moves n bytes from the head of the send queue into the socket send buffer, checking
// them against the stream the connection must send.
func (k *Kernel) Take(fc *Conn, n int64) bool {
	c := fc.B
	if fc.OutKey == nil {
		k.Failf("%v: sent %d bytes but sends nothing", fc, n)
		return false
	}
	left := n
	for i := 0; i < fc.ssegs && left > 0; i++ {
		if i >= c.PendLen() {
			k.Failf("%v: send in flight covers %d segments, %d pending", fc, fc.ssegs, c.PendLen())
			return false
		}
		s := c.Pend(i) // a pool's loan or the application's slice (SendBytes)
		if s.Ptr == nil {
			k.Failf("%v: segment %d of a send in flight has no memory (returned early?)", fc, i)
			return false
		}
		p := s.Bytes()
		p = p[:min(int64(len(p)), left)]
		if fc.Other {
			if !k.sim.TakeOther(fc, s, p) {
				return false
			}
		} else if !Matches(p, *fc.OutKey, fc.KAcc) {
			k.Failf("%v: bytes %d..%d taken by the kernel are not the stream's (lost, repeated or reordered)", fc, fc.KAcc, fc.KAcc+int64(len(p)))
			return false
		}
		fc.KAcc += int64(len(p))
		left -= int64(len(p))
	}
	if left > 0 {
		k.Failf("%v: send of %d bytes covers only %d", fc, n, n-left)
		return false
	}
	fc.Sndq += n
	return true
}

func (k *Kernel) doNotif(fc *Conn, i int) {
	nt := fc.Notifs[i]
	fc.Notifs = append(fc.Notifs[:i], fc.Notifs[i+1:]...)
	if !bytes.Equal(nt.mem, nt.want) {
		k.Failf("%v: a zero-copy send's buffer changed before its notification (reused early)", fc)
		return
	}
	res := int32(0)
	if k.rng.IntN(3) == 0 {
		copied := uint32(uring.NotifUsageZCCopied)
		res = int32(copied)
	}
	k.Dispatch(fc, "notif", loop.Event{UD: nt.ud, Res: res, Flags: uring.CQEFNotif})
}

// ---- epoll mode (zc/internal/be/epoll's ways) -----------------------------------------------------

// onReady is the plain backend's onEvent.
func (k *Kernel) onReady(fc *Conn, events uint32) {
	c := fc.B
	if events&unix.EPOLLOUT != 0 && fk(c).wantOut {
		k.sendSync(c)
		if !fk(c).wantOut {
			c.SendProgress()
		}
	}
	if c.Ended() {
		return
	}
	if events&unix.EPOLLIN != 0 && c.RecvArmed() {
		k.readSync(fc)
	}
	if c.InClose() {
		c.AdvanceClose()
	}
}

// sendSync is the plain backend's Send: writev until the socket buffer is full, then
// EPOLLOUT.
func (k *Kernel) sendSync(c becontract.Conn) {
	fc := k.get(c)
	progress := false
	for c.PendLen() > 0 && !c.SockClosed() {
		if fc.Reset {
			fc.Tracef("writev: EPIPE")
			c.Fail("write", unix.EPIPE)
			return
		}
		room := fc.SndCap - fc.Sndq
		if room <= 0 || !k.Tame && k.rng.IntN(8) == 0 {
			break // EAGAIN
		}
		limit := 1 + k.rng.IntN(becontract.MaxIov)
		if k.Tame {
			limit = becontract.MaxIov
		}
		n, nb := 0, int64(0)
		for n < c.PendLen() && n < limit {
			nb += int64(c.Pend(n).Len)
			n++
		}
		w := min(nb, room)
		if !k.Tame && k.rng.IntN(3) == 0 {
			w = 1 + k.rng.Int64N(w)
		}
		fc.ssegs = n
		if !k.Take(fc, w) {
			return
		}
		fc.Tracef("writev %d of %d", w, nb)
		c.CountSend(false)
		c.Advance(int(w))
		progress = true
	}
	want := c.PendLen() > 0 && !c.SockClosed()
	if want != fk(c).wantOut {
		fk(c).wantOut = want
	}
	if progress && !fk(c).wantOut {
		k.lq.MarkDirty((*fakeWritable)(fk(c)))
	}
}

// readSync is the plain backend's read.
func (k *Kernel) readSync(fc *Conn) {
	c := fc.B
	for i := 0; i < 16 && c.RecvArmed() && !c.SockClosed(); i++ {
		buf, err := k.recv.Get()
		if err != nil && k.growRecv() {
			buf, err = k.recv.Get()
		}
		if err != nil {
			k.StopRecv(c)
			fk(c).needArm = true
			k.starved = append(k.starved, c)
			k.cnt.Enobufs++
			fc.Tracef("read: no buffer")
			return
		}
		switch {
		case fc.Reset:
			buf.Release()
			k.StopRecv(c)
			fc.Tracef("read: ECONNRESET")
			c.GotEOF(unix.ECONNRESET)
			return
		case fc.Rcvq == 0:
			buf.Release()
			if fc.FinSent {
				k.StopRecv(c)
				fc.Tracef("read: EOF")
				c.GotEOF(nil)
			}
			return // EAGAIN
		}
		p := buf.Bytes()
		n := 1 + k.rng.Int64N(min(fc.Rcvq, int64(len(p))))
		if k.rng.IntN(2) == 0 {
			n = min(fc.Rcvq, int64(len(p)))
		}
		Stream(p[:n], fc.InKey, fc.InRecv)
		fc.InRecv += n
		fc.Rcvq -= n
		fc.Tracef("read %d", n)
		c.Deliver(buf, int(n))
		if c.Ended() {
			return
		}
		c.CheckCredit()
		if n < int64(len(p)) {
			return
		}
	}
}

// fakeWritable is the fake's state of a connection as the loop.Flusher that reports a send
// completed synchronously (the plain backend's plainWritable).
type fakeWritable bk

func (w *fakeWritable) Flush(*loop.Queue) {
	if !w.c.Ended() {
		w.c.SendProgress()
	}
}

// ---- for the test ----------------------------------------------------------------------

// Recv is the kernel's receive pool.
func (k *Kernel) Recv() *memreg.Pool { return k.recv }

// ConnOf is the kernel's side of connection bc (nil: unknown to it).
func (k *Kernel) ConnOf(bc becontract.Conn) *Conn { return k.byConn[bc] }

// Starved is the number of connections waiting for a receive buffer.
func (k *Kernel) Starved() int { return len(k.starved) }

// Driver is the kernel as its queue's loop.Driver (its Close is not the backend's).
func (k *Kernel) Driver() loop.Driver { return (*driver)(k) }

// WantOut reports whether connection bc waits for EPOLLOUT (epoll mode).
func (k *Kernel) WantOut(bc becontract.Conn) bool { return fk(bc).wantOut }
