// Package uring is zc's io_uring backend: multishot recv into a provided-buffer ring, one
// send operation in flight per connection carrying every queued buffer (SEND for one,
// SENDMSG with an iovec for several), SEND_ZC from the registered send pool for large
// buffers when the adaptive policy says so, CONNECT and multishot ACCEPT. It sees
// connections, listeners and its queue only through zc/internal/becontract.
package uring

import (
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
	bc "github.com/zcnet/zcnet/zc/internal/becontract"
)

const sendFlags = unix.MSG_WAITALL | unix.MSG_NOSIGNAL

// copyFlags are the flags of a copying send on c: kernel TLS refuses MSG_WAITALL
// (tls_sw_sendmsg: EOPNOTSUPP), so a kernel-TLS connection's sends go without it and may
// complete short, which the core resubmits.
func copyFlags(c bc.Conn) uint32 {
	if c.KernelTLS() {
		return unix.MSG_NOSIGNAL
	}
	return sendFlags
}

type iovBuf struct {
	iov [bc.MaxIov]unix.Iovec
	msg unix.Msghdr
}

type backend struct {
	q    bc.Queue
	lq   *loop.Queue
	ctr  *bc.Counters
	u    *loop.URing
	rp   *ringPool
	send *memreg.Pool
	iovs []*iovBuf
}

// uconn is the io_uring backend's own state of a connection (the core keeps it), and the
// loop.Owner of its operations.
type uconn struct {
	c       bc.Conn
	b       *backend
	recvUD  uint64 // the multishot receive (or the mapped path's poll) in flight
	dialUD  uint64 // the connect in flight
	needArm bool   // waiting for receive-ring buffers
	tx      uringTx
}

func (*uconn) ConnState() {}

// uringTx is the io_uring backend's state of a connection's send side.
type uringTx struct {
	ud   uint64 // the send in flight
	segs int    // segments in the send in flight
	zcOp bool
	// pollFirst: the last send gave up with EAGAIN; the next waits for room first
	// (IORING_RECVSEND_POLL_FIRST).
	pollFirst bool
	iov       *iovBuf
}

// us is the io_uring backend's state of c.
func us(c bc.Conn) *uconn { return c.BackendState().(*uconn) }

func (b *backend) NewConnState(c bc.Conn) bc.ConnState { return &uconn{c: c, b: b} }

// New returns the constructor of a queue's io_uring backend (caps: the probe of io_uring).
func New(caps *uring.Capabilities) bc.New {
	return func(q bc.Queue) (loop.Driver, bc.Backend, error) { return newBackend(q, caps) }
}

func newBackend(q bc.Queue, caps *uring.Capabilities) (loop.Driver, bc.Backend, error) {
	cfg := q.Config()
	zcrxTry := q.ZcrxWanted() // zcrx needs 32-byte completions
	u, err := loop.NewURing(q.Loop(), loop.URingConfig{Caps: caps, CQE32: zcrxTry})
	if err != nil {
		if errors.Is(err, unix.ENOMEM) {
			// The ring's own memory counts against RLIMIT_MEMLOCK on older kernels.
			return nil, nil, memreg.NewMemlockError(0, err)
		}
		return nil, nil, err
	}
	if err := q.SetupZcrx(u, zcrxTry); err != nil {
		u.Close()
		return nil, nil, err
	}
	b := &backend{q: q, lq: q.Loop(), ctr: q.Counters(), u: u}
	b.rp, err = newRingPool(u, q.Loop(), ringPoolConfig{BufSize: cfg.RecvBufSize, Initial: cfg.RecvBufs,
		MaxBytes: cfg.RecvPoolMax, Bundles: !cfg.NoBundles, Tag: cfg.PoolTag,
		KeepMapped: cfg.DebugBuffers})
	if err != nil {
		u.Close()
		return nil, nil, err
	}
	b.send, err = memreg.NewPool(cfg.Pool(memreg.PoolOptions{BufSize: cfg.SendBufSize, Initial: cfg.SendBufs,
		MaxBytes: cfg.SendPoolMax, OnFree: q.SendBufFreed, OnGrow: func(r *memreg.Region, _ int) error { return registerFixed(u, r) }}, true))
	if err != nil {
		u.Close()
		return nil, nil, err
	}
	q.SetSendPool(b.send)
	return u, b, nil
}

func (b *backend) Kind() bc.Kind { return bc.KindIOUring }

// URing: the core's own operations (fd watches, zcrx, the mapped receive) go in the ring
// (becontract.Ring).
func (b *backend) URing() *loop.URing { return b.u }

