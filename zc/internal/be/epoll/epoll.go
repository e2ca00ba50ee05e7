// Package epoll is zc's plain backend (non-blocking sockets driven by epoll) and the epoll
// base it shares with the zcshim backend (zc/internal/be/shim): listening, dialing, the
// registrations of connections, and their state (Conn). It sees connections, listeners and
// its queue only through zc/internal/becontract.
package epoll

import (
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	bc "github.com/zcnet/zcnet/zc/internal/becontract"
)

// Common is the epoll base of the plain and zcshim backends. Neither backend names the
// other: each gives the base its own handler of a connection's readiness (OnConn).
type Common struct {
	Q  bc.Queue
	LQ *loop.Queue
	EP *loop.Epoll
	// OnConn handles a connection's readiness (the backend's; a dial's is dialReady).
	OnConn func(c bc.Conn, events uint32)
}

// Conn is the plain and zcshim backends' own state of a connection (the core keeps it),
// and the loop.Owner of its epoll registrations.
type Conn struct {
	c       bc.Conn
	b       *Common
	RecvUD  uint64       // the socket's epoll registration
	dialUD  uint64       // the connect's registration (dial)
	Own     bc.ConnState // the backend's further state (the zcshim backend's module state)
	wantOut bool         // plain backend: waiting for EPOLLOUT
	needArm bool         // plain backend: waiting for receive buffers
}

func (*Conn) ConnState() {}

// ES is the epoll backends' state of c.
func ES(c bc.Conn) *Conn { return c.BackendState().(*Conn) }

// NewConnState makes a connection's state.
func (b *Common) NewConnState(c bc.Conn) bc.ConnState { return &Conn{c: c, b: b} }

// evMask is what a connection wants to hear about now.
func evMask(c bc.Conn, st *Conn) uint32 {
	// EPOLLRDHUP only while receiving: it is level-triggered, and a paused connection whose
	// peer half-closed would wake the queue in a busy loop.
	m := uint32(0)
	if c.RecvArmed() {
		m |= unix.EPOLLIN | unix.EPOLLRDHUP
	}
	if st.wantOut {
		m |= unix.EPOLLOUT
	}
	return m
}

// Register adds the connection's socket to epoll (with nothing wanted yet).
func (b *Common) Register(c bc.Conn) error {
	st := ES(c)
	c.OpStarted()
	st.RecvUD = b.LQ.NewOp(st, bc.TagRecv)
	if err := b.EP.Add(c.FD(), evMask(c, st), st.RecvUD); err != nil {
		b.LQ.FreeOp(st.RecvUD)
		st.RecvUD = 0
		c.OpEnded()
		return err
	}
	return nil
}

// Update tells epoll what c wants now.
func (b *Common) Update(c bc.Conn) {
	if st := ES(c); st.RecvUD != 0 && !c.SockClosed() {
		b.EP.Mod(c.FD(), evMask(c, st), st.RecvUD)
	}
}

// Unregister removes the socket from epoll before it is closed.
func (b *Common) Unregister(c bc.Conn) {
	if st := ES(c); st.RecvUD != 0 {
		b.EP.Del(c.FD())
		b.LQ.FreeOp(st.RecvUD)
		st.RecvUD = 0
		c.OpEnded()
	}
}

func (b *Common) FreeOp(c bc.Conn, ud uint64) {
	if b.LQ.OpLive(ud) {
		b.LQ.FreeOp(ud)
		c.OpEnded()
	}
}

// ---- dialing -------------------------------------------------------------------------

func (b *Common) Dial(c bc.Conn) {
	sa, err := c.DialAddr().Sockaddr()
	if err == nil {
		err = unix.Connect(c.FD(), sa)
	}
	switch err {
	case nil:
		c.DialDone(0)
		return
	case unix.EINPROGRESS, unix.EINTR, unix.EALREADY:
	default:
		c.DialDone(-int32(err.(unix.Errno)))
		return
	}
	st := ES(c)
	c.OpStarted()
	st.dialUD = b.LQ.NewOp(st, bc.TagDial)
	if err := b.EP.Add(c.FD(), unix.EPOLLOUT, st.dialUD); err != nil {
		b.FreeOp(c, st.dialUD)
		c.DialDone(-int32(unix.EINVAL))
	}
}

