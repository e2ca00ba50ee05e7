package zc

import (
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc/internal/be/epoll"
	beshim "github.com/zcnet/zcnet/zc/internal/be/shim"
	beuring "github.com/zcnet/zcnet/zc/internal/be/uring"
	"github.com/zcnet/zcnet/zc/internal/becontract"
)

// The backends live in packages of their own under zc/internal/be (uring, epoll with the
// plain backend, shim), behind the contract of zc/internal/becontract: what a backend may
// read of a connection, a listener and a queue, and what it reports. They import the
// contract, never zc, so the compiler keeps each in its room. This file is zc's side of the
// contract: the constructor table (the only place that names a backend package), the
// adapters that show a Conn, an lpart and a queue to a backend (beConn, beListener,
// beQueue), and backend, the queue's backend as the core calls it. The core asks the
// queue's capabilities (q.caps), asserted once in setBackend, never the backend's type.

// newBackend is the constructor table: the backend b's constructor (caps: io_uring's probe).
func newBackend(b Backend, caps *uring.Capabilities) becontract.New {
	switch b {
	case BackendIOUring:
		return beuring.New(caps)
	case BackendShim:
		return beshim.New
	}
	return epoll.NewPlain
}

// shimAvailable says whether the zcshim module can be used (nil), or why not (an error
// matching ErrNotSupported).
func shimAvailable() error { return beshim.Available() }

// Tags of the core's own operations in the kernel: the contract's (becontract.Tag*).
const (
	tagSpliceIn    = becontract.TagSpliceIn
	tagSpliceOut   = becontract.TagSpliceOut
	tagFileOut     = becontract.TagFileOut
	tagSpliceEpoll = becontract.TagSpliceEpoll
	tagRekeyOut    = becontract.TagRekeyOut
)

// backendState is a backend's own state of a connection (Conn.bk): opaque to the core.
type backendState = becontract.ConnState

// ringStats are a provided-buffer ring's counters (ringStatser).
type ringStats = becontract.RingStats

// backend is the queue's backend as the core calls it: the contract's Backend, shown each
// Conn as a beConn and each lpart as a beListener. Every method runs on the queue's goroutine.
type backend struct{ b becontract.Backend }

func (b backend) name() Backend                     { return Backend(b.b.Kind()) }
func (b backend) newConnState(c *Conn) backendState { return b.b.NewConnState((*beConn)(c)) }
func (b backend) start(c *Conn) error               { return b.b.Start((*beConn)(c)) }
func (b backend) armRecv(c *Conn)                   { b.b.ArmRecv((*beConn)(c)) }
func (b backend) stopRecv(c *Conn)                  { b.b.StopRecv((*beConn)(c)) }
func (b backend) send(c *Conn)                      { b.b.Send((*beConn)(c)) }
func (b backend) sending(c *Conn) bool              { return b.b.Sending((*beConn)(c)) }
func (b backend) inFlightSegs(c *Conn) int          { return b.b.InFlightSegs((*beConn)(c)) }
func (b backend) cancelSend(c *Conn)                { b.b.CancelSend((*beConn)(c)) }
func (b backend) closeSocket(c *Conn)               { b.b.CloseSocket((*beConn)(c)) }
func (b backend) freeOp(c *Conn, ud uint64)         { b.b.FreeOp((*beConn)(c), ud) }
func (b backend) zeroCopy() bool                    { return b.b.ZeroCopy() }
func (b backend) directOK() bool                    { return b.b.DirectOK() }
func (b backend) appDirect() bool                   { return b.b.AppDirect() }
func (b backend) dial(c *Conn)                      { b.b.Dial((*beConn)(c)) }
func (b backend) cancelDial(c *Conn)                { b.b.CancelDial((*beConn)(c)) }
func (b backend) dropDial(c *Conn)                  { b.b.DropDial((*beConn)(c)) }
func (b backend) listen(p *lpart)                   { b.b.Listen((*beListener)(p)) }
func (b backend) stopListen(p *lpart)               { b.b.StopListen((*beListener)(p)) }
func (b backend) pauseListen(p *lpart)              { b.b.PauseListen((*beListener)(p)) }
func (b backend) recvPool() *memreg.Pool            { return b.b.RecvPool() }
func (b backend) close()                            { b.b.Close() }

