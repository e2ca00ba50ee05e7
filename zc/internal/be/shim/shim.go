// Package shim is zc's zcshim backend: the same queues over the zcshim kernel module
// (/dev/zcshim, see kmod/), for kernels or containers where io_uring is disabled or blocked.
// Each queue opens two module contexts (the module runs one socket's operations in one
// ordered list per context, so a RECV waiting for data would hold back the SENDs behind it):
// tx for zero-copy SENDs, rx for RECVs. Readiness comes from the queue's epoll (the epoll
// base of zc/internal/be/epoll): a RECV is posted only when the socket is readable, so idle
// connections hold no receive buffer. SendPath does not apply: the module has only its
// zero-copy send, and its notification says whether the stack copied. It sees connections,
// listeners and its queue only through zc/internal/becontract.
package shim

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/kmod/shim"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/zc/internal/be/epoll"
	bc "github.com/zcnet/zcnet/zc/internal/becontract"
)

// Available says whether the module can be used (nil), or why not (an error matching
// ErrNotSupported).
func Available() error { return shimErr(shim.Probe()) }

// shimErr makes the module's "cannot" errors match ErrNotSupported.
func shimErr(err error) error {
	if err != nil && errors.Is(err, shim.ErrABIMismatch) && !errors.Is(err, shim.ErrNotSupported) {
		return fmt.Errorf("%w: %w", shim.ErrNotSupported, err)
	}
	return err
}

const (
	shimSQEntries   = 1024
	shimCQEntries   = 4096
	shimMaxInflight = 32 // SENDs in flight per connection
	shimCQSlack     = 16
)

// ss is the shim backend's module state of c (nil until Start attached it).
func ss(c bc.Conn) *connState {
	st, _ := epoll.ES(c).Own.(*connState)
	return st
}

func (*connState) ConnState() {}

// connState is a connection's module state, and the owner of its module operations.
type connState struct {
	c              bc.Conn
	b              *backend
	txSock, rxSock shim.SockID
	attached       bool
	inflight       int        // SENDs waiting for their completion
	recvOut        bool       // a RECV is posted
	recvBuf        memreg.Buf // its buffer
	ready          bool       // readable and no RECV consumed it yet
	blocked        bool       // waiting for module queue room
}

type backend struct {
	epoll.Common
	ctr     *bc.Counters
	tx, rx  *shim.Queue
	recv    *memreg.Pool
	send    *memreg.Pool
	txKeys  map[*memreg.Region]shim.RegionKey
	rxKeys  map[*memreg.Region]shim.RegionKey
	txUD    uint64 // epoll registrations of the module contexts
	rxUD    uint64
	cqCap   int
	sendRes int // tx CQ slots reserved (2 per SEND until its completion, 1 until its notification)
	cqes    []shim.Completion
	blocked []bc.Conn
	dirty   bool
	// recvBufs are the buffers of RECVs the module holds, by operation: what a stopping
	// queue never reaped goes back to the pool once the contexts are closed.
	recvBufs map[uint64]memreg.Buf
}

// sbe is backend seen as the owner of the module contexts' epoll registrations and as the
// flusher that submits before the loop waits.
type sbe backend

