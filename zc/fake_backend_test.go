package zc

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

// A fake kernel for the connection core (the interleaving test, interleave_test.go).
//
// fakeKernel is both a queue's loop.Driver and its backend: no byte moves through a real
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
// a backend it sees a connection only as a becontract.Conn (fconn.b): the core calls it and
// hears its reports through the same contract as the backends' packages. Everything else
// it needs of zc (the application's and the engine's actions and their conditions, the
// peers' draws, the FanOut check, the core's state for a report) it asks the test through
// fakeSim, which interleave_test.go's simRun implements: this file names no *Conn, queue or
// simRun.
//
// The send pool is the queue's own (zc/queue.go: waiters, grants), its growth sometimes
// refused as RLIMIT_MEMLOCK would; the receive pool is small, so receives meet ENOBUFS.
//
// Connections are real descriptors (an AF_UNIX socketpair end, or the unconnected socket
// DialAsync makes) so the raw calls the core makes on c.fd (shutdown, SO_LINGER,
// TCP_NODELAY) are harmless; everything they carry goes through the fake.

// fakeTable is the content of every simulated byte stream: stream key k at offset off carries
// fakeTable[(k+off)%len]. A prime length, so a shifted, repeated or dropped range shows.
var fakeTable = func() []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, 65521)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}()

// fakeStream fills p with stream key's bytes from offset off.
func fakeStream(p []byte, key, off int64) {
	i := int((key + off) % int64(len(fakeTable)))
	for len(p) > 0 {
		k := copy(p, fakeTable[i:])
		p = p[k:]
		i = 0
	}
}

// fakeMatches reports whether p is stream key's bytes from offset off.
func fakeMatches(p []byte, key, off int64) bool {
	i := int((key + off) % int64(len(fakeTable)))
	for len(p) > 0 {
		k := min(len(p), len(fakeTable)-i)
		if !bytes.Equal(p[:k], fakeTable[i:i+k]) {
			return false
		}
		p = p[k:]
		i = 0
	}
	return true
}

// fakeNotif is a zero-copy send whose notification is still to come: the bytes the kernel
// took, to check that the buffer was not reused before the notification.
type fakeNotif struct {
	ud   uint64
	mem  []byte // the buffer's memory the send covered
	want []byte // what it held when the send completed
}

// fakeHeld is a segment of a cancelled send in flight: what it held.
type fakeHeld struct {
	mem  []byte
	want []byte
}

// fconn is the fake kernel's side of one connection: its socket buffers and its peer.
type fconn struct {
	k    *fakeKernel
	id   int
	b    becontract.Conn // the connection, as the contract shows it to a backend
	role fakeRole        // the test's view (interleave_test.go's *simConn)

	// The peer's stream toward the connection: key, total, written so far, not yet received.
	inKey            int64
	inTotal, inWrote int64
	inRecv           int64 // delivered to the core
	rcvq             int64 // written, not yet received
	window           int64 // the peer stops writing while rcvq is at the window
	finSent          bool
	noFin            bool // the peer never half-closes (the connection closes itself)

	// The connection's stream toward the peer: what the kernel accepted (checked against
	// outKey's bytes as it is taken), and the socket send buffer the peer drains.
	outKey *int64 // nil: the connection sends nothing (a sink)
	kAcc   int64
	// other: the test checks its sends (takeOther: a FanOut subscriber's are published
	// messages, interleave_fanout_test.go)
	other  bool
	sndq   int64
	sndCap int64

	resetOK bool // this connection may be reset by its peer
	reset   bool
	closed  bool // closeSocket ran
	// stall: the peer stops reading once the connection closes (its close can only end by
	// CloseTimeout: actCloseExpire); expired: CloseTimeout passed with sends still queued
	stall   bool
	expired bool
	// late: the connection finished with a send in the kernel (actCloseExpire2); what that
	// send does not take is dropped after OnClose, so Unsent may be below BytesDropped
	late bool

	// Operations in the fake kernel.
	rud     uint64 // the receive (0: none); epoll mode: the registration
	rmulti  bool
	rcancel bool
	rbuf    memreg.Buf // the buffer of the receive completion being dispatched
	sud     uint64     // the send in flight
	szc     bool
	ssegs   int
	sbytes  int64
	notifs  []fakeNotif
	// sloans: the loans of the send's segments, which must stand until it completes.
	// scancel: the core cancelled the send in flight (cancelSend, on an abort); it completes
	// later with -ECANCELED or the part it took. sheld: its segments' bytes at the cancel,
	// which must stay unchanged until that completion.
	sloans  []memreg.Loan
	scancel bool
	sheld   []fakeHeld
	cud     uint64 // the connect
	ccancel bool

	trace []string
}

// tracef records an event of this connection; the last ones are kept.
func (fc *fconn) tracef(format string, args ...any) {
	const traceLen = 30
	if len(fc.trace) == traceLen {
		copy(fc.trace, fc.trace[1:])
		fc.trace = fc.trace[:traceLen-1]
	}
	fc.trace = append(fc.trace, fmt.Sprintf("%d: ", fc.k.steps)+fmt.Sprintf(format, args...))
}