// Optional capabilities of a backend (becontract.Splicer, Ring, RecvInFlighter,
// RingStatser), as the core asks them: small interfaces, asserted once when the queue's
// backend is set (setBackend), so that the core asks q.caps and never the backend's type.

// spliceBackend: the splice relay (and SendFile's splice) run on this backend: a splice(2)
// of a duplicate of a connection's socket sees the connection's own stream.
type spliceBackend interface {
	// watchEpoll returns the epoll instance the queue's fd watches use (the backend's own,
	// or one whose readiness the ring reports).
	watchEpoll(q *queue) *loop.Epoll
}

// ringBackend: the backend owns an io_uring ring the core may put operations of its own
// in (polls of fd watches, their cancels, zcrx receivers, the mapped receive's poll).
type ringBackend interface {
	uring() *loop.URing
	// armPoll arms a multishot readability poll as c's receive (its completions reach the
	// connection's receive path: the mapped receive's onPoll).
	armPoll(c *Conn)
	// cancelRecv cancels c's armed receive or poll: its last completion follows.
	cancelRecv(c *Conn)
}

// recvInFlighter is a backend whose stopRecv clears c.recvArmed while a receive it posted
// may still complete (the zcshim backend: a RECV in the module): it reports whether one is
// out.
type recvInFlighter interface {
	recvInFlight(c *Conn) bool
}

// ringStatser is a backend with a provided-buffer ring, whose counters Stats adds up.
type ringStatser interface{ ringStats() ringStats }

type spliceCap struct{ s becontract.Splicer }

func (s spliceCap) watchEpoll(*queue) *loop.Epoll { return s.s.WatchEpoll() }

type ringCap struct{ r becontract.Ring }

func (r ringCap) uring() *loop.URing { return r.r.URing() }
func (r ringCap) armPoll(c *Conn)    { r.r.ArmPoll((*beConn)(c)) }
func (r ringCap) cancelRecv(c *Conn) { r.r.CancelRecv((*beConn)(c)) }

type inFlightCap struct{ f becontract.RecvInFlighter }

func (f inFlightCap) recvInFlight(c *Conn) bool { return f.f.RecvInFlight((*beConn)(c)) }

type statsCap struct{ s becontract.RingStatser }

func (s statsCap) ringStats() ringStats { return s.s.RingStats() }

// backendCaps are the capabilities of a queue's backend (nil: absent).
type backendCaps struct {
	splice   spliceBackend
	ring     ringBackend
	inFlight recvInFlighter
	stats    ringStatser
}

// setBackend makes b the queue's backend and asserts its capabilities, once.
func (q *queue) setBackend(b becontract.Backend) {
	q.be = backend{b}
	q.caps = backendCaps{}
	if s, ok := b.(becontract.Splicer); ok {
		q.caps.splice = spliceCap{s}
	}
	if r, ok := b.(becontract.Ring); ok {
		q.caps.ring = ringCap{r}
	}
	if f, ok := b.(becontract.RecvInFlighter); ok {
		q.caps.inFlight = inFlightCap{f}
	}
	if s, ok := b.(becontract.RingStatser); ok {
		q.caps.stats = statsCap{s}
	}
}

// ---- a queue, as a backend sees it ---------------------------------------------------

// beQueue is a queue as the contract's Queue.
type beQueue queue

func (bq *beQueue) q() *queue                      { return (*queue)(bq) }
func (bq *beQueue) Loop() *loop.Queue              { return bq.Queue }
func (bq *beQueue) Counters() *becontract.Counters { return &bq.ctr.Counters }
func (bq *beQueue) SetSendPool(p *memreg.Pool)     { bq.send = p }
func (bq *beQueue) SendPool() *memreg.Pool         { return bq.send }
func (bq *beQueue) SendBufFreed()                  { bq.q().sendBufFreed() }

// ZcrxWanted: a queue part needs the ring's 32-byte completions (zcrx's, a ringSetupPart).
func (bq *beQueue) ZcrxWanted() bool {
	want := false
	for _, p := range bq.parts {
		if r, ok := p.(ringSetupPart); ok && r.wantsCQE32(bq.q()) {
			want = true // every part is asked: asking records why not
		}
	}
	return want
}

