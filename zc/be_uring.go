package zc

import (
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
)

// The io_uring backend: multishot recv into a provided-buffer ring, one send operation in
// flight per connection carrying every queued buffer (SEND for one, SENDMSG with an iovec for
// several), SEND_ZC from the registered send pool for large buffers when the adaptive policy
// says so, CONNECT and multishot ACCEPT.

const sendFlags = unix.MSG_WAITALL | unix.MSG_NOSIGNAL

// copyFlags are the flags of a copying send on c: kernel TLS refuses MSG_WAITALL
// (tls_sw_sendmsg: EOPNOTSUPP), so a kernel-TLS connection's sends go without it and may
// complete short, which the core resubmits.
func copyFlags(c *Conn) uint32 {
	if c.kernelTLS() {
		return unix.MSG_NOSIGNAL
	}
	return sendFlags
}

type iovBuf struct {
	iov [maxIov]unix.Iovec
	msg unix.Msghdr
}

type uringBackend struct {
	q    *queue
	u    *loop.URing
	rp   *ringPool
	iovs []*iovBuf
}

// uconn is Conn seen as the loop.Owner of its io_uring operations.
type uconn Conn

// uringConn is the io_uring backend's own state of a connection (Conn.bk).
type uringConn struct {
	recvUD  uint64 // the multishot receive (or the mapped path's poll) in flight
	dialUD  uint64 // the connect in flight
	needArm bool   // waiting for receive-ring buffers
	tx      uringTx
}

func (*uringConn) backendState() {}

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
func us(c *Conn) *uringConn { return c.bk.(*uringConn) }

func (b *uringBackend) newConnState() backendState { return &uringConn{} }

func newURingBackend(q *queue, caps *uring.Capabilities) (loop.Driver, error) {
	cfg := &q.e.cfg
	zcrxTry := q.zcrxWanted() // zcrx needs 32-byte completions
	u, err := loop.NewURing(q.Queue, loop.URingConfig{Caps: caps, CQE32: zcrxTry})
	if err != nil {
		if errors.Is(err, unix.ENOMEM) {
			// The ring's own memory counts against RLIMIT_MEMLOCK on older kernels.
			return nil, memreg.NewMemlockError(0, err)
		}
		return nil, err
	}
	if err := q.setupZcrx(u, zcrxTry); err != nil {
		u.Close()
		return nil, err
	}
	b := &uringBackend{q: q, u: u}
	b.rp, err = newRingPool(u, q.Queue, ringPoolConfig{BufSize: cfg.RecvBufSize, Initial: cfg.RecvBufs,
		MaxBytes: cfg.RecvPoolMax, Bundles: !cfg.NoBundles, Tag: q.e,
		KeepMapped: q.e.dbg != nil && q.e.cfg.Debug.Buffers})
	if err != nil {
		u.Close()
		return nil, err
	}
	q.send, err = memreg.NewPool(q.e.poolOptions(memreg.PoolOptions{BufSize: cfg.SendBufSize, Initial: cfg.SendBufs,
		MaxBytes: cfg.SendPoolMax, Tag: q.e, OnFree: q.sendBufFreed, OnGrow: func(r *memreg.Region, _ int) error { return registerFixed(u, r) }}, true))
	if err != nil {
		u.Close()
		return nil, err
	}
	q.setBackend(b)
	return u, nil
}

func (b *uringBackend) name() Backend { return BackendIOUring }

// uring: the core's own operations (fd watches, zcrx, the mapped receive) go in the ring
// (ringBackend).
func (b *uringBackend) uring() *loop.URing { return b.u }

// watchEpoll: the splice machinery's watches go into a private epoll instance whose
// readiness the ring reports (spliceBackend; spliceQueue.ringEpoll).
func (b *uringBackend) watchEpoll(q *queue) *loop.Epoll { return q.spl.ringEpoll(q, b.u) }
func (b *uringBackend) directOK() bool                  { return true }
func (b *uringBackend) zeroCopy() bool                  { return true }
func (b *uringBackend) appDirect() bool                 { return true }
func (b *uringBackend) recvPool() *memreg.Pool          { return b.rp.pool }
func (b *uringBackend) ringStats() ringStats            { return b.rp.stats() }
func (b *uringBackend) start(c *Conn) error             { return nil }
func (b *uringBackend) sending(c *Conn) bool            { return us(c).tx.ud != 0 }

func (b *uringBackend) inFlightSegs(c *Conn) int {
	if t := &us(c).tx; t.ud != 0 {
		return t.segs
	}
	return 0
}

func (b *uringBackend) cancelSend(c *Conn) {
	if t := &us(c).tx; t.ud != 0 && b.q.OpLive(t.ud) {
		b.u.CancelOp(t.ud)
	}
}