func (fc *fconn) String() string {
	return fmt.Sprintf("fconn %d (%s)", fc.id, fc.role.roleName())
}

// OnEvent handles the fake completions as zc/internal/be/uring handles io_uring's.
func (fc *fconn) OnEvent(lq *loop.Queue, ev loop.Event) {
	c := fc.b
	k := fc.k
	more := ev.Flags&uring.CQEFMore != 0
	switch ev.Tag {
	case tagRecv:
		if k.epoll {
			k.onReady(fc, ev.Flags)
			return
		}
		k.onRecv(fc, ev, more)
	case tagSend:
		k.FreeOp(c, ev.UD)
		fk(c).tx.ud, fk(c).tx.segs = 0, 0
		switch {
		case ev.Res > 0:
			c.Advance(int(ev.Res))
		case ev.Res == -int32(unix.EAGAIN):
			fk(c).tx.pollFirst = true
		case ev.Res < 0 && ev.Res != -int32(unix.ECANCELED):
			c.Fail("write", unix.Errno(-ev.Res))
		}
		c.SendProgress()
	case tagSendZC:
		if ev.Flags&uring.CQEFNotif != 0 {
			c.ZCNotified(ev.UD, uint32(ev.Res)&uring.NotifUsageZCCopied != 0)
			return
		}
		fk(c).tx.ud, fk(c).tx.segs, fk(c).tx.zcOp = 0, 0, false
		notif := more || ev.Res == -int32(unix.ECANCELED)
		again := ev.Res == -int32(unix.EAGAIN)
		if again {
			fk(c).tx.pollFirst = true
		}
		c.ZCCompleted(ev.UD, int(ev.Res), notif, again)
		if ev.Res < 0 && ev.Res != -int32(unix.ECANCELED) && !again {
			c.Fail("write", unix.Errno(-ev.Res))
		}
		c.SendProgress() // a finished connection's late send: its buffers go back (lateSendDone)
	case tagConnect:
		k.FreeOp(c, ev.UD)
		fc.cud = 0
		c.DialDone(ev.Res)
	default:
		k.failf("%v: event with tag %d", fc, ev.Tag)
	}
}

// fakeSim is the test's side of the fake kernel (interleave_test.go's simRun): the
// application's and the engine's actions and the facts of zc's core they are scheduled by,
// the peers' draws, the FanOut check of a subscriber's sends, and the core's state in a
// failure's report. The kernel half of this file reaches zc only through it, the contract
// (fconn.b), its *loop.Queue and becontract.Queue: the seam a package zc/internal/be/fake
// would keep (doc/notes/issue-30-s13-floor30b.md).
type fakeSim interface {
	// simBegun: the run began (before, Wait only waits for the loop's wake-ups).
	simBegun() bool
	// pendingAccepts is the number of accepts the test wants now; postAccept posts the next
	// on the loop.
	pendingAccepts() int
	postAccept()
	// dialRole is the role of the connection being dialed (nil: none, a failure).
	dialRole() fakeRole
	// setupPeer draws fc's peer (its streams, window, send buffer, resets, stalls).
	setupPeer(fc *fconn)
	// engineActs, closeActs and appActs append the actions of the engine (Close), of fc's
	// CloseTimeout and of fc's application enabled now, at their places in enabled()'s
	// list (the order of the random draws depends on it); doAct performs one of them.
	engineActs(a []fakeAct) []fakeAct
	closeActs(fc *fconn, a []fakeAct) []fakeAct
	appActs(fc *fconn, a []fakeAct) []fakeAct
	doAct(a fakeAct)
	// takeOther checks p, the next bytes of segment s that fc's send takes, for a
	// connection without a stream of its own (a FanOut subscriber).
	takeOther(fc *fconn, s becontract.Seg, p []byte) bool
	// describe and queueState are the core's state for a failure's report.
	describe(fc *fconn) string
	queueState() string
	// done: the run ended (failure "" if none).
	done(failure string, steps int)
}

// fakeRole is the test's role of a connection (a *simConn), or a placeholder's name until
// the test gives one.
type fakeRole interface {
	roleName() string
	attach(fc *fconn) // the role's connection in the fake kernel
}

type fakeRoleName string

func (n fakeRoleName) roleName() string { return string(n) }
func (fakeRoleName) attach(*fconn)      {}

// fakeOptions are a run's draws the kernel acts by (simRun embeds them).
type fakeOptions struct {
	rng        *rand.Rand
	weight     [nActKinds]int
	growRefuse float64 // chance that a send pool growth is refused for lack of locked memory
	epoll      bool
	dialFail   float64 // chance that a connect is refused
	maxSteps   int
}

// fakeCounts is what the kernel counts (simRun embeds it).
type fakeCounts struct {
	counts                       [nActKinds]int
	resets, enobufs, growRefused int
	cancels                      int // sends cancelled in flight
}