// New makes queue q's zcshim backend.
func New(q bc.Queue) (loop.Driver, bc.Backend, error) {
	cfg := q.Config()
	ep, err := loop.NewEpoll(q.Loop())
	if err != nil {
		return nil, nil, err
	}
	b := &backend{Common: epoll.Common{Q: q, LQ: q.Loop(), EP: ep}, ctr: q.Counters(),
		txKeys: map[*memreg.Region]shim.RegionKey{}, rxKeys: map[*memreg.Region]shim.RegionKey{},
		cqes: make([]shim.Completion, 256), recvBufs: map[uint64]memreg.Buf{}}
	b.OnConn = b.onReadable
	fail := func(err error) (loop.Driver, bc.Backend, error) {
		b.Close()
		ep.Close()
		return nil, nil, shimErr(err)
	}
	if b.tx, err = shim.Open(shim.Config{Entries: shimSQEntries, CQEntries: shimCQEntries}); err != nil {
		return fail(err)
	}
	// At most one RECV per connection, and at most shim.MaxSocks connections.
	if b.rx, err = shim.Open(shim.Config{Entries: shim.MaxSocks, CQEntries: 2 * shim.MaxSocks}); err != nil {
		return fail(err)
	}
	_, cq := b.tx.Entries()
	b.cqCap = int(cq)
	b.recv, err = memreg.NewPool(cfg.Pool(memreg.PoolOptions{BufSize: cfg.RecvBufSize, Initial: cfg.RecvBufs,
		MaxBytes: cfg.RecvPoolMax, OnGrow: func(r *memreg.Region, _ int) error {
			k, err := b.rx.RegisterRegion(r.Base(), r.Info().Size, 0)
			if err != nil {
				return err
			}
			b.rxKeys[r] = k
			// Forwarded receive buffers (SendData) go out through tx.
			if k, err = b.tx.RegisterRegion(r.Base(), r.Info().Size, 0); err != nil {
				return err
			}
			b.txKeys[r] = k
			return nil
		}}, false))
	if err != nil {
		return fail(err)
	}
	b.send, err = memreg.NewPool(cfg.Pool(memreg.PoolOptions{BufSize: cfg.SendBufSize, Initial: cfg.SendBufs,
		MaxBytes: cfg.SendPoolMax, OnFree: q.SendBufFreed, OnGrow: func(r *memreg.Region, _ int) error {
			k, err := b.tx.RegisterRegion(r.Base(), r.Info().Size, 0)
			if err == nil {
				b.txKeys[r] = k
			}
			return err
		}}, true))
	if err != nil {
		return fail(err)
	}
	q.SetSendPool(b.send)
	b.txUD = b.LQ.NewOp((*sbe)(b), bc.TagShim)
	b.rxUD = b.LQ.NewOp((*sbe)(b), bc.TagShim)
	if err := ep.Add(b.tx.Fd(), unix.EPOLLIN, b.txUD); err != nil {
		return fail(err)
	}
	if err := ep.Add(b.rx.Fd(), unix.EPOLLIN, b.rxUD); err != nil {
		return fail(err)
	}
	return ep, b, nil
}

func (b *backend) Kind() bc.Kind          { return bc.KindShim }
func (b *backend) DirectOK() bool         { return false }
func (b *backend) ZeroCopy() bool         { return true }
func (b *backend) AppDirect() bool        { return false } // copies into its registered buffers
func (b *backend) RecvPool() *memreg.Pool { return b.recv }
func (b *backend) Sending(c bc.Conn) bool { return ss(c) != nil && ss(c).inflight > 0 }

// CancelSend: the module's queued sends end with the socket's close (CloseSocket detaches
// the connection, and the module cancels what it holds).
func (b *backend) CancelSend(c bc.Conn) {}

func (b *backend) InFlightSegs(c bc.Conn) int {
	if ss(c) == nil {
		return 0
	}
	return ss(c).inflight
}

// Close closes the module contexts (the module cancels what they hold and keeps pages the
// stack still references pinned until it lets go), then the pools.
func (b *backend) Close() {
	if b.tx != nil {
		b.tx.Close()
		b.tx = nil
	}
	if b.rx != nil {
		b.rx.Close()
		b.rx = nil
	}
	// The contexts are gone (the module cancelled their RECVs): their buffers are ours again.
	for ud, buf := range b.recvBufs {
		buf.Release()
		delete(b.recvBufs, ud)
	}
	if b.recv != nil {
		b.recv.CloseWhenReleased()
	}
	if b.send != nil {
		b.send.CloseWhenReleased()
	}
}

func (b *backend) Start(c bc.Conn) error {
	st := &connState{c: c, b: b}
	tx, err := b.tx.Attach(c.FD())
	if err != nil {
		return shimErr(err)
	}
	rx, err := b.rx.Attach(c.FD())
	if err != nil {
		b.tx.Detach(tx)
		return shimErr(err)
	}
	st.txSock, st.rxSock, st.attached = tx, rx, true
	epoll.ES(c).Own = st
	if err := b.Register(c); err != nil {
		b.tx.Detach(tx)
		b.rx.Detach(rx)
		epoll.ES(c).Own = nil
		return err
	}
	return nil
}

func (b *backend) markDirty() {
	if !b.dirty {
		b.dirty = true
		b.LQ.MarkDirty((*sbe)(b))
	}
}

// Flush submits what was prepared (before the loop waits) and serves blocked connections.
func (s *sbe) Flush(*loop.Queue) {
	b := (*backend)(s)
	b.dirty = false
	b.submit()
}