func (b *uringBackend) close() {
	b.q.send.CloseWhenReleased()
}

func (b *uringBackend) newOp(c *Conn, tag uint32) uint64 {
	c.opStarted()
	return b.q.NewOp((*uconn)(c), tag)
}

func (b *uringBackend) freeOp(c *Conn, ud uint64) {
	if b.q.OpLive(ud) {
		b.q.FreeOp(ud)
		c.opEnded()
	}
}

func (b *uringBackend) armRecv(c *Conn) {
	if c.rx != nil {
		us(c).needArm = false
		c.rx.arm(b)
		return
	}
	st := us(c)
	st.recvUD = b.newOp(c, tagRecv)
	sqe := b.u.GetSQE()
	bs := int64(b.rp.rr.BufSize())
	room := c.credit() - c.held.Load()
	switch {
	case b.rp.rr.MultishotLimit():
		// The receive ends by itself once it delivered the credit left (at least one
		// buffer): the connection never holds more than MaxRecvHeld (its share) plus
		// the rounding to whole buffers.
		sqe.PrepRecvMultishotLimit(int32(c.fd), b.rp.rr.Group(), b.rp.rr.Bundles(), uint32(min(max(room, bs), 1<<30)))
	case room < 8*bs:
		// Close to its credit: one buffer per receive. A multishot receive (with bundles)
		// keeps delivering until its cancel lands and overshoots the credit many times.
		sqe.PrepRecvSelect(int32(c.fd), b.rp.rr.Group(), 0)
	default:
		sqe.PrepRecvMultishot(int32(c.fd), b.rp.rr.Group(), 0, b.rp.rr.Bundles())
	}
	sqe.UserData = st.recvUD
	c.recvStarted()
	st.needArm = false
}

func (b *uringBackend) stopRecv(c *Conn) {
	if c.rx != nil {
		c.rx.stop(b)
		return
	}
	b.cancelRecv(c)
}

// armPoll arms a multishot poll for readability as c's receive (ringBackend: the mapped
// receive reads the window itself when it fires).
func (b *uringBackend) armPoll(c *Conn) {
	st := us(c)
	st.recvUD = b.newOp(c, tagPoll)
	sqe := b.u.GetSQE()
	sqe.PrepPollAdd(int32(c.fd), unix.POLLIN|unix.POLLRDHUP, true)
	sqe.UserData = st.recvUD
	c.recvStarted()
}

// cancelRecv cancels the connection's armed receive (or poll): its last completion follows.
func (b *uringBackend) cancelRecv(c *Conn) {
	if st := us(c); c.recvArmed && st.recvUD != 0 {
		b.u.CancelOp(st.recvUD)
	}
}

// fixedIndex is the registered-buffer index of a segment's memory, when its pool is
// registered with the ring (a zcrx area is not: it is sent from by address).
func (b *uringBackend) fixedIndex(s *seg, addr uintptr, n int) (uint16, bool) {
	if s.kind != segLoan {
		return 0, false
	}
	return b.u.FixedIndex(s.loan.Region().Base(), addr, n)
}