// fakeKernel is a queue's driver and backend.
type fakeKernel struct {
	bq   becontract.Queue
	lq   *loop.Queue
	sim  fakeSim // the test (interleave_test.go)
	opt  *fakeOptions
	cnt  *fakeCounts
	rng  *rand.Rand
	recv *memreg.Pool

	conns   []*fconn // in creation order (the scheduler iterates these: no map order)
	byConn  map[becontract.Conn]*fconn
	starved []becontract.Conn // waiting for a receive buffer
	wakeReq bool

	growRefuse float64 // chance that a send pool growth is refused for lack of locked memory
	// epoll: readiness mode, as the plain backend (zc/internal/be/epoll): sends are written at once
	// (short writes, EAGAIN, then EPOLLOUT), receives read on EPOLLIN; no zero-copy.
	epoll    bool
	tame     bool // scripted cases: sends take all they can at once (no EAGAIN, no short writes)
	initDone bool

	steps    int
	maxSteps int
	acts     []fakeAct
	failure  string
	trace    []string // the last actions (a failure shows them)
	quiet    bool     // reported quiescence (or a failure): Wait now only waits for the eventfd
}

func newFakeKernel(bq becontract.Queue, sim fakeSim, opt *fakeOptions, cnt *fakeCounts) (*fakeKernel, error) {
	cfg := bq.Config()
	k := &fakeKernel{bq: bq, lq: bq.Loop(), sim: sim, opt: opt, cnt: cnt, rng: opt.rng, byConn: map[becontract.Conn]*fconn{},
		growRefuse: opt.growRefuse, maxSteps: opt.maxSteps, epoll: opt.epoll}
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
func (k *fakeKernel) sendPoolGrow(r *memreg.Region, _ int) error {
	if k.initDone && k.rng.Float64() < k.growRefuse {
		k.cnt.growRefused++
		return memreg.NewMemlockError(r.Count()*r.BufSize(), unix.ENOMEM)
	}
	return nil
}

func (k *fakeKernel) failf(format string, args ...any) {
	if k.failure == "" {
		k.failure = fmt.Sprintf(format, args...)
		if len(k.trace) > 0 {
			k.failure += "\nlast actions:\n  " + strings.Join(k.trace, "\n  ")
		}
	}
}

// tracef records an action; the last traceLen are kept.
func (k *fakeKernel) tracef(format string, args ...any) {
	const traceLen = 40
	if len(k.trace) == traceLen {
		copy(k.trace, k.trace[1:])
		k.trace = k.trace[:traceLen-1]
	}
	k.trace = append(k.trace, fmt.Sprintf("%d: ", k.steps)+fmt.Sprintf(format, args...))
}

// get finds the fake kernel's side of the connection the core handed it (by the contract's
// view: the fake's own state of it holds its fconn once it has one).
func (k *fakeKernel) get(bc becontract.Conn) *fconn {
	if fc := fk(bc).fc; fc != nil {
		return fc
	}
	fc := k.byConn[bc]
	if fc == nil {
		k.failf("connection %p unknown to the fake kernel", bc)
		fc = &fconn{k: k, b: bc, role: fakeRoleName("unknown")}
		k.byConn[bc] = fc
	}
	fk(bc).fc = fc
	return fc
}

// addConn makes the fake kernel's side of connection bc for the test's role.
func (k *fakeKernel) addConn(bc becontract.Conn, role fakeRole) *fconn {
	fc := k.byConn[bc] // started already (epoll mode registers in start)
	if fc == nil {
		fc = &fconn{k: k, id: len(k.conns), b: bc}
		k.conns = append(k.conns, fc)
		k.byConn[bc] = fc
	}
	fc.role = role
	role.attach(fc)
	return fc
}

func (k *fakeKernel) newOp(c becontract.Conn, fc *fconn, tag uint32) uint64 {
	c.OpStarted()
	return k.lq.NewOp(fc, tag)
}

// ---- backend ---------------------------------------------------------------------------

func (k *fakeKernel) Kind() becontract.Kind  { return becontract.KindAuto }
func (k *fakeKernel) ZeroCopy() bool         { return !k.epoll }
func (k *fakeKernel) DirectOK() bool         { return false }
func (k *fakeKernel) AppDirect() bool        { return true }
func (k *fakeKernel) RecvPool() *memreg.Pool { return k.recv }
func (k *fakeKernel) Close() {
	k.recv.CloseWhenReleased()
	k.bq.SendPool().CloseWhenReleased()
}

// Start registers the socket (epoll mode: one registration for both directions).
func (k *fakeKernel) Start(c becontract.Conn) error {
	if !k.epoll {
		return nil
	}
	fc := k.byConn[c]
	if fc == nil {
		fc = k.addConn(c, fakeRoleName("starting"))
	}
	fk(c).recvUD = k.newOp(c, fc, tagRecv)
	fc.rud = fk(c).recvUD
	return nil
}

func (k *fakeKernel) Sending(c becontract.Conn) bool {
	if k.epoll {
		return fk(c).wantOut
	}
	return fk(c).tx.ud != 0
}

func (k *fakeKernel) InFlightSegs(c becontract.Conn) int {
	if t := &fk(c).tx; !k.epoll && t.ud != 0 {
		return t.segs
	}
	return 0
}

// fakeBk is the fake backend's own state of a connection (Conn.bk): the io_uring and the
// plain backend's fields, as each of them keeps it.
type fakeBk struct {
	c                becontract.Conn
	fc               *fconn // the fake kernel's side, once known (get)
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

func (*fakeBk) ConnState() {}

func fk(c becontract.Conn) *fakeBk { return c.BackendState().(*fakeBk) }

func (k *fakeKernel) NewConnState(c becontract.Conn) becontract.ConnState { return &fakeBk{c: c} }

// cancelSend is io_uring's ASYNC_CANCEL of the send in flight: the send completes when the
// scheduler picks it (room or not), with -ECANCELED, with the part it had taken (the
// kernel's done_io), or whole (the cancel came too late). Until then its buffers are the
// kernel's: their loans and bytes are recorded here and checked at the completion. The plain
// backend's sends are write(2) calls: nothing to cancel.
func (k *fakeKernel) CancelSend(c becontract.Conn) {
	if k.epoll {
		return
	}
	fc := k.get(c)
	if fc.sud == 0 || fc.scancel {
		return
	}
	fc.scancel = true
	k.cnt.cancels++
	fc.tracef("cancel send (%d bytes in %d segments)", fc.sbytes, fc.ssegs)
	for i := 0; i < fc.ssegs && i < c.PendLen(); i++ {
		if s := c.Pend(i); s.Ptr != nil {
			mem := s.Bytes()
			fc.sheld = append(fc.sheld, fakeHeld{mem: mem, want: bytes.Clone(mem)})
		}
	}
}

func (k *fakeKernel) FreeOp(c becontract.Conn, ud uint64) {
	if k.lq.OpLive(ud) {
		k.lq.FreeOp(ud)
		c.OpEnded()
	}
}

func (k *fakeKernel) ArmRecv(c becontract.Conn) {
	if k.epoll {
		c.RecvStarted()
		return
	}
	fc := k.get(c)
	if fc.rud != 0 {
		k.failf("%v: receive armed twice (recvArmed %v)", fc, c.RecvArmed())
	}
	fk(c).recvUD = k.newOp(c, fc, tagRecv)
	fc.rud, fc.rmulti, fc.rcancel = fk(c).recvUD, k.rng.IntN(3) != 0, false
	c.RecvStarted()
	fk(c).needArm = false
}

func (k *fakeKernel) StopRecv(c becontract.Conn) {
	if k.epoll {
		c.RecvEnded()
		return
	}
	if c.RecvArmed() && fk(c).recvUD != 0 {
		k.get(c).rcancel = true
	}
}

func (k *fakeKernel) Send(c becontract.Conn) {
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
		ud := k.newOp(c, fc, tagSendZC)
		fk(c).tx.ud, fk(c).tx.segs, fk(c).tx.zcOp = ud, 1, true
		c.ZCStart(ud)
		fc.sud, fc.szc, fc.ssegs, fc.sbytes = ud, true, 1, int64(left)
		fc.sloans = append(fc.sloans[:0], head.Loan)
		c.CountSend(true)
		return
	}
	limit := 1 + k.rng.IntN(maxIov) // batches of every size
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
	ud := k.newOp(c, fc, tagSend)
	fk(c).tx.ud, fk(c).tx.segs, fk(c).tx.zcOp = ud, n, false
	fc.sud, fc.szc, fc.ssegs, fc.sbytes = ud, false, n, int64(nb)
	c.CountSend(false)
}

func (k *fakeKernel) CloseSocket(c becontract.Conn) {
	if k.epoll {
		fc := k.get(c)
		if fk(c).recvUD != 0 {
			k.lq.FreeOp(fk(c).recvUD)
			fk(c).recvUD = 0
			c.OpEnded()
			fc.rud = 0
		}
		fk(c).wantOut = false
	}
	k.StopRecv(c)
	c.Socket().Close()
	k.get(c).closed = true
}

func (k *fakeKernel) Dial(c becontract.Conn) {
	role := k.sim.dialRole()
	if role == nil {
		k.failf("dial with no role")
		role = fakeRoleName("unknown")
	}
	fc := k.addConn(c, role)
	k.sim.setupPeer(fc)
	fk(c).dialUD = k.newOp(c, fc, tagConnect)
	fc.cud = fk(c).dialUD
}

func (k *fakeKernel) DropDial(c becontract.Conn) { k.FreeOp(c, fk(c).dialUD) }

func (k *fakeKernel) CancelDial(c becontract.Conn) {
	if c.DialAddr() != nil && k.lq.OpLive(fk(c).dialUD) {
		k.get(c).ccancel = true
	}
}

func (k *fakeKernel) Listen(p becontract.Listener)      { k.failf("listen: not simulated") }
func (k *fakeKernel) StopListen(p becontract.Listener)  { p.Finish() }
func (k *fakeKernel) PauseListen(p becontract.Listener) {}

// onRecv is zc/internal/be/uring's onRecv over the fake ring.
func (k *fakeKernel) onRecv(fc *fconn, ev loop.Event, more bool) {
	c := fc.b
	if !more {
		k.FreeOp(c, ev.UD)
		fk(c).recvUD = 0
		c.RecvEnded()
		fc.rud, fc.rcancel = 0, false
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
	if c.Ended() {
		return
	}
	c.CheckCredit()
	if c.InClose() {
		c.AdvanceClose()
		return
	}
	if !c.RecvArmed() {
		c.Rearm()
	}
}

// waitBuffers: c found no receive buffer; it re-arms when one is back (at once when the pool
// has one free or can grow, as the receive ring's WaitBuffers does).
func (k *fakeKernel) waitBuffers(c becontract.Conn) {
	if k.recv.Free() > 0 || k.growRecv() {
		k.lq.MarkDirty((*fakeRearm)(fk(c)))
		return
	}
	k.starved = append(k.starved, c)
}

// fakeRearm is the fake's state of a connection as the loop.Flusher that re-arms its receive
// once buffers are back (the io_uring backend's rearm).
type fakeRearm fakeBk

func (r *fakeRearm) Flush(*loop.Queue) {
	if r.needArm {
		r.needArm = false
		r.c.Rearm()
	}
}

func (k *fakeKernel) growRecv() bool {
	if !k.recv.CanGrow() {
		return false
	}
	_, err := k.recv.Grow()
	return err == nil
}

// recvFreed runs when a receive buffer returns (any goroutine): starved connections re-arm.
func (k *fakeKernel) recvFreed() {
	if len(k.starved) == 0 || k.wakeReq {
		return // loop-only state: every release in the simulation happens on the loop
	}
	k.wakeReq = true
	if k.lq.Post(k.retryStarved) != nil {
		k.wakeReq = false
	}
}

func (k *fakeKernel) retryStarved() {
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

type fakeActKind int

const (
	actAccept fakeActKind = iota
	actRecv
	actSend
	actNotif
	actConnect
	actPeerWrite
	actPeerRead
	actPeerFin
	actReset
	actUserPause
	actAppRelease
	actEngineClose
	actCloseExpire
	actCloseExpire2
	nActKinds
)

var actNames = [...]string{"accept", "recv", "send", "notif", "connect", "peer-write", "peer-read", "peer-fin", "reset", "user-pause", "app-release", "engine-close", "close-expire", "close-expire-2"}

type fakeAct struct {
	kind fakeActKind
	fc   *fconn
	i    int
}

// enabled lists what can happen now.
func (k *fakeKernel) enabled() []fakeAct {
	a := k.acts[:0]
	if k.sim.pendingAccepts() > 0 {
		a = append(a, fakeAct{kind: actAccept})
	}
	a = k.sim.engineActs(a)
	for _, fc := range k.conns {
		if k.epoll {
			// Level-triggered readiness for what the connection asks for.
			if fc.rud != 0 && fc.b.RecvArmed() && (fc.reset || fc.rcvq > 0 || fc.finSent) {
				a = append(a, fakeAct{kind: actRecv, fc: fc})
			}
			if fc.rud != 0 && fk(fc.b).wantOut && (fc.reset || fc.sndq < fc.sndCap) {
				a = append(a, fakeAct{kind: actSend, fc: fc})
			}
		} else {
			if fc.rud != 0 && (fc.rcancel || fc.reset || fc.rcvq > 0 || fc.finSent) {
				a = append(a, fakeAct{kind: actRecv, fc: fc})
			}
			if fc.sud != 0 && (fc.reset || fc.scancel || fc.sndq < fc.sndCap) {
				a = append(a, fakeAct{kind: actSend, fc: fc})
			}
		}
		a = k.sim.closeActs(fc, a)
		for i := range fc.notifs {
			a = append(a, fakeAct{kind: actNotif, fc: fc, i: i})
		}
		if fc.cud != 0 {
			a = append(a, fakeAct{kind: actConnect, fc: fc})
		}
		a = k.sim.appActs(fc, a)
		if fc.reset {
			continue
		}
		if fc.sndq > 0 && !(fc.stall && (fc.b.InClose() || fc.b.Ended())) {
			a = append(a, fakeAct{kind: actPeerRead, fc: fc}) // after a close too: the socket lingers
		}
		if fc.closed || fc.b.Ended() {
			continue
		}
		if fc.started() && fc.inWrote < fc.inTotal && fc.rcvq < fc.window {
			a = append(a, fakeAct{kind: actPeerWrite, fc: fc})
		}
		if fc.started() && fc.inWrote == fc.inTotal && !fc.finSent && !fc.noFin {
			a = append(a, fakeAct{kind: actPeerFin, fc: fc})
		}
		if fc.resetOK && fc.started() {
			a = append(a, fakeAct{kind: actReset, fc: fc})
		}
	}
	k.acts = a
	return a
}

func (fc *fconn) started() bool { return fc.cud == 0 && fc.b.DialAddr() == nil }

// pick chooses an action, weighted by kind (the weights are the seed's: a slow peer, a
// flaky network ...).
func (k *fakeKernel) pick(acts []fakeAct) fakeAct {
	total := 0
	for _, a := range acts {
		total += k.opt.weight[a.kind]
	}
	if total <= 0 {
		return acts[k.rng.IntN(len(acts))]
	}
	x := k.rng.IntN(total)
	for _, a := range acts {
		x -= k.opt.weight[a.kind]
		if x < 0 {
			return a
		}
	}
	return acts[len(acts)-1]
}

// Wait runs the scheduler: a few actions, then back to the loop (its tasks, flushes and
// timers run between batches, as between two io_uring_enter calls). With nothing left to
// do it checks that nothing waits.
func (k *fakeKernel) Wait(timeout time.Duration) error {
	if k.quiet || !k.sim.simBegun() {
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
		k.cnt.counts[a.kind]++
		k.do(a)
		if k.failure != "" || k.steps >= k.maxSteps {
			if k.failure == "" {
				k.failf("no quiescence after %d steps (livelock?)", k.steps)
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
func (k *fakeKernel) quiescent() {
	var stuck []string
	for _, fc := range k.conns {
		if !fc.b.Ended() {
			stuck = append(stuck, k.sim.describe(fc)+"\n    its last events:\n      "+strings.Join(fc.trace, "\n      "))
		}
	}
	if len(stuck) > 0 {
		k.failf("quiescent after %d steps, but %d connection(s) not finished (a lost wake-up):\n%s\n%s",
			k.steps, len(stuck), strings.Join(stuck, "\n"), k.sim.queueState())
	}
	k.finish()
}

func (k *fakeKernel) finish() {
	k.quiet = true
	k.sim.done(k.failure, k.steps)
}

// waitWake sleeps until the queue's eventfd is written (or timeout passes) and consumes it.
func (k *fakeKernel) waitWake(timeout time.Duration) {
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
func (k *fakeKernel) drainWake() { k.waitWake(0) }

// fakeDriver is the fake kernel as the queue's loop.Driver (its Close is not the backend's).
type fakeDriver fakeKernel

func (d *fakeDriver) Wait(timeout time.Duration) error { return (*fakeKernel)(d).Wait(timeout) }
func (d *fakeDriver) Close()                           {}

// dispatch delivers a completion to the core, as a driver does.
func (k *fakeKernel) dispatch(fc *fconn, what string, ev loop.Event) {
	k.tracef("%v: %s res %d flags %#x", fc, what, ev.Res, ev.Flags)
	fc.tracef("%s res %d flags %#x", what, ev.Res, ev.Flags)
	k.lq.Dispatch(ev)
}

// do performs one action.
func (k *fakeKernel) do(a fakeAct) {
	fc := a.fc
	switch a.kind {
	case actAccept:
		k.sim.postAccept()
	case actRecv, actSend:
		if k.epoll {
			ev := unix.EPOLLIN
			if a.kind == actSend {
				ev = unix.EPOLLOUT
			}
			if k.rng.IntN(3) == 0 {
				ev = unix.EPOLLIN | unix.EPOLLOUT // whatever else is ready comes along
			}
			k.dispatch(fc, "ready", loop.Event{UD: fc.rud, Flags: uint32(ev)})
		} else if a.kind == actRecv {
			k.doRecv(fc)
		} else {
			k.doSend(fc)
		}
	case actNotif:
		k.doNotif(fc, a.i)
	case actConnect:
		res := int32(0)
		switch {
		case fc.ccancel:
			res = -int32(unix.ECANCELED)
		case k.rng.Float64() < k.opt.dialFail:
			res = -int32(unix.ECONNREFUSED)
		}
		ud := fc.cud
		fc.cud = 0 // completes once, whether the core still waits for it or not
		k.dispatch(fc, "connect", loop.Event{UD: ud, Res: res})
	case actPeerWrite, actPeerRead, actPeerFin, actReset, actUserPause:
		defer func() {
			k.tracef("%v: %s (rcvq %d sndq %d reset %v)", fc, actNames[a.kind], fc.rcvq, fc.sndq, fc.reset)
			if a.kind != actPeerRead && a.kind != actPeerWrite {
				fc.tracef("%s (rcvq %d sndq %d reset %v)", actNames[a.kind], fc.rcvq, fc.sndq, fc.reset)
			}
		}()
	}
	switch a.kind {
	case actPeerWrite:
		n := 1 + k.rng.Int64N(min(fc.inTotal-fc.inWrote, fc.window-fc.rcvq, 8<<10))
		fc.inWrote += n
		fc.rcvq += n
	case actPeerRead:
		fc.sndq -= 1 + k.rng.Int64N(fc.sndq)
	case actPeerFin:
		fc.finSent = true
	case actReset:
		if k.rng.IntN(4) == 0 { // resets come late as often as early
			fc.reset = true
			fc.sndq, fc.rcvq = 0, 0
			k.cnt.resets++
		}
	case actEngineClose, actAppRelease, actUserPause, actCloseExpire, actCloseExpire2:
		k.sim.doAct(a)
	}
}

func (k *fakeKernel) doRecv(fc *fconn) {
	ev := loop.Event{UD: fc.rud}
	switch {
	case fc.rcancel:
		ev.Res = -int32(unix.ECANCELED)
	case fc.reset:
		ev.Res = -int32(unix.ECONNRESET)
	case fc.rcvq > 0:
		buf, err := k.recv.Get()
		if err != nil && k.growRecv() {
			buf, err = k.recv.Get()
		}
		if err != nil || k.rng.IntN(50) == 0 {
			if err == nil {
				buf.Release() // a spurious ENOBUFS (another ring's buffers): re-armed at once
			}
			ev.Res = -int32(unix.ENOBUFS)
			k.cnt.enobufs++
			break
		}
		p := buf.Bytes()
		n := 1 + k.rng.Int64N(min(fc.rcvq, int64(len(p))))
		if k.rng.IntN(2) == 0 {
			n = min(fc.rcvq, int64(len(p))) // as much as fits, often
		}
		fakeStream(p[:n], fc.inKey, fc.inRecv)
		fc.inRecv += n
		fc.rcvq -= n
		fc.rbuf = buf
		ev.Res = int32(n)
		if fc.rmulti && k.rng.IntN(8) != 0 {
			ev.Flags |= uring.CQEFMore
		}
	default: // the peer's FIN, all read
		ev.Res = 0
	}
	k.dispatch(fc, "recv", ev)
	if fc.rbuf.Valid() {
		k.failf("%v: receive buffer not taken by the completion", fc)
	}
}

func (k *fakeKernel) doSend(fc *fconn) {
	ud := fc.sud
	fc.sud = 0
	ev := loop.Event{UD: ud, Res: int32(fc.sbytes)}
	for i, l := range fc.sloans {
		if l.Region() != nil && !l.Valid() {
			k.failf("%v: segment %d of a send in flight (cancelled %v) went back to its pool before the send completed", fc, i, fc.scancel)
			return
		}
	}
	fc.sloans = fc.sloans[:0]
	cancelled := fc.scancel
	if cancelled {
		fc.scancel = false
		for i, h := range fc.sheld {
			if !bytes.Equal(h.mem, h.want) {
				k.failf("%v: segment %d of a cancelled send changed before the send completed (reused early)", fc, i)
				return
			}
		}
		fc.sheld = nil
	}
	room := fc.sndCap - fc.sndq
	switch {
	case fc.reset:
		ev.Res = -int32(unix.ECONNRESET)
		if fc.szc && k.rng.IntN(2) == 0 {
			// io_uring reports most failed SEND_ZC with F_MORE: the notification follows.
			ev.Res = -int32(unix.EPIPE)
			ev.Flags = uring.CQEFMore
			fc.notifs = append(fc.notifs, fakeNotif{ud: ud})
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
			if fc.szc {
				ev.Flags = uring.CQEFMore
				fc.notifs = append(fc.notifs, fakeNotif{ud: ud})
			}
		} else {
			if !k.take(fc, n) {
				return
			}
			ev.Res = int32(n)
			if fc.szc {
				ev.Flags = uring.CQEFMore
				mem := fc.b.Pend(0).Bytes()[:n]
				fc.notifs = append(fc.notifs, fakeNotif{ud: ud, mem: mem, want: bytes.Clone(mem)})
			}
		}
		what := "send (cancelled)"
		if fc.szc {
			what = "send-zc (cancelled)"
		}
		k.dispatch(fc, what, ev)
		return
	case k.rng.IntN(20) == 0:
		ev.Res = -int32(unix.EAGAIN)
	case fc.szc:
		// MSG_WAITALL: whole, or short only when the connection failed meanwhile (io_uring
		// then reports what went out and the next operation meets the error).
		n := fc.sbytes
		if fc.resetOK && k.rng.IntN(10) == 0 {
			n = 1 + k.rng.Int64N(n)
			fc.reset = true
			k.cnt.resets++
		}
		if !k.take(fc, n) {
			return
		}
		if fc.reset {
			fc.sndq = 0
		}
		ev.Res = int32(n)
		ev.Flags = uring.CQEFMore
		if k.rng.IntN(16) == 0 {
			// The notification before the completion (not seen on Linux; the core takes it).
			k.dispatch(fc, "notif (early)", loop.Event{UD: ud, Flags: uring.CQEFNotif})
			break
		}
		mem := fc.b.Pend(0).Bytes()[:n]
		fc.notifs = append(fc.notifs, fakeNotif{ud: ud, mem: mem, want: bytes.Clone(mem)})
	default:
		// Short sends: at most the room left in the socket buffer, often less.
		n := min(fc.sbytes, fc.sndCap-fc.sndq)
		if k.rng.IntN(3) == 0 {
			n = 1 + k.rng.Int64N(n)
		}
		if !k.take(fc, n) {
			return
		}
		ev.Res = int32(n)
	}
	what := "send"
	if fc.szc {
		what = "send-zc"
	}
	k.dispatch(fc, what, ev)
}

// take moves n bytes from the head of the send queue into the socket send buffer, checking
// them against the stream the connection must send.
func (k *fakeKernel) take(fc *fconn, n int64) bool {
	c := fc.b
	if fc.outKey == nil {
		k.failf("%v: sent %d bytes but sends nothing", fc, n)
		return false
	}
	left := n
	for i := 0; i < fc.ssegs && left > 0; i++ {
		if i >= c.PendLen() {
			k.failf("%v: send in flight covers %d segments, %d pending", fc, fc.ssegs, c.PendLen())
			return false
		}
		s := c.Pend(i) // a pool's loan or the application's slice (SendBytes)
		if s.Ptr == nil {
			k.failf("%v: segment %d of a send in flight has no memory (returned early?)", fc, i)
			return false
		}
		p := s.Bytes()
		p = p[:min(int64(len(p)), left)]
		if fc.other {
			if !k.sim.takeOther(fc, s, p) {
				return false
			}
		} else if !fakeMatches(p, *fc.outKey, fc.kAcc) {
			k.failf("%v: bytes %d..%d taken by the kernel are not the stream's (lost, repeated or reordered)", fc, fc.kAcc, fc.kAcc+int64(len(p)))
			return false
		}
		fc.kAcc += int64(len(p))
		left -= int64(len(p))
	}
	if left > 0 {
		k.failf("%v: send of %d bytes covers only %d", fc, n, n-left)
		return false
	}
	fc.sndq += n
	return true
}

func (k *fakeKernel) doNotif(fc *fconn, i int) {
	nt := fc.notifs[i]
	fc.notifs = append(fc.notifs[:i], fc.notifs[i+1:]...)
	if !bytes.Equal(nt.mem, nt.want) {
		k.failf("%v: a zero-copy send's buffer changed before its notification (reused early)", fc)
		return
	}
	res := int32(0)
	if k.rng.IntN(3) == 0 {
		copied := uint32(uring.NotifUsageZCCopied)
		res = int32(copied)
	}
	k.dispatch(fc, "notif", loop.Event{UD: nt.ud, Res: res, Flags: uring.CQEFNotif})
}

// ---- epoll mode (zc/internal/be/epoll's ways) -----------------------------------------------------

// onReady is the plain backend's onEvent.
func (k *fakeKernel) onReady(fc *fconn, events uint32) {
	c := fc.b
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
func (k *fakeKernel) sendSync(c becontract.Conn) {
	fc := k.get(c)
	progress := false
	for c.PendLen() > 0 && !c.SockClosed() {
		if fc.reset {
			fc.tracef("writev: EPIPE")
			c.Fail("write", unix.EPIPE)
			return
		}
		room := fc.sndCap - fc.sndq
		if room <= 0 || !k.tame && k.rng.IntN(8) == 0 {
			break // EAGAIN
		}
		limit := 1 + k.rng.IntN(maxIov)
		if k.tame {
			limit = maxIov
		}
		n, nb := 0, int64(0)
		for n < c.PendLen() && n < limit {
			nb += int64(c.Pend(n).Len)
			n++
		}
		w := min(nb, room)
		if !k.tame && k.rng.IntN(3) == 0 {
			w = 1 + k.rng.Int64N(w)
		}
		fc.ssegs = n
		if !k.take(fc, w) {
			return
		}
		fc.tracef("writev %d of %d", w, nb)
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
func (k *fakeKernel) readSync(fc *fconn) {
	c := fc.b
	for i := 0; i < 16 && c.RecvArmed() && !c.SockClosed(); i++ {
		buf, err := k.recv.Get()
		if err != nil && k.growRecv() {
			buf, err = k.recv.Get()
		}
		if err != nil {
			k.StopRecv(c)
			fk(c).needArm = true
			k.starved = append(k.starved, c)
			k.cnt.enobufs++
			fc.tracef("read: no buffer")
			return
		}
		switch {
		case fc.reset:
			buf.Release()
			k.StopRecv(c)
			fc.tracef("read: ECONNRESET")
			c.GotEOF(unix.ECONNRESET)
			return
		case fc.rcvq == 0:
			buf.Release()
			if fc.finSent {
				k.StopRecv(c)
				fc.tracef("read: EOF")
				c.GotEOF(nil)
			}
			return // EAGAIN
		}
		p := buf.Bytes()
		n := 1 + k.rng.Int64N(min(fc.rcvq, int64(len(p))))
		if k.rng.IntN(2) == 0 {
			n = min(fc.rcvq, int64(len(p)))
		}
		fakeStream(p[:n], fc.inKey, fc.inRecv)
		fc.inRecv += n
		fc.rcvq -= n
		fc.tracef("read %d", n)
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
type fakeWritable fakeBk

func (w *fakeWritable) Flush(*loop.Queue) {
	if !w.c.Ended() {
		w.c.SendProgress()
	}
}
