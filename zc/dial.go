package zc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/tcpglue"
)

// connectState is a connection that is still connecting.
type connectState struct {
	sa        *tcpglue.RawSockaddr
	ctx       context.Context
	stop      func() bool // stops the context watcher
	h         Handler
	done      func(*Conn, error)
	cancel    bool // the context ended: the result is the context's error
	started   bool // the connect is under way
	exclusive bool // DialOptions.Exclusive
}

// Dial connects to address ("host:port", a literal IP; names are resolved once) and returns a
// connection served by one of the engine's queues; h receives its events (data may arrive
// before Dial returns). The connect goes through the queue (io_uring CONNECT, or a
// non-blocking connect). On a queue goroutine (in a handler) Dial returns ErrWouldBlock: use
// DialAsync there. opts, at most one, are per-dial settings (ReadSelf, Exclusive, KeepAlive,
// LocalAddr); none is the zero DialOptions.
func (e *Engine) Dial(ctx context.Context, network, address string, h Handler, opts ...DialOptions) (*Conn, error) {
	o, err := oneOption(opts, "dial", network)
	if err != nil {
		return nil, err
	}
	if e.onAnyLoop() {
		return nil, &OpError{Op: "dial", Net: network, Err: fmt.Errorf("Dial from a queue goroutine (use DialAsync): %w", ErrWouldBlock)}
	}
	type result struct {
		c   *Conn
		err error
	}
	ch := make(chan result, 1)
	if err := e.dialAsync(ctx, o, network, address, h, func(c *Conn, err error) { ch <- result{c, err} }); err != nil {
		return nil, err
	}
	r := <-ch // every started dial reports exactly once: connected, failed, cancelled or closed
	return r.c, r.err
}

// DialAsync starts connecting and returns at once; done runs on the connection's queue
// goroutine with the connection, or with nil and the error (which wraps the context's error
// when ctx ended first, ErrClosed when the engine closed). It is the form to use from a
// handler (a proxy's accept function dialing its backend). A panic in done is recovered like
// a handler's: counted in Stats.Faults.HandlerPanics, and the connection (if any) closed
// with a *PanicError. An error returned by DialAsync itself (a bad address, a closed
// engine) means done will not run. opts are Dial's.
func (e *Engine) DialAsync(ctx context.Context, network, address string, h Handler, done func(*Conn, error), opts ...DialOptions) error {
	o, err := oneOption(opts, "dial", network)
	if err != nil {
		return err
	}
	if done == nil {
		return &OpError{Op: "dial", Net: network, Err: fmt.Errorf("nil done func: %w", ErrInvalid)}
	}
	return e.dialAsync(ctx, o, network, address, h, done)
}

// oneOption is the options a call was given (the zero value for none); more than one is
// ErrInvalid.
func oneOption[T any](opts []T, op, network string) (T, error) {
	var o T
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		return o, &OpError{Op: op, Net: network, Err: fmt.Errorf("%d option structs (at most one): %w", len(opts), ErrInvalid)}
	}
	return o, nil
}

func (e *Engine) dialAsync(ctx context.Context, opts DialOptions, network, address string, h Handler, done func(*Conn, error)) error {
	fail := func(a net.Addr, err error) error { return &OpError{Op: "dial", Net: network, Addr: a, Err: err} }
	if e.closed.Load() {
		return fail(nil, ErrClosed)
	}
	if h == nil {
		return fail(nil, fmt.Errorf("nil handler: %w", ErrInvalid))
	}
	if ctx == nil {
		return fail(nil, fmt.Errorf("nil context: %w", ErrInvalid))
	}
	if err := ctx.Err(); err != nil {
		return fail(nil, err)
	}
	if opts.ReadSelf {
		if err := features.readSelfCheck(e); err != nil {
			return fail(nil, err)
		}
	}
	ts, err := e.setupTLS(opts.TLS, true, opts.ReadSelf, "")
	if err != nil {
		return fail(nil, err)
	}
	ap, err := tcpglue.Resolve(network, address)
	if err != nil {
		return fail(nil, err)
	}
	raddr := net.TCPAddrFromAddrPort(ap)
	if ap.Addr().IsUnspecified() || ap.Port() == 0 {
		return fail(raddr, fmt.Errorf("cannot dial an unspecified address or port 0: %w", ErrInvalid))
	}
	family := tcpglue.AddrFamily(ap)
	s, err := tcpglue.NewSocket(family, true)
	if err != nil {
		return fail(raddr, err)
	}
	setup := func() error {
		if e.cfg.SocketOptions != nil {
			if err := e.cfg.SocketOptions(s); err != nil {
				return err
			}
		}
		if err := keepAlive(s, e.keepAliveFor(opts.KeepAlive)); err != nil {
			return err
		}
		if opts.LocalAddr.IsValid() {
			return s.Bind(opts.LocalAddr)
		}
		return nil
	}
	if err := setup(); err != nil {
		s.Close()
		return fail(raddr, err)
	}
	sa, err := tcpglue.NewRawSockaddr(ap, family)
	if err != nil {
		s.Close()
		return fail(raddr, err)
	}
	q := e.pickQueue()
	c := newConn(e, q, s, s.Fd(), network)
	c.raddr = ap
	c.tlsDial = ts
	if opts.ReadSelf {
		// Before the loop sees the connection. A descriptor that cannot be duplicated (out
		// of descriptors) fails the dial.
		if err := features.readSelfOpen(c); err != nil {
			s.Close()
			return fail(raddr, err)
		}
	}
	cs := &connectState{sa: sa, ctx: ctx, h: h, done: done, exclusive: opts.Exclusive}
	c.connect = cs
	// The watcher may fire before the connect starts: it marks the dial cancelled on the loop,
	// and startDial looks at that first.
	cs.stop = context.AfterFunc(ctx, func() {
		q.Post(func() {
			if c.connect == cs {
				cs.cancel = true
				if cs.started {
					c.q.be.cancelDial(c)
				}
			}
		})
	})
	if err := q.Post(func() { c.startDial() }); err != nil {
		cs.stop()
		s.Close()
		if c.self != nil {
			c.self.appClosed()
		}
		return fail(raddr, ErrClosed)
	}
	return nil
}

