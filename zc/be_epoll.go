package zc

import (
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
)

// The epoll base of the plain and zcshim backends (be_plain.go, be_shim.go): listening,
// dialing, the registrations of connections, and their state (epollConn). Neither backend
// names the other: each gives the base its own handler of a connection's readiness (onConn).

type epollCommon struct {
	q  *queue
	ep *loop.Epoll
	// onConn handles a connection's readiness (the backend's; a dial's is dialReady).
	onConn func(c *Conn, events uint32)
}

// econn is Conn seen as the loop.Owner of its epoll registration.
type econn Conn

// epollConn is the plain and zcshim backends' own state of a connection (Conn.bk).
type epollConn struct {
	recvUD  uint64       // the socket's epoll registration
	dialUD  uint64       // the connect's registration (dial)
	own     backendState // the backend's further state (the zcshim backend's module state)
	wantOut bool         // plain backend: waiting for EPOLLOUT
	needArm bool         // plain backend: waiting for receive buffers
}

func (*epollConn) backendState() {}

// es is the epoll backends' state of c.
func es(c *Conn) *epollConn { return c.bk.(*epollConn) }

func (b *epollCommon) newConnState() backendState { return &epollConn{} }

// epart is lpart seen as the loop.Owner of its listening socket's registration.
type epart lpart

// evMask is what a connection wants to hear about now.
func evMask(c *Conn) uint32 {
	// EPOLLRDHUP only while receiving: it is level-triggered, and a paused connection whose
	// peer half-closed would wake the queue in a busy loop.
	m := uint32(0)
	if c.recvArmed {
		m |= unix.EPOLLIN | unix.EPOLLRDHUP
	}
	if es(c).wantOut {
		m |= unix.EPOLLOUT
	}
	return m
}

// register adds the connection's socket to epoll (with nothing wanted yet).
func (b *epollCommon) register(c *Conn, owner loop.Owner) error {
	c.opStarted()
	es(c).recvUD = b.q.NewOp(owner, tagRecv)
	if err := b.ep.Add(c.fd, evMask(c), es(c).recvUD); err != nil {
		b.q.FreeOp(es(c).recvUD)
		es(c).recvUD = 0
		c.opEnded()
		return err
	}
	return nil
}

func (b *epollCommon) update(c *Conn) {
	if es(c).recvUD != 0 && !c.st.SockClosed() {
		b.ep.Mod(c.fd, evMask(c), es(c).recvUD)
	}
}

// unregister removes the socket from epoll before it is closed.
func (b *epollCommon) unregister(c *Conn) {
	if es(c).recvUD != 0 {
		b.ep.Del(c.fd)
		b.q.FreeOp(es(c).recvUD)
		es(c).recvUD = 0
		c.opEnded()
	}
}

func (b *epollCommon) freeOp(c *Conn, ud uint64) {
	if b.q.OpLive(ud) {
		b.q.FreeOp(ud)
		c.opEnded()
	}
}

// ---- dialing -------------------------------------------------------------------------

func (b *epollCommon) dial(c *Conn) {
	cs := c.connect
	sa, err := cs.sa.Sockaddr()
	if err == nil {
		err = unix.Connect(c.fd, sa)
	}
	switch err {
	case nil:
		c.dialDone(0)
		return
	case unix.EINPROGRESS, unix.EINTR, unix.EALREADY:
	default:
		c.dialDone(-int32(err.(unix.Errno)))
		return
	}
	c.opStarted()
	es(c).dialUD = b.q.NewOp((*econn)(c), tagDial)
	if err := b.ep.Add(c.fd, unix.EPOLLOUT, es(c).dialUD); err != nil {
		b.freeOp(c, es(c).dialUD)
		c.dialDone(-int32(unix.EINVAL))
	}
}

func (b *epollCommon) cancelDial(c *Conn) {
	if c.connect == nil || !b.q.OpLive(es(c).dialUD) {
		return
	}
	b.ep.Del(c.fd)
	b.freeOp(c, es(c).dialUD)
	c.dialDone(-int32(unix.ECANCELED)) // dialDone reports the context's error, or ErrClosed
}

func (b *epollCommon) dropDial(c *Conn) { b.freeOp(c, es(c).dialUD) }

// dialReady: the connecting socket is writable: the connect finished.
func (b *epollCommon) dialReady(c *Conn, ud uint64) {
	b.ep.Del(c.fd)
	b.freeOp(c, ud)
	soerr, err := unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		soerr = int(err.(unix.Errno))
	}
	c.dialDone(-int32(soerr))
}

// ---- listening -----------------------------------------------------------------------

func (b *epollCommon) listen(p *lpart) {
	if p.armed || p.closing {
		return
	}
	p.ud = b.q.NewOp((*epart)(p), tagAccept)
	if err := b.ep.Add(p.fd, unix.EPOLLIN, p.ud); err != nil {
		b.q.FreeOp(p.ud)
		p.acceptFailed(unix.ENOMEM)
		p.pauseAccept()
		return
	}
	p.armed = true
}

func (b *epollCommon) stopListen(p *lpart) {
	if p.armed {
		b.ep.Del(p.fd)
		b.q.FreeOp(p.ud)
		p.armed = false
	}
	p.finish()
}

func (b *epollCommon) pauseListen(p *lpart) {
	if p.armed {
		b.ep.Del(p.fd)
		b.q.FreeOp(p.ud)
		p.armed = false
	}
}

func (ep *epart) OnEvent(lq *loop.Queue, ev loop.Event) {
	p := (*lpart)(ep)
	b := p.q.be.(interface{ common() *epollCommon }).common()
	for i := 0; i < 64 && p.armed && !p.closing && !p.paused; i++ {
		fd, err := acceptNoAddr(p.fd)
		if err == unix.EINTR || err == unix.ECONNABORTED {
			continue
		}
		if err == unix.EAGAIN {
			return
		}
		if err != nil {
			if p.acceptFailed(err.(unix.Errno)) {
				b.ep.Del(p.fd)
				b.q.FreeOp(p.ud)
				p.armed = false
				p.pauseAccept()
			}
			return
		}
		p.accepted(fd)
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

func (ec *econn) OnEvent(lq *loop.Queue, ev loop.Event) {
	c := (*Conn)(ec)
	b := c.q.be.(interface{ common() *epollCommon }).common()
	if ev.Tag == tagDial {
		b.dialReady(c, ev.UD)
		return
	}
	b.onConn(c, ev.Flags)
}

// watchEpoll: the splice machinery's fd watches go into the backend's own epoll instance
// (spliceBackend).
func (b *epollCommon) watchEpoll(*queue) *loop.Epoll { return b.ep }