func (b *uringBackend) send(c *Conn) {
	ut := &us(c).tx
	if c.pendLen() == 0 || ut.ud != 0 || c.st.SockClosed() {
		return
	}
	head := &c.tx.pend[0]
	left := int(head.n - head.off)
	reprobe := false
	if c.tx.zc.probing(left) {
		if b.peerWindowSmall(c) {
			c.tx.zc.smallWindow()
			b.q.ctr.zcSmallWindow.Add(1)
		} else {
			reprobe = c.tx.zc.state == zcOff
		}
	}
	if c.tx.zc.use(left) {
		if reprobe {
			b.q.ctr.zcProbes.Add(1)
		}
		addr := head.addr(int(head.off))
		ud := b.newOp(c, tagSendZC)
		sqe := b.u.GetSQE()
		if idx, ok := b.fixedIndex(head, addr, left); ok {
			sqe.PrepSendZCFixed(int32(c.fd), addr, uint32(left), sendFlags, uring.SendZCReportUsage, idx)
		} else {
			sqe.PrepSendZC(int32(c.fd), addr, uint32(left), sendFlags, uring.SendZCReportUsage)
		}
		if ut.pollFirst {
			sqe.IoPrio |= uring.RecvsendPollFirst
			ut.pollFirst = false
		}
		sqe.UserData = ud
		ut.ud, ut.segs, ut.zcOp = ud, 1, true
		c.zcStart(ud)
		c.tx.sendZCOps.Add(1)
		b.q.ctr.sendZCOps.Add(1)
		return
	}
	// Every queued buffer (up to maxIov, maxSendBatch bytes) in one copying send.
	n, bytes := 0, 0
	for n < c.pendLen() && n < maxIov && bytes < maxSendBatch {
		s := &c.tx.pend[n]
		if n > 0 {
			if c.tx.zc.wouldUse(int(s.n - s.off)) {
				break // a large buffer the policy sends zero-copy: on its own, next
			}
			c.tx.zc.countCopy(int(s.n - s.off))
		}
		bytes += int(s.n - s.off)
		n++
	}
	ud := b.newOp(c, tagSend)
	sqe := b.u.GetSQE()
	if m := c.tlsSendCap(); m >= 0 && left > m {
		left = m // kernel TLS: the records one send may cost stay under the rekey bound
	}
	if n == 1 {
		sqe.PrepSend(int32(c.fd), head.addr(int(head.off)), uint32(left), copyFlags(c))
	} else {
		iv := b.getIov()
		for i := 0; i < n; i++ {
			s := &c.tx.pend[i]
			iv.iov[i].Base = s.ptr(int(s.off))
			iv.iov[i].SetLen(int(s.n - s.off))
		}
		n = tlsCapIov(iv.iov[:n], c.tlsSendCap())
		iv.msg = unix.Msghdr{Iov: &iv.iov[0]}
		iv.msg.SetIovlen(n)
		sqe.PrepSendmsg(int32(c.fd), unsafe.Pointer(&iv.msg), copyFlags(c))
		ut.iov = iv
	}
	if ut.pollFirst {
		sqe.IoPrio |= uring.RecvsendPollFirst
		ut.pollFirst = false
	}
	sqe.UserData = ud
	ut.ud, ut.segs, ut.zcOp = ud, n, false
	c.tx.sendOps.Add(1)
	b.q.ctr.sendOps.Add(1)
}

// peerWindowSmall reports whether the peer's receive window cuts c's segments too small for
// zero-copy (zcSegmentsSmall), from one TCP_INFO read; asked before each zero-copy probe only.
// When TCP_INFO fails the send goes on as before.
func (b *uringBackend) peerWindowSmall(c *Conn) bool {
	ti, err := c.sock.TCPInfo()
	return err == nil && zcSegmentsSmall(ti.SndMSS, ti.PMTU)
}

func (b *uringBackend) getIov() *iovBuf {
	if n := len(b.iovs); n > 0 {
		iv := b.iovs[n-1]
		b.iovs = b.iovs[:n-1]
		return iv
	}
	return new(iovBuf)
}

func (b *uringBackend) putIov(c *Conn) {
	if t := &us(c).tx; t.iov != nil {
		clear(t.iov.iov[:])
		b.iovs = append(b.iovs, t.iov)
		t.iov = nil
	}
}

// closeSocket closes the descriptor. io_uring requests hold their own reference to the file:
// the receive is cancelled so the socket really goes (a FIN, or a RST after SO_LINGER 0);
// prepared SQEs naming the descriptor are submitted first, so the number cannot be reused
// under them.
func (b *uringBackend) closeSocket(c *Conn) {
	b.stopRecv(c)
	b.u.Submit()
	c.sock.Close()
}

func (b *uringBackend) dial(c *Conn) {
	cs, st := c.connect, us(c)
	st.dialUD = b.newOp(c, tagConnect)
	sqe := b.u.GetSQE()
	sqe.PrepConnect(int32(c.fd), uintptr(cs.sa.Pointer()), cs.sa.Len())
	sqe.UserData = st.dialUD
	b.u.Ring().Keep(cs.sa)
}

func (b *uringBackend) cancelDial(c *Conn) {
	if st := us(c); c.connect != nil && b.q.OpLive(st.dialUD) {
		b.u.CancelOp(st.dialUD)
	}
}

func (b *uringBackend) dropDial(c *Conn) { b.freeOp(c, us(c).dialUD) }