func (c *Conn) startDial() {
	c.q.addConn(c)
	cs := c.connect
	switch {
	case c.e.closed.Load():
		c.dialFailed(ErrClosed)
	case cs.cancel:
		c.dialFailed(cs.ctx.Err())
	default:
		cs.started = true
		c.q.be.dial(c)
	}
}

// dialDone completes a connect (loop only): res is 0 or a negative errno.
func (c *Conn) dialDone(res int32) {
	cs := c.connect
	if cs == nil {
		return
	}
	if res < 0 {
		err := error(unix.Errno(-res))
		if cs.cancel || errors.Is(err, unix.ECANCELED) {
			if cerr := cs.ctx.Err(); cerr != nil {
				err = cerr
			} else {
				err = ErrClosed
			}
		}
		c.dialFailed(err)
		return
	}
	if err := cs.ctx.Err(); err != nil || c.e.closed.Load() {
		// Connected just as the context ended (or the engine closed): honour that.
		if err == nil {
			err = ErrClosed
		}
		c.dialFailed(err)
		return
	}
	if c.tlsDial != nil && c.tls == nil {
		c.tlsDial.dial(c, cs) // the handshake before the connection opens (tls.go)
		return
	}
	if cs.stop != nil {
		cs.stop()
	}
	c.connect = nil
	c.fillAddrs()
	if err := c.q.be.start(c); err != nil {
		c.connect = cs
		c.dialFailed(err)
		return
	}
	c.h = cs.h
	c.takeReader(cs.exclusive)
	c.st.Open()
	c.setupRecvPath()
	c.armRecv()
	c.callDone(cs.done, c, nil)
	c.service() // sends queued meanwhile, a Close from done
}

// dialFailed ends a connection that never connected (loop only) and reports err to the dialer.
func (c *Conn) dialFailed(err error) {
	cs := c.connect
	if cs == nil || c.ended() {
		return
	}
	if cs.stop != nil {
		cs.stop()
	}
	if c.ops > 0 {
		// The connect is still in the kernel: cancel it; its completion comes back here.
		c.q.be.cancelDial(c)
		if c.ended() {
			return // the backend completed the cancel at once (epoll): dialFailed already ran
		}
		cs.cancel = true
		if c.e.closed.Load() {
			// The queue is stopping: it will not wait for the completion.
			c.q.be.dropDial(c)
		} else {
			return
		}
	}
	c.connect = nil
	if c.self != nil {
		c.self.appClosed() // nobody got the connection: its duplicate goes now
	}
	c.st.Finish()
	c.st.CloseSock()
	c.sock.Close()
	c.fd = -1
	if c.tls != nil {
		c.tls.finished(c)
	}
	c.q.removeConn(c)
	c.markDone()
	c.dropProducer()
	c.callDone(cs.done, nil, c.opErr("dial", err))
}

// callDone runs DialAsync's done function with a handler's protection: a panic is counted
// and closes the new connection (if it connected) with a *PanicError; the process goes on.
func (c *Conn) callDone(done func(*Conn, error), conn *Conn, err error) {
	defer func() {
		if v := recover(); v != nil {
			c.q.ctr.handlerPanics.Add(1)
			if conn != nil {
				conn.fail(conn.opErr("dial", newPanicError("DialAsync done", v)))
			}
		}
	}()
	if dbg := c.e.dbg; dbg != nil && dbg.slowHandler() {
		defer dbg.handlerRan(c, "DialAsync done", time.Now())
	}
	done(conn, err)
}