// WatchEpoll: the splice machinery's watches go into a private epoll instance whose
// readiness the ring reports (becontract.Splicer; Queue.SpliceEpoll).
func (b *backend) WatchEpoll() *loop.Epoll { return b.q.SpliceEpoll(b.u) }
func (b *backend) DirectOK() bool          { return true }
func (b *backend) ZeroCopy() bool          { return true }
func (b *backend) AppDirect() bool         { return true }
func (b *backend) RecvPool() *memreg.Pool  { return b.rp.pool }
func (b *backend) RingStats() bc.RingStats { return b.rp.stats() }
func (b *backend) Start(c bc.Conn) error   { return nil }
func (b *backend) Sending(c bc.Conn) bool  { return us(c).tx.ud != 0 }

func (b *backend) InFlightSegs(c bc.Conn) int {
	if t := &us(c).tx; t.ud != 0 {
		return t.segs
	}
	return 0
}

func (b *backend) CancelSend(c bc.Conn) {
	if t := &us(c).tx; t.ud != 0 && b.lq.OpLive(t.ud) {
		b.u.CancelOp(t.ud)
	}
}

func (b *backend) Close() {
	b.send.CloseWhenReleased()
}

func (b *backend) newOp(c bc.Conn, tag uint32) uint64 {
	c.OpStarted()
	return b.lq.NewOp(us(c), tag)
}

func (b *backend) FreeOp(c bc.Conn, ud uint64) {
	if b.lq.OpLive(ud) {
		b.lq.FreeOp(ud)
		c.OpEnded()
	}
}

func (b *backend) ArmRecv(c bc.Conn) {
	st := us(c)
	if c.ArmOwnRecv(b) {
		st.needArm = false
		return
	}
	st.recvUD = b.newOp(c, bc.TagRecv)
	sqe := b.u.GetSQE()
	bs := int64(b.rp.rr.BufSize())
	room := c.RecvRoom()
	switch {
	case b.rp.rr.MultishotLimit():
		// The receive ends by itself once it delivered the credit left (at least one
		// buffer): the connection never holds more than MaxRecvHeld (its share) plus
		// the rounding to whole buffers.
		sqe.PrepRecvMultishotLimit(int32(c.FD()), b.rp.rr.Group(), b.rp.rr.Bundles(), uint32(min(max(room, bs), 1<<30)))
	case room < 8*bs:
		// Close to its credit: one buffer per receive. A multishot receive (with bundles)
		// keeps delivering until its cancel lands and overshoots the credit many times.
		sqe.PrepRecvSelect(int32(c.FD()), b.rp.rr.Group(), 0)
	default:
		sqe.PrepRecvMultishot(int32(c.FD()), b.rp.rr.Group(), 0, b.rp.rr.Bundles())
	}
	sqe.UserData = st.recvUD
	c.RecvStarted()
	st.needArm = false
}

func (b *backend) StopRecv(c bc.Conn) {
	if c.StopOwnRecv(b) {
		return
	}
	b.CancelRecv(c)
}

// ArmPoll arms a multishot poll for readability as c's receive (becontract.Ring: the mapped
// receive reads the window itself when it fires).
func (b *backend) ArmPoll(c bc.Conn) {
	st := us(c)
	st.recvUD = b.newOp(c, bc.TagPoll)
	sqe := b.u.GetSQE()
	sqe.PrepPollAdd(int32(c.FD()), unix.POLLIN|unix.POLLRDHUP, true)
	sqe.UserData = st.recvUD
	c.RecvStarted()
}

// CancelRecv cancels the connection's armed receive (or poll): its last completion follows.
func (b *backend) CancelRecv(c bc.Conn) {
	if st := us(c); c.RecvArmed() && st.recvUD != 0 {
		b.u.CancelOp(st.recvUD)
	}
}

// fixedIndex is the registered-buffer index of a segment's memory, when its pool is
// registered with the ring (a zcrx area is not: it is sent from by address).
func (b *backend) fixedIndex(s *bc.Seg) (uint16, bool) {
	if !s.IsLoan {
		return 0, false
	}
	return b.u.FixedIndex(s.Loan.Region().Base(), s.Addr(), s.Len)
}