func (b *backend) submit() {
	if b.tx != nil && b.tx.Prepared() > 0 {
		b.tx.Submit(-1, 0, 0)
	}
	if b.rx != nil && b.rx.Prepared() > 0 {
		b.rx.Submit(-1, 0, 0)
	}
}

// OnEvent: a module context has completions.
func (s *sbe) OnEvent(lq *loop.Queue, ev loop.Event) {
	b := (*backend)(s)
	b.reap()
	if len(b.blocked) > 0 {
		bl := b.blocked
		b.blocked = nil
		for _, c := range bl {
			if ss(c) != nil {
				ss(c).blocked = false
			}
			if !c.Ended() {
				c.Pump()
				if !c.Paused() && c.RecvArmed() && ss(c) != nil && ss(c).ready {
					b.postRecv(c)
				}
			}
		}
	}
}

func (b *backend) reap() {
	for _, qq := range []*shim.Queue{b.tx, b.rx} {
		for qq != nil {
			n := qq.Completions(b.cqes)
			if n == 0 {
				break
			}
			for _, cqe := range b.cqes[:n] {
				b.LQ.Dispatch(loop.Event{UD: cqe.UserData, Res: cqe.Res, Flags: cqe.Flags})
			}
		}
	}
}

func (b *backend) block(c bc.Conn) {
	if !ss(c).blocked {
		ss(c).blocked = true
		b.blocked = append(b.blocked, c)
	}
}

// txKey names r in the tx context (false: not registered there, e.g. another queue's).
func (b *backend) txKey(r *memreg.Region) (shim.RegionKey, bool) {
	k, ok := b.txKeys[r]
	return k, ok
}

func (b *backend) Send(c bc.Conn) {
	st := ss(c)
	if st == nil || !st.attached || c.SockClosed() {
		return
	}
	for st.inflight < c.PendLen() && st.inflight < shimMaxInflight {
		if b.sendRes+2 > b.cqCap-shimCQSlack || b.tx.SQSpace() == 0 {
			b.block(c)
			return
		}
		s := c.Pend(st.inflight)
		var key shim.RegionKey
		ok := false
		if s.IsLoan {
			key, ok = b.txKey(s.Loan.Region())
		}
		if !ok {
			// A buffer of another queue's pool, or the application's memory (SendBytes):
			// not registered here, copy it into ours.
			nb, err := b.send.Get()
			if err != nil {
				b.block(c)
				return
			}
			k := copy(nb.Bytes(), s.Bytes())
			loan, err := nb.Lend()
			if err != nil {
				nb.Release()
				b.block(c)
				return
			}
			s = c.RehomePend(st.inflight, loan, k)
			key, _ = b.txKey(loan.Region())
		}
		off := uint64(s.Loan.Addr()-s.Loan.Region().Base()) + uint64(s.Off)
		c.OpStarted()
		ud := b.LQ.NewOp(st, bc.TagSendZC)
		if err := b.tx.PrepSend(st.txSock, key, off, uint32(s.Len), ud); err != nil {
			b.FreeOp(c, ud)
			b.block(c)
			return
		}
		c.ZCStart(ud)
		b.sendRes += 2
		st.inflight++
		c.CountSend(true)
		b.markDirty()
	}
}

// OnEvent: a module operation of the connection completed.
func (st *connState) OnEvent(lq *loop.Queue, ev loop.Event) {
	c, b := st.c, st.b
	cqe := shim.Completion{UserData: ev.UD, Res: ev.Res, Flags: ev.Flags}
	switch ev.Tag {
	case bc.TagSendZC:
		if cqe.Notif() {
			b.sendRes--
			c.ZCNotified(ev.UD, cqe.Copied())
			return
		}
		b.sendRes--
		st.inflight--
		if !cqe.More() {
			b.sendRes-- // no notification follows: its slot is free as well
		}
		c.ZCCompleted(ev.UD, int(ev.Res), cqe.More(), false)
		if ev.Res < 0 && ev.Res != -int32(unix.ECANCELED) {
			c.Fail("write", cqe.Err())
		}
		c.SendProgress() // a finished connection's late send: its buffers go back (lateSendDone)
	case bc.TagRecv:
		b.FreeOp(c, ev.UD)
		delete(b.recvBufs, ev.UD)
		b.onRecv(c, cqe)
	}
}