func (b *Common) CancelDial(c bc.Conn) {
	if c.DialAddr() == nil || !b.LQ.OpLive(ES(c).dialUD) {
		return
	}
	b.EP.Del(c.FD())
	b.FreeOp(c, ES(c).dialUD)
	c.DialDone(-int32(unix.ECANCELED)) // DialDone reports the context's error, or ErrClosed
}

func (b *Common) DropDial(c bc.Conn) { b.FreeOp(c, ES(c).dialUD) }

// dialReady: the connecting socket is writable: the connect finished.
func (b *Common) dialReady(c bc.Conn, ud uint64) {
	b.EP.Del(c.FD())
	b.FreeOp(c, ud)
	soerr, err := unix.GetsockoptInt(c.FD(), unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		soerr = int(err.(unix.Errno))
	}
	c.DialDone(-int32(soerr))
}

// OnEvent: the connection's socket is ready (or its connect finished).
func (st *Conn) OnEvent(lq *loop.Queue, ev loop.Event) {
	if ev.Tag == bc.TagDial {
		st.b.dialReady(st.c, ev.UD)
		return
	}
	st.b.OnConn(st.c, ev.Flags)
}

// ---- listening -----------------------------------------------------------------------

// lpart is a listener's part as the loop.Owner of its socket's registration.
type lpart struct {
	p bc.Listener
	b *Common
}

func (b *Common) Listen(p bc.Listener) {
	if p.Armed() || p.Closing() {
		return
	}
	ud := b.LQ.NewOp(&lpart{p: p, b: b}, bc.TagAccept)
	p.SetUD(ud)
	if err := b.EP.Add(p.FD(), unix.EPOLLIN, ud); err != nil {
		b.LQ.FreeOp(ud)
		p.AcceptFailed(unix.ENOMEM)
		p.PauseAccept()
		return
	}
	p.SetArmed(true)
}

func (b *Common) StopListen(p bc.Listener) {
	b.PauseListen(p)
	p.Finish()
}

func (b *Common) PauseListen(p bc.Listener) {
	if p.Armed() {
		b.EP.Del(p.FD())
		b.LQ.FreeOp(p.UD())
		p.SetArmed(false)
	}
}

func (lp *lpart) OnEvent(lq *loop.Queue, ev loop.Event) {
	p, b := lp.p, lp.b
	for i := 0; i < 64 && p.Armed() && !p.Closing() && !p.Paused(); i++ {
		fd, err := acceptNoAddr(p.FD())
		if err == unix.EINTR || err == unix.ECONNABORTED {
			continue
		}
		if err == unix.EAGAIN {
			return
		}
		if err != nil {
			if p.AcceptFailed(err.(unix.Errno)) {
				b.EP.Del(p.FD())
				b.LQ.FreeOp(p.UD())
				p.SetArmed(false)
				p.PauseAccept()
			}
			return
		}
		p.Accepted(fd)
	}
}

// acceptNoAddr is accept4(SOCK_CLOEXEC|SOCK_NONBLOCK) without the peer's address:
// unix.Accept4 allocates a buffer and a Sockaddr per call, garbage on every accepted
// connection, and create reads both addresses from the socket anyway.
func acceptNoAddr(fd int) (int, error) {
	nfd, _, e := unix.Syscall6(unix.SYS_ACCEPT4, uintptr(fd), 0, 0, unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(nfd), nil
}

// WatchEpoll: the splice machinery's fd watches go into the backend's own epoll instance
// (becontract.Splicer).
func (b *Common) WatchEpoll() *loop.Epoll { return b.EP }