// SetupZcrx sets the queue's ringSetupParts up on its new ring (zcrx's receive instance).
func (bq *beQueue) SetupZcrx(u *loop.URing, cqe32 bool) error {
	for _, p := range bq.parts {
		if r, ok := p.(ringSetupPart); ok {
			if err := r.ringMade(bq.q(), u, cqe32); err != nil {
				return err
			}
		}
	}
	return nil
}

// SpliceEpoll is the queue's watch epoll, from its watchPart (splice's).
func (bq *beQueue) SpliceEpoll(u *loop.URing) *loop.Epoll {
	for _, p := range bq.parts {
		if w, ok := p.(watchPart); ok {
			return w.ringEpoll(bq.q(), u)
		}
	}
	return nil
}

// Config is what the backend needs of the engine's configuration (made for each call: the
// constructors ask it once).
func (bq *beQueue) Config() *becontract.Config {
	e := bq.e
	cfg := &e.cfg
	dbg := e.poolOptions(memreg.PoolOptions{}, true) // Config.Debug's needs (Buffers)
	return &becontract.Config{RecvBufSize: cfg.RecvBufSize, RecvBufs: cfg.RecvBufs, RecvPoolMax: cfg.RecvPoolMax,
		SendBufSize: cfg.SendBufSize, SendBufs: cfg.SendBufs, SendPoolMax: cfg.SendPoolMax,
		NoBundles: cfg.NoBundles, DebugBuffers: dbg.KeepMapped, Scrub: dbg.Scrub, PoolTag: e}
}

// ---- a listener, as a backend sees it -------------------------------------------------

// beListener is one queue's part of a listener as the contract's Listener.
type beListener lpart

func (p *beListener) FD() int          { return p.fd }
func (p *beListener) Armed() bool      { return p.armed }
func (p *beListener) SetArmed(on bool) { p.armed = on }
func (p *beListener) UD() uint64       { return p.ud }
func (p *beListener) SetUD(ud uint64)  { p.ud = ud }
func (p *beListener) Closing() bool    { return p.closing }
func (p *beListener) Paused() bool     { return p.paused }
func (p *beListener) BackingOff() bool { return p.backoff > 0 }
func (p *beListener) Accepted(fd int)  { (*lpart)(p).accepted(fd) }
func (p *beListener) PauseAccept()     { (*lpart)(p).pauseAccept() }
func (p *beListener) Finish()          { (*lpart)(p).finish() }
func (p *beListener) AcceptFailed(err unix.Errno) bool {
	return (*lpart)(p).acceptFailed(err)
}

// ---- a connection, as a backend sees it -----------------------------------------------

// beConn is a connection as the contract's Conn: the facts a backend may read and the
// reports it makes (life.go: the state machine moves only through the core's reports).
type beConn Conn

func (bc *beConn) c() *Conn                           { return (*Conn)(bc) }
func (bc *beConn) FD() int                            { return bc.fd }
func (bc *beConn) Socket() *tcpglue.Socket            { return bc.sock }
func (bc *beConn) BackendState() becontract.ConnState { return bc.bk }
func (bc *beConn) SockClosed() bool                   { return bc.st.SockClosed() }
func (bc *beConn) InClose() bool                      { return bc.st.InClose() }
func (bc *beConn) Ended() bool                        { return bc.st.Ended() }
func (bc *beConn) RecvArmed() bool                    { return bc.recvArmed }
func (bc *beConn) Paused() bool                       { return bc.paused != 0 }
func (bc *beConn) SawEOF() bool                       { return bc.eof }
func (bc *beConn) KernelTLS() bool                    { return bc.tls != nil && bc.tls.inKernel() }
func (bc *beConn) RecvRoom() int64                    { return bc.c().credit() - bc.held.Load() }
func (bc *beConn) DialAddr() *tcpglue.RawSockaddr {
	if bc.connect == nil {
		return nil
	}
	return bc.connect.sa
}