// onReadable: epoll says the socket has data (or EOF, or an error): post a RECV.
//
// Only while the connection receives and no RECV is out: epoll reports EPOLLHUP and EPOLLERR
// whatever the mask, so a connection that does not receive (paused: by the user, by its
// receive credit, or for good by a splice relay, which reads the socket itself) still hears
// of a socket whose peer half-closed after its own write side was shut. A RECV posted then
// would take bytes the connection must not take: a spliced connection's went to the relay's
// OnData while the splice read the bytes around them, so they reached the destination out
// of order, or were refused there once the splice had passed the EOF on. Such an event
// silences the registration until the next update (ArmRecv, or the RECV's completion), as
// the plain backend does.
func (b *backend) onReadable(c bc.Conn, events uint32) {
	st := ss(c)
	if st == nil {
		return
	}
	if !c.RecvArmed() || st.recvOut {
		if es := epoll.ES(c); es.RecvUD != 0 && !c.SockClosed() {
			b.EP.Mod(c.FD(), unix.EPOLLONESHOT, es.RecvUD)
		}
		return
	}
	st.ready = true
	// Level-triggered: stop listening until the RECV completes.
	c.RecvEnded()
	b.Update(c)
	c.RecvStarted()
	b.postRecv(c)
}

func (b *backend) ArmRecv(c bc.Conn) {
	c.RecvStarted()
	if ss(c) != nil && ss(c).ready {
		b.postRecv(c)
		return
	}
	if ss(c) == nil || !ss(c).recvOut {
		b.Update(c)
	}
}

// RecvInFlight: StopRecv stops asking epoll, but a RECV already posted in the module still
// completes (and takes bytes from the socket).
func (b *backend) RecvInFlight(c bc.Conn) bool { return ss(c) != nil && ss(c).recvOut }

func (b *backend) StopRecv(c bc.Conn) {
	c.RecvEnded()
	b.Update(c)
}

func (b *backend) postRecv(c bc.Conn) {
	st := ss(c)
	if st == nil || st.recvOut || !c.RecvArmed() || c.SockClosed() || !st.attached {
		return
	}
	if b.rx.SQSpace() == 0 {
		b.block(c)
		return
	}
	buf, err := b.recv.Get()
	if err != nil && b.recv.CanGrow() {
		if _, gerr := b.recv.Grow(); gerr == nil {
			buf, err = b.recv.Get()
		}
	}
	if err != nil {
		b.ctr.BufEmpty.Add(1)
		b.block(c)
		return
	}
	key := b.rxKeys[buf.Region()]
	n := min(buf.Region().BufSize(), int(shim.RecvMax))
	off := uint64(buf.Addr() - buf.Region().Base())
	c.OpStarted()
	ud := b.LQ.NewOp(st, bc.TagRecv)
	if err := b.rx.PrepRecv(st.rxSock, key, off, uint32(n), ud); err != nil {
		b.FreeOp(c, ud)
		buf.Release()
		b.block(c)
		return
	}
	st.recvOut, st.recvBuf, st.ready = true, buf, false
	b.recvBufs[ud] = buf
	b.markDirty()
}

func (b *backend) onRecv(c bc.Conn, cqe shim.Completion) {
	st := ss(c)
	st.recvOut = false
	buf := st.recvBuf
	st.recvBuf = memreg.Buf{}
	switch res := int(cqe.Res); {
	case res > 0:
		b.ctr.RecvShim.Add(uint64(res))
		c.Deliver(buf, res)
		if c.Ended() {
			return
		}
		c.CheckCredit()
	case res == 0:
		buf.Release()
		c.GotEOF(nil)
	case cqe.Res == -int32(unix.ECANCELED):
		buf.Release()
	default:
		buf.Release()
		c.GotEOF(cqe.Err())
	}
	if c.InClose() {
		c.AdvanceClose()
		return
	}
	// Ask epoll again (level-triggered: it answers at once when more is waiting). A RECV posted
	// on a drained socket would hold its buffer until the peer sends again.
	if c.RecvArmed() && !c.SawEOF() {
		b.Update(c)
	}
}

// CloseSocket detaches the socket from both contexts (the posted RECV completes with
// ECANCELED) and closes it.
func (b *backend) CloseSocket(c bc.Conn) {
	st := ss(c)
	if st != nil && st.attached {
		b.tx.Detach(st.txSock)
		b.rx.Detach(st.rxSock)
		st.attached = false
	}
	b.Unregister(c)
	c.Socket().Close()
}
