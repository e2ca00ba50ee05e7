package zc

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/kmod/shim"
	"github.com/zcnet/zcnet/memreg"
)

// The zcshim backend: the same queues over the zcshim kernel module (/dev/zcshim, see kmod/),
// for kernels or containers where io_uring is disabled or blocked. Each queue opens two module
// contexts (the module runs one socket's operations in one ordered list per context, so a
// RECV waiting for data would hold back the SENDs behind it): tx for zero-copy SENDs, rx for
// RECVs. Readiness comes from the queue's epoll: a RECV is posted only when the socket is
// readable, so idle connections hold no receive buffer. SendPath does not apply: the module
// has only its zero-copy send, and its notification says whether the stack copied.

func shimAvailable() error { return shimErr(shim.Probe()) }

// shimErr makes the module's "cannot" errors match ErrNotSupported.
func shimErr(err error) error {
	if err != nil && errors.Is(err, shim.ErrABIMismatch) && !errors.Is(err, ErrNotSupported) {
		return fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	return err
}

const (
	shimSQEntries   = 1024
	shimCQEntries   = 4096
	shimMaxInflight = 32 // SENDs in flight per connection
	shimCQSlack     = 16
)

// ss is the shim backend's module state of c (nil until start attached it).
func ss(c *Conn) *shimConnState {
	st, _ := es(c).own.(*shimConnState)
	return st
}

func (*shimConnState) backendState() {}

// shimConnState is a connection's module state.
type shimConnState struct {
	txSock, rxSock shim.SockID
	attached       bool
	inflight       int        // SENDs waiting for their completion
	recvOut        bool       // a RECV is posted
	recvBuf        memreg.Buf // its buffer
	ready          bool       // readable and no RECV consumed it yet
	blocked        bool       // waiting for module queue room
}

type shimBackend struct {
	epollCommon
	tx, rx  *shim.Queue
	recv    *memreg.Pool
	txKeys  map[*memreg.Region]shim.RegionKey
	rxKeys  map[*memreg.Region]shim.RegionKey
	txUD    uint64 // epoll registrations of the module contexts
	rxUD    uint64
	cqCap   int
	sendRes int // tx CQ slots reserved (2 per SEND until its completion, 1 until its notification)
	cqes    []shim.Completion
	blocked []*Conn
	dirty   bool
	// recvBufs are the buffers of RECVs the module holds, by operation: what a stopping
	// queue never reaped goes back to the pool once the contexts are closed.
	recvBufs map[uint64]memreg.Buf
}

// sbe is shimBackend seen as the owner of the module contexts' epoll registrations and as the
// flusher that submits before the loop waits.
type sbe shimBackend

func newShimBackend(q *queue) (loop.Driver, error) {
	cfg := &q.e.cfg
	ep, err := loop.NewEpoll(q.Queue)
	if err != nil {
		return nil, err
	}
	b := &shimBackend{epollCommon: epollCommon{q: q, ep: ep}, txKeys: map[*memreg.Region]shim.RegionKey{},
		rxKeys: map[*memreg.Region]shim.RegionKey{}, cqes: make([]shim.Completion, 256),
		recvBufs: map[uint64]memreg.Buf{}}
	b.onConn = b.onReadable
	fail := func(err error) (loop.Driver, error) {
		b.close()
		ep.Close()
		return nil, shimErr(err)
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
	b.recv, err = memreg.NewPool(q.e.poolOptions(memreg.PoolOptions{BufSize: cfg.RecvBufSize, Initial: cfg.RecvBufs,
		MaxBytes: cfg.RecvPoolMax, Tag: q.e, OnGrow: func(r *memreg.Region, _ int) error {
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
	q.send, err = memreg.NewPool(q.e.poolOptions(memreg.PoolOptions{BufSize: cfg.SendBufSize, Initial: cfg.SendBufs,
		MaxBytes: cfg.SendPoolMax, Tag: q.e, OnFree: q.sendBufFreed, OnGrow: func(r *memreg.Region, _ int) error {
			k, err := b.tx.RegisterRegion(r.Base(), r.Info().Size, 0)
			if err == nil {
				b.txKeys[r] = k
			}
			return err
		}}, true))
	if err != nil {
		return fail(err)
	}
	b.txUD = q.NewOp((*sbe)(b), tagShim)
	b.rxUD = q.NewOp((*sbe)(b), tagShim)
	if err := ep.Add(b.tx.Fd(), unix.EPOLLIN, b.txUD); err != nil {
		return fail(err)
	}
	if err := ep.Add(b.rx.Fd(), unix.EPOLLIN, b.rxUD); err != nil {
		return fail(err)
	}
	q.setBackend(b)
	return ep, nil
}

func (b *shimBackend) common() *epollCommon      { return &b.epollCommon }
func (b *shimBackend) name() Backend             { return BackendShim }
func (b *shimBackend) directOK() bool            { return false }
func (b *shimBackend) zeroCopy() bool            { return true }
func (b *shimBackend) appDirect() bool           { return false } // copies into its registered buffers
func (b *shimBackend) recvPool() *memreg.Pool    { return b.recv }
func (b *shimBackend) sending(c *Conn) bool      { return ss(c) != nil && ss(c).inflight > 0 }
func (b *shimBackend) dial(c *Conn)              { b.epollCommon.dial(c) }
func (b *shimBackend) cancelDial(c *Conn)        { b.epollCommon.cancelDial(c) }
func (b *shimBackend) dropDial(c *Conn)          { b.epollCommon.dropDial(c) }
func (b *shimBackend) listen(p *lpart)           { b.epollCommon.listen(p) }
func (b *shimBackend) stopListen(p *lpart)       { b.epollCommon.stopListen(p) }
func (b *shimBackend) freeOp(c *Conn, ud uint64) { b.epollCommon.freeOp(c, ud) }

// cancelSend: the module's queued sends end with the socket's close (closeSocket detaches
// the connection, and the module cancels what it holds).
func (b *shimBackend) cancelSend(c *Conn) {}

func (b *shimBackend) inFlightSegs(c *Conn) int {
	if ss(c) == nil {
		return 0
	}
	return ss(c).inflight
}

// close closes the module contexts (the module cancels what they hold and keeps pages the
// stack still references pinned until it lets go), then the pools.
func (b *shimBackend) close() {
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
	if b.q.send != nil {
		b.q.send.CloseWhenReleased()
	}
}

func (b *shimBackend) start(c *Conn) error {
	st := &shimConnState{}
	tx, err := b.tx.Attach(c.fd)
	if err != nil {
		return shimErr(err)
	}
	rx, err := b.rx.Attach(c.fd)
	if err != nil {
		b.tx.Detach(tx)
		return shimErr(err)
	}
	st.txSock, st.rxSock, st.attached = tx, rx, true
	es(c).own = st
	if err := b.register(c, (*econn)(c)); err != nil {
		b.tx.Detach(tx)
		b.rx.Detach(rx)
		es(c).own = nil
		return err
	}
	return nil
}

func (b *shimBackend) markDirty() {
	if !b.dirty {
		b.dirty = true
		b.q.MarkDirty((*sbe)(b))
	}
}

// Flush submits what was prepared (before the loop waits) and serves blocked connections.
func (s *sbe) Flush(*loop.Queue) {
	b := (*shimBackend)(s)
	b.dirty = false
	b.submit()
}

func (b *shimBackend) submit() {
	if b.tx != nil && b.tx.Prepared() > 0 {
		b.tx.Submit(-1, 0, 0)
	}
	if b.rx != nil && b.rx.Prepared() > 0 {
		b.rx.Submit(-1, 0, 0)
	}
}

// OnEvent: a module context has completions.
func (s *sbe) OnEvent(lq *loop.Queue, ev loop.Event) {
	b := (*shimBackend)(s)
	b.reap()
	if len(b.blocked) > 0 {
		bl := b.blocked
		b.blocked = nil
		for _, c := range bl {
			if ss(c) != nil {
				ss(c).blocked = false
			}
			if !c.ended() {
				c.pump()
				if c.paused == 0 && c.recvArmed && ss(c) != nil && ss(c).ready {
					b.postRecv(c)
				}
			}
		}
	}
}

func (b *shimBackend) reap() {
	for _, qq := range []*shim.Queue{b.tx, b.rx} {
		for qq != nil {
			n := qq.Completions(b.cqes)
			if n == 0 {
				break
			}
			for _, cqe := range b.cqes[:n] {
				b.q.Dispatch(loop.Event{UD: cqe.UserData, Res: cqe.Res, Flags: cqe.Flags})
			}
		}
	}
}

func (b *shimBackend) block(c *Conn) {
	if !ss(c).blocked {
		ss(c).blocked = true
		b.blocked = append(b.blocked, c)
	}
}

// regionKey names r in the tx context (false: not registered there, e.g. another queue's).
func (b *shimBackend) txKey(r *memreg.Region) (shim.RegionKey, bool) {
	k, ok := b.txKeys[r]
	return k, ok
}

func (b *shimBackend) send(c *Conn) {
	st := ss(c)
	if st == nil || !st.attached || c.st.SockClosed() {
		return
	}
	for st.inflight < c.pendLen() && st.inflight < shimMaxInflight {
		if b.sendRes+2 > b.cqCap-shimCQSlack || b.tx.SQSpace() == 0 {
			b.block(c)
			return
		}
		s := c.pendAt(st.inflight)
		var key shim.RegionKey
		ok := false
		if s.kind == segLoan {
			key, ok = b.txKey(s.loan.Region())
		}
		if !ok {
			// A buffer of another queue's pool, or the application's memory (SendBytes):
			// not registered here, copy it into ours.
			nb, err := b.q.send.Get()
			if err != nil {
				b.block(c)
				return
			}
			k := copy(nb.Bytes(), s.mem()[s.off:s.n])
			loan, err := nb.Lend()
			if err != nil {
				nb.Release()
				b.block(c)
				return
			}
			if s.kind == segApp {
				c.e.shareCtr.appCopied.Add(uint64(k))
			}
			s = c.rehomePend(st.inflight, loan, int32(k))
			key, _ = b.txKey(loan.Region())
		}
		off := uint64(s.loan.Addr()-s.loan.Region().Base()) + uint64(s.off)
		c.opStarted()
		ud := b.q.NewOp((*scq)(c), tagSendZC)
		if err := b.tx.PrepSend(st.txSock, key, off, uint32(s.n-s.off), ud); err != nil {
			b.freeOp(c, ud)
			b.block(c)
			return
		}
		c.zcStart(ud)
		b.sendRes += 2
		st.inflight++
		c.tx.sendZCOps.Add(1)
		b.q.ctr.sendZCOps.Add(1)
		b.markDirty()
	}
}

// scq is Conn as the owner of its module operations.
type scq Conn

func (sc *scq) OnEvent(lq *loop.Queue, ev loop.Event) {
	c := (*Conn)(sc)
	b := c.q.be.(*shimBackend)
	cqe := shim.Completion{UserData: ev.UD, Res: ev.Res, Flags: ev.Flags}
	switch ev.Tag {
	case tagSendZC:
		if cqe.Notif() {
			b.sendRes--
			c.zcNotified(ev.UD, cqe.Copied())
			return
		}
		b.sendRes--
		ss(c).inflight--
		if !cqe.More() {
			b.sendRes-- // no notification follows: its slot is free as well
		}
		c.zcCompleted(ev.UD, int(ev.Res), cqe.More(), false)
		if ev.Res < 0 && ev.Res != -int32(unix.ECANCELED) {
			c.fail(c.opErr("write", cqe.Err()))
		}
		c.sendProgress() // a finished connection's late send: its buffers go back (lateSendDone)
	case tagRecv:
		b.freeOp(c, ev.UD)
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
// silences the registration until the next update (armRecv, or the RECV's completion), as
// the plain backend does.
func (b *shimBackend) onReadable(c *Conn, events uint32) {
	st := ss(c)
	if st == nil {
		return
	}
	if !c.recvArmed || st.recvOut {
		if es(c).recvUD != 0 && !c.st.SockClosed() {
			b.ep.Mod(c.fd, unix.EPOLLONESHOT, es(c).recvUD)
		}
		return
	}
	st.ready = true
	// Level-triggered: stop listening until the RECV completes.
	c.recvEnded()
	b.update(c)
	c.recvStarted()
	b.postRecv(c)
}

func (b *shimBackend) armRecv(c *Conn) {
	c.recvStarted()
	if ss(c) != nil && ss(c).ready {
		b.postRecv(c)
		return
	}
	if ss(c) == nil || !ss(c).recvOut {
		b.update(c)
	}
}

// recvInFlight: stopRecv stops asking epoll, but a RECV already posted in the module still
// completes (and takes bytes from the socket).
func (b *shimBackend) recvInFlight(c *Conn) bool { return ss(c) != nil && ss(c).recvOut }

func (b *shimBackend) stopRecv(c *Conn) {
	c.recvEnded()
	b.update(c)
}

func (b *shimBackend) postRecv(c *Conn) {
	st := ss(c)
	if st == nil || st.recvOut || !c.recvArmed || c.st.SockClosed() || !st.attached {
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
		b.q.ctr.bufEmpty.Add(1)
		b.block(c)
		return
	}
	key := b.rxKeys[buf.Region()]
	n := min(buf.Region().BufSize(), int(shim.RecvMax))
	off := uint64(buf.Addr() - buf.Region().Base())
	c.opStarted()
	ud := b.q.NewOp((*scq)(c), tagRecv)
	if err := b.rx.PrepRecv(st.rxSock, key, off, uint32(n), ud); err != nil {
		b.freeOp(c, ud)
		buf.Release()
		b.block(c)
		return
	}
	st.recvOut, st.recvBuf, st.ready = true, buf, false
	b.recvBufs[ud] = buf
	b.markDirty()
}

func (b *shimBackend) onRecv(c *Conn, cqe shim.Completion) {
	st := ss(c)
	st.recvOut = false
	buf := st.recvBuf
	st.recvBuf = memreg.Buf{}
	switch res := int(cqe.Res); {
	case res > 0:
		b.q.ctr.recvShim.Add(uint64(res))
		c.deliver(Data{buf: buf, n: res})
		if c.ended() {
			return
		}
		c.checkCredit()
	case res == 0:
		buf.Release()
		c.gotEOF(nil)
	case cqe.Res == -int32(unix.ECANCELED):
		buf.Release()
	default:
		buf.Release()
		c.gotEOF(cqe.Err())
	}
	if c.inClose() {
		c.advanceClose()
		return
	}
	// Ask epoll again (level-triggered: it answers at once when more is waiting). A RECV posted
	// on a drained socket would hold its buffer until the peer sends again.
	if c.recvArmed && !c.eof {
		b.update(c)
	}
}

// closeSocket detaches the socket from both contexts (the posted RECV completes with
// ECANCELED) and closes it.
func (b *shimBackend) closeSocket(c *Conn) {
	st := ss(c)
	if st != nil && st.attached {
		b.tx.Detach(st.txSock)
		b.rx.Detach(st.rxSock)
		st.attached = false
	}
	b.unregister(c)
	c.sock.Close()
}