// OnEvent handles the connection's completions.
func (uc *uconn) OnEvent(lq *loop.Queue, ev loop.Event) {
	c := (*Conn)(uc)
	b := c.q.be.(*uringBackend)
	ut := &us(c).tx
	more := ev.Flags&uring.CQEFMore != 0
	switch ev.Tag {
	case tagRecv:
		b.onRecv(c, ev, more)
	case tagSend:
		b.freeOp(c, ev.UD)
		ut.ud, ut.segs = 0, 0
		b.putIov(c)
		switch {
		case ev.Res > 0:
			c.advance(int(ev.Res))
		case ev.Res == -int32(unix.EAGAIN):
			// A non-blocking socket can make io_uring give up with EAGAIN (send buffer full):
			// send again, waiting for room first.
			ut.pollFirst = true
		case ev.Res < 0 && ev.Res != -int32(unix.ECANCELED):
			c.fail(c.opErr("write", unix.Errno(-ev.Res)))
		}
		c.sendProgress()
	case tagSendZC:
		if ev.Flags&uring.CQEFNotif != 0 {
			c.zcNotified(ev.UD, uint32(ev.Res)&uring.NotifUsageZCCopied != 0)
			return
		}
		ut.ud, ut.segs, ut.zcOp = 0, 0, false
		// A notification follows when the kernel says so (F_MORE), and also for a send cancelled
		// because an earlier linked request failed: that one completes with -ECANCELED without
		// F_MORE, yet its notification comes (the pages were never queued, so it is harmless,
		// but the count must expect it).
		notif := more || ev.Res == -int32(unix.ECANCELED)
		again := ev.Res == -int32(unix.EAGAIN)
		if again {
			ut.pollFirst = true // as for SEND: the segment stays, it goes again
		}
		c.zcCompleted(ev.UD, int(ev.Res), notif, again)
		if ev.Res < 0 && ev.Res != -int32(unix.ECANCELED) && !again {
			c.fail(c.opErr("write", unix.Errno(-ev.Res)))
		}
		c.sendProgress() // a finished connection's late send: its buffers go back (lateSendDone)
	case tagConnect:
		b.freeOp(c, ev.UD)
		c.dialDone(ev.Res)
	case tagPoll:
		if !more {
			b.freeOp(c, ev.UD)
			us(c).recvUD = 0
			c.recvEnded()
		}
		c.rx.(*mappedRecv).onPoll(ev) // only the mapped path polls
		if c.inClose() {
			c.advanceClose()
		}
	}
}

func (b *uringBackend) onRecv(c *Conn, ev loop.Event, more bool) {
	if !more {
		b.freeOp(c, ev.UD)
		us(c).recvUD = 0
		c.recvEnded()
	}
	switch res := ev.Res; {
	case res > 0:
		b.q.ctr.recvRing.Add(uint64(res))
		b.rp.received(ev, func(buf memreg.Buf, n int) { c.deliver(Data{buf: buf, n: n}) })
	case res == 0:
		c.gotEOF(nil)
	case res == -int32(unix.ENOBUFS):
		if !c.recvArmed && !c.inClose() {
			us(c).needArm = true
			b.rp.rr.WaitBuffers((*rearm)(c))
		}
		return
	case res == -int32(unix.ECANCELED), res == -int32(unix.EAGAIN):
		// Cancelled (paused, closing), or given up on a non-blocking socket: re-armed below.
	default:
		c.gotEOF(unix.Errno(-res))
	}
	if c.ended() {
		return
	}
	c.checkCredit()
	if c.inClose() {
		c.advanceClose()
		return
	}
	if !c.recvArmed {
		c.armRecv()
	}
}

// rearm is Conn as the loop.Flusher the receive ring calls once buffers are back.
type rearm Conn

func (r *rearm) Flush(*loop.Queue) {
	c := (*Conn)(r)
	if st := us(c); st.needArm {
		st.needArm = false
		c.armRecv()
	}
}

// ---- listening -------------------------------------------------------------------------

// upart is lpart seen as the loop.Owner of its multishot accept.
type upart lpart

func (b *uringBackend) listen(p *lpart) {
	if p.armed || p.closing {
		return
	}
	p.ud = b.q.NewOp((*upart)(p), tagAccept)
	sqe := b.u.GetSQE()
	sqe.PrepMultishotAccept(int32(p.fd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
	sqe.UserData = p.ud
	p.armed = true
}

func (b *uringBackend) stopListen(p *lpart) {
	if p.armed {
		b.u.CancelOp(p.ud)
		return
	}
	p.finish()
}

func (b *uringBackend) pauseListen(p *lpart) {
	if p.armed {
		b.u.CancelOp(p.ud) // the final completion comes back without re-arming
	}
}

func (up *upart) OnEvent(lq *loop.Queue, ev loop.Event) {
	p := (*lpart)(up)
	b := p.q.be.(*uringBackend)
	pause := false
	if ev.Res >= 0 {
		p.accepted(int(ev.Res))
	} else {
		pause = p.acceptFailed(unix.Errno(-ev.Res))
		if pause && ev.Flags&uring.CQEFMore != 0 {
			b.u.CancelOp(ev.UD) // stop the multishot: resume after the backoff
		}
	}
	if ev.Flags&uring.CQEFMore != 0 {
		return
	}
	b.q.FreeOp(ev.UD)
	p.armed = false
	switch {
	case p.closing:
		p.finish()
	case p.paused:
	case pause || p.backoff > 0 && ev.Res < 0:
		p.pauseAccept()
	default:
		b.listen(p)
	}
}