func (bc *beConn) PendLen() int              { return bc.c().pendLen() }
func (bc *beConn) Pend(i int) becontract.Seg { return segView(&bc.tx.pend[i]) }
func (bc *beConn) RehomePend(i int, loan memreg.Loan, n int) becontract.Seg {
	c := bc.c()
	if c.tx.pend[i].kind == segApp {
		c.e.shareCtr.appCopied.Add(uint64(n))
	}
	return segView(c.rehomePend(i, loan, int32(n)))
}
func (bc *beConn) ZC() becontract.ZCPolicy { return (*zcView)(&bc.tx.zc) }
func (bc *beConn) TLSRekey() bool          { return bc.tls == nil || bc.tls.rekey(bc.c()) }
func (bc *beConn) TLSSendCap() int {
	if bc.tls == nil {
		return -1
	}
	return bc.tls.sendCap()
}

func (bc *beConn) RecvStarted()                      { bc.c().recvStarted() }
func (bc *beConn) RecvEnded()                        { bc.c().recvEnded() }
func (bc *beConn) OpStarted()                        { bc.c().opStarted() }
func (bc *beConn) OpEnded()                          { bc.c().opEnded() }
func (bc *beConn) Deliver(buf memreg.Buf, n int)     { bc.c().deliver(Data{buf: buf, n: n}) }
func (bc *beConn) GotEOF(err error)                  { bc.c().gotEOF(err) }
func (bc *beConn) CheckCredit()                      { bc.c().checkCredit() }
func (bc *beConn) AdvanceClose()                     { bc.c().advanceClose() }
func (bc *beConn) Rearm()                            { bc.c().armRecv() }
func (bc *beConn) Fail(op string, err error)         { bc.c().fail(bc.c().opErr(op, err)) }
func (bc *beConn) Advance(n int)                     { bc.c().advance(n) }
func (bc *beConn) SendProgress()                     { bc.c().sendProgress() }
func (bc *beConn) ZCStart(ud uint64)                 { bc.c().zcStart(ud) }
func (bc *beConn) ZCNotified(ud uint64, copied bool) { bc.c().zcNotified(ud, copied) }
func (bc *beConn) ZCCompleted(ud uint64, res int, notif, keep bool) {
	bc.c().zcCompleted(ud, res, notif, keep)
}
func (bc *beConn) Pump()              { bc.c().pump() }
func (bc *beConn) DialDone(res int32) { bc.c().dialDone(res) }

// CountSend counts one send operation the backend put in the kernel.
func (bc *beConn) CountSend(zc bool) {
	if zc {
		bc.tx.sendZCOps.Add(1)
		bc.q.ctr.SendZCOps.Add(1)
		return
	}
	bc.tx.sendOps.Add(1)
	bc.q.ctr.SendOps.Add(1)
}

// ArmOwnRecv arms the connection's own receive path (mapped, zcrx) through the queue's
// ring; false: it receives into the ring's buffers.
func (bc *beConn) ArmOwnRecv(becontract.Ring) bool {
	if bc.rx == nil {
		return false
	}
	bc.rx.arm(bc.q.caps.ring)
	return true
}

func (bc *beConn) StopOwnRecv(becontract.Ring) bool {
	if bc.rx == nil {
		return false
	}
	bc.rx.stop(bc.q.caps.ring)
	return true
}

// OnPoll: only the mapped path polls.
func (bc *beConn) OnPoll(ev loop.Event) { bc.rx.(polledRecv).onPoll(ev) }

// segView is a backend's view of segment s: its unsent bytes.
func segView(s *seg) becontract.Seg {
	v := becontract.Seg{IsLoan: s.kind == segLoan, App: s.kind == segApp, Off: int(s.off), Len: int(s.n - s.off)}
	if v.IsLoan {
		v.Loan = s.loan
	}
	if s.kind != segFile && v.Len > 0 {
		v.Ptr = s.ptr(int(s.off))
	}
	return v
}

// zcView is a connection's zero-copy policy as the contract's ZCPolicy.
type zcView zcPolicy

func (p *zcView) Use(n int) bool      { return (*zcPolicy)(p).use(n) }
func (p *zcView) WouldUse(n int) bool { return (*zcPolicy)(p).wouldUse(n) }
func (p *zcView) Probing(n int) bool  { return (*zcPolicy)(p).probing(n) }
func (p *zcView) Reprobing() bool     { return p.state == zcOff }
func (p *zcView) SmallWindow()        { (*zcPolicy)(p).smallWindow() }
func (p *zcView) CountCopy(n int)     { (*zcPolicy)(p).countCopy(n) }