func (b *backend) Send(c bc.Conn) {
	ut := &us(c).tx
	if c.PendLen() == 0 || ut.ud != 0 || c.SockClosed() {
		return
	}
	head := c.Pend(0)
	left := head.Len
	zc := c.ZC()
	reprobe := false
	if zc.Probing(left) {
		if b.peerWindowSmall(c) {
			zc.SmallWindow()
			b.ctr.ZCSmallWindow.Add(1)
		} else {
			reprobe = zc.Reprobing()
		}
	}
	if zc.Use(left) {
		if reprobe {
			b.ctr.ZCProbes.Add(1)
		}
		addr := head.Addr()
		ud := b.newOp(c, bc.TagSendZC)
		sqe := b.u.GetSQE()
		if idx, ok := b.fixedIndex(&head); ok {
			sqe.PrepSendZCFixed(int32(c.FD()), addr, uint32(left), sendFlags, uring.SendZCReportUsage, idx)
		} else {
			sqe.PrepSendZC(int32(c.FD()), addr, uint32(left), sendFlags, uring.SendZCReportUsage)
		}
		if ut.pollFirst {
			sqe.IoPrio |= uring.RecvsendPollFirst
			ut.pollFirst = false
		}
		sqe.UserData = ud
		ut.ud, ut.segs, ut.zcOp = ud, 1, true
		c.ZCStart(ud)
		c.CountSend(true)
		return
	}
	// Every queued buffer (up to MaxIov, MaxSendBatch bytes) in one copying send.
	n, bytes := 1, left
	var iv *iovBuf
	for n < c.PendLen() && n < bc.MaxIov && bytes < bc.MaxSendBatch {
		s := c.Pend(n)
		if zc.WouldUse(s.Len) {
			break // a large buffer the policy sends zero-copy: on its own, next
		}
		zc.CountCopy(s.Len)
		if iv == nil {
			iv = b.getIov()
			iv.iov[0].Base = head.Ptr
			iv.iov[0].SetLen(head.Len)
		}
		iv.iov[n].Base = s.Ptr
		iv.iov[n].SetLen(s.Len)
		bytes += s.Len
		n++
	}
	ud := b.newOp(c, bc.TagSend)
	sqe := b.u.GetSQE()
	if m := c.TLSSendCap(); m >= 0 && left > m {
		left = m // kernel TLS: the records one send may cost stay under the rekey bound
	}
	if n == 1 {
		sqe.PrepSend(int32(c.FD()), head.Addr(), uint32(left), copyFlags(c))
	} else {
		n = bc.CapIov(iv.iov[:n], c.TLSSendCap())
		iv.msg = unix.Msghdr{Iov: &iv.iov[0]}
		iv.msg.SetIovlen(n)
		sqe.PrepSendmsg(int32(c.FD()), unsafe.Pointer(&iv.msg), copyFlags(c))
		ut.iov = iv
	}
	if ut.pollFirst {
		sqe.IoPrio |= uring.RecvsendPollFirst
		ut.pollFirst = false
	}
	sqe.UserData = ud
	ut.ud, ut.segs, ut.zcOp = ud, n, false
	c.CountSend(false)
}

// peerWindowSmall reports whether the peer's receive window cuts c's segments too small for
// zero-copy (becontract.ZCSegmentsSmall), from one TCP_INFO read; asked before each
// zero-copy probe only. When TCP_INFO fails the send goes on as before.
func (b *backend) peerWindowSmall(c bc.Conn) bool {
	ti, err := c.Socket().TCPInfo()
	return err == nil && bc.ZCSegmentsSmall(ti.SndMSS, ti.PMTU)
}

func (b *backend) getIov() *iovBuf {
	if n := len(b.iovs); n > 0 {
		iv := b.iovs[n-1]
		b.iovs = b.iovs[:n-1]
		return iv
	}
	return new(iovBuf)
}

func (b *backend) putIov(st *uconn) {
	if t := &st.tx; t.iov != nil {
		clear(t.iov.iov[:])
		b.iovs = append(b.iovs, t.iov)
		t.iov = nil
	}
}

// CloseSocket closes the descriptor. io_uring requests hold their own reference to the file:
// the receive is cancelled so the socket really goes (a FIN, or a RST after SO_LINGER 0);
// prepared SQEs naming the descriptor are submitted first, so the number cannot be reused
// under them.
func (b *backend) CloseSocket(c bc.Conn) {
	b.StopRecv(c)
	b.u.Submit()
	c.Socket().Close()
}

func (b *backend) Dial(c bc.Conn) {
	sa, st := c.DialAddr(), us(c)
	st.dialUD = b.newOp(c, bc.TagConnect)
	sqe := b.u.GetSQE()
	sqe.PrepConnect(int32(c.FD()), uintptr(sa.Pointer()), sa.Len())
	sqe.UserData = st.dialUD
	b.u.Ring().Keep(sa)
}

