package zc

import (
	"context"
	"net/netip"
	"time"

	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// altBackend is a backend other than io_uring queues: plain sockets, or the zcshim module's
// queues. Connections on it share the producer side of Conn (wpending, stage, busy under wmu)
// and implement altConn.
type altBackend interface {
	sendRegion() *memreg.Region // buffers for Conn.Buffer and Write
	spaceChan() chan struct{}   // signalled when send buffers return
	counters() *counters
	dial(ctx context.Context, network string, ap netip.AddrPort, h Handler) (*Conn, error)
	// serve accepts on s until the listener closes (then s is shut down), creating a
	// connection per accepted socket (l.accept gives its Handler); it calls l.wg.Done when it
	// returns.
	serve(l *Listener, s *tcpglue.Socket)
	close()
}

// altConn is a connection's backend part on an altBackend.
type altConn interface {
	kick()             // new send work is pending (see Conn.kickLocked)
	close(err error)   // close: graceful for nil (queued sends first, bounded by CloseTimeout)
	shutdownWrite()    // SHUT_WR once queued sends are out
	setPaused(on bool) // stop/restart receiving
}

// poster is implemented by altConns that can run a function where OnWritable runs (so
// handler calls stay serialized); Conn.Post uses a new goroutine otherwise.
type poster interface {
	post(fn func()) error
}

// shimBackend creates the zcshim backend; nil when this build has none. shimAvailable says
// whether the module is loaded and usable.
var (
	shimBackend   func(e *Engine) (altBackend, error)
	shimAvailable = func() error { return ErrNotSupported }
)

// dialBlocking connects a blocking socket (the alternative backends' way), honouring ctx.
// prepare gives the connection its backend state before the engine can see it (Engine.Close
// may close it from then on); the caller starts it.
func (e *Engine) dialBlocking(ctx context.Context, network string, ap netip.AddrPort, h Handler, prepare func(*Conn)) (*Conn, error) {
	type result struct {
		s   *tcpglue.Socket
		err error
	}
	ch := make(chan result, 1)
	go func() {
		s, err := tcpglue.DialAddrPort(ap, tcpglue.DialOptions{Control: e.cfg.SocketOptions})
		ch <- result{s, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.s != nil {
				r.s.Close()
			}
		}()
		return nil, &OpError{Op: "dial", Net: network, Err: ctx.Err()}
	}
	if r.err != nil {
		return nil, &OpError{Op: "dial", Net: network, Err: r.err}
	}
	fd, err := r.s.Disown()
	if err != nil {
		r.s.Close()
		return nil, &OpError{Op: "dial", Net: network, Err: err}
	}
	c := newConn(e, nil, fd, network)
	c.h = h
	c.fillAddrs()
	prepare(c)
	if !e.addConn(c) {
		closeFD(fd)
		return nil, &OpError{Op: "dial", Net: network, Err: ErrClosed}
	}
	return c, nil
}

// acceptBlocking accepts on s until the listener closes (the alternative backends' way).
// Each connection gets its backend state from prepare before the engine can see it, then
// start runs it.
func (l *Listener) acceptBlocking(s *tcpglue.Socket, prepare, start func(c *Conn)) {
	defer l.wg.Done()
	for !l.closed.Load() {
		ns, _, err := s.Accept()
		if err != nil {
			if l.closed.Load() {
				return
			}
			l.acceptErrs.Add(1)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		fd, err := ns.Disown()
		if err != nil {
			ns.Close()
			continue
		}
		c := newConn(l.e, nil, fd, l.network)
		c.fillAddrs()
		prepare(c)
		if !l.e.addConn(c) {
			closeFD(fd)
			continue
		}
		start(c)
	}
}

func (e *Engine) startAlt(b Backend, reason error) error {
	var (
		alt altBackend
		err error
	)
	switch b {
	case BackendShim:
		if shimBackend == nil {
			return ErrNotSupported
		}
		alt, err = shimBackend(e)
	default:
		b = BackendPlain
		alt, err = newPlainBackend(e)
	}
	if err != nil {
		return err
	}
	e.alt, e.backend, e.fallback = alt, b, reason
	return nil
}