func (b *backend) CancelDial(c bc.Conn) {
	if st := us(c); c.DialAddr() != nil && b.lq.OpLive(st.dialUD) {
		b.u.CancelOp(st.dialUD)
	}
}

func (b *backend) DropDial(c bc.Conn) { b.FreeOp(c, us(c).dialUD) }

// OnEvent handles the connection's completions.
func (st *uconn) OnEvent(lq *loop.Queue, ev loop.Event) {
	c, b := st.c, st.b
	ut := &st.tx
	more := ev.Flags&uring.CQEFMore != 0
	switch ev.Tag {
	case bc.TagRecv:
		b.onRecv(c, st, ev, more)
	case bc.TagSend:
		b.FreeOp(c, ev.UD)
		ut.ud, ut.segs = 0, 0
		b.putIov(st)
		bc.AfterSend(c, ev.Res, &ut.pollFirst)
	case bc.TagSendZC:
		if ev.Flags&uring.CQEFNotif != 0 {
			c.ZCNotified(ev.UD, uint32(ev.Res)&uring.NotifUsageZCCopied != 0)
			return
		}
		ut.ud, ut.segs, ut.zcOp = 0, 0, false
		bc.AfterSendZC(c, ev.UD, ev.Res, more, &ut.pollFirst)
	case bc.TagConnect:
		b.FreeOp(c, ev.UD)
		c.DialDone(ev.Res)
	case bc.TagPoll:
		if !more {
			b.FreeOp(c, ev.UD)
			st.recvUD = 0
			c.RecvEnded()
		}
		c.OnPoll(ev) // only the mapped path polls
		if c.InClose() {
			c.AdvanceClose()
		}
	}
}

func (b *backend) onRecv(c bc.Conn, st *uconn, ev loop.Event, more bool) {
	if !more {
		b.FreeOp(c, ev.UD)
		st.recvUD = 0
		c.RecvEnded()
	}
	switch res := ev.Res; {
	case res > 0:
		b.ctr.RecvRing.Add(uint64(res))
		b.rp.received(ev, c.Deliver)
	case res == 0:
		c.GotEOF(nil)
	case res == -int32(unix.ENOBUFS):
		if !c.RecvArmed() && !c.InClose() {
			st.needArm = true
			b.rp.rr.WaitBuffers((*rearm)(st))
		}
		return
	case res == -int32(unix.ECANCELED), res == -int32(unix.EAGAIN):
		// Cancelled (paused, closing), or given up on a non-blocking socket: re-armed below.
	default:
		c.GotEOF(unix.Errno(-res))
	}
	bc.AfterRecv(c)
}

// rearm is a connection's state as the loop.Flusher the receive ring calls once buffers are
// back.
type rearm uconn

func (r *rearm) Flush(*loop.Queue) {
	if r.needArm {
		r.needArm = false
		r.c.Rearm()
	}
}

// ---- listening -------------------------------------------------------------------------

// upart is a listener's part as the loop.Owner of its multishot accept.
type upart struct {
	p bc.Listener
	b *backend
}

func (b *backend) Listen(p bc.Listener) {
	if p.Armed() || p.Closing() {
		return
	}
	ud := b.lq.NewOp(&upart{p: p, b: b}, bc.TagAccept)
	p.SetUD(ud)
	sqe := b.u.GetSQE()
	sqe.PrepMultishotAccept(int32(p.FD()), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
	sqe.UserData = ud
	p.SetArmed(true)
}

func (b *backend) StopListen(p bc.Listener) {
	if p.Armed() {
		b.u.CancelOp(p.UD())
		return
	}
	p.Finish()
}

func (b *backend) PauseListen(p bc.Listener) {
	if p.Armed() {
		b.u.CancelOp(p.UD()) // the final completion comes back without re-arming
	}
}

func (up *upart) OnEvent(lq *loop.Queue, ev loop.Event) {
	p, b := up.p, up.b
	pause := false
	if ev.Res >= 0 {
		p.Accepted(int(ev.Res))
	} else {
		pause = p.AcceptFailed(unix.Errno(-ev.Res))
		if pause && ev.Flags&uring.CQEFMore != 0 {
			b.u.CancelOp(ev.UD) // stop the multishot: resume after the backoff
		}
	}
	if ev.Flags&uring.CQEFMore != 0 {
		return
	}
	b.lq.FreeOp(ev.UD)
	p.SetArmed(false)
	switch {
	case p.Closing():
		p.Finish()
	case p.Paused():
	case pause || p.BackingOff() && ev.Res < 0:
		p.PauseAccept()
	default:
		b.Listen(p)
	}
}
