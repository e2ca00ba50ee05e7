package zc

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zcnet/zcnet/internal/ktls"
)

// tlsPump is the user-space TLS path of one connection: crypto/tls (tc, over the TCP
// socket tcp) on one side, the far end of the connection's socket pair (app) on the other,
// and two goroutines between them. Every wait is in Go's poller on one of the two sockets,
// so every wait has a waker: the peer, the connection (its close ends app), or Engine.Close
// (which closes both sockets once the queues stopped).
//
//   - up: tc.Read (decrypt) → app.Write. The peer's close_notify (or its FIN at a record
//     boundary) becomes a half-close of app, which the connection reads as its EOF; an alert
//     or a bad record is kept (error) and ends everything: the connection then reads an EOF
//     that tlsRecvEnd turns into that error.
//   - down: app.Read → tc.Write (encrypt). The connection's end of its sends (CloseWrite or
//     Close: app reads EOF after the last byte) becomes close_notify and a TCP half-close;
//     then it waits for up to end or the connection to finish, and closes both sockets.
type tlsPump struct {
	tc  *tls.Conn
	tcp net.Conn
	app net.Conn
	run *tlsRun
	e   *Engine

	err     atomic.Pointer[error]
	gone    chan struct{} // the connection finished (or never existed)
	goneOne sync.Once
	upDone  chan struct{}
	left    atomic.Int32 // goroutines still running; the last closes the sockets
	closeMu sync.Once
}

func (e *Engine) startPump(tc *tls.Conn, tcp, app net.Conn) (*tlsPump, error) {
	p := &tlsPump{tc: tc, tcp: tcp, app: app, e: e, gone: make(chan struct{}), upDone: make(chan struct{})}
	run, ok := e.tlsEng().add(p.closeAll, false)
	if !ok {
		return nil, ErrClosed
	}
	p.run = run
	p.left.Store(2)
	go p.up()
	go p.down()
	return p, nil
}

// error is the reason the TLS stream ended other than by close_notify (nil if none).
func (p *tlsPump) error() error {
	if e := p.err.Load(); e != nil {
		return *e
	}
	return nil
}

func (p *tlsPump) setErr(err error) {
	p.err.CompareAndSwap(nil, &err)
}

// finished: the connection finished (or was never made). A peer that reads nothing may
// hold down's last write: it is bounded by CloseTimeout, as the connection's own sends.
func (p *tlsPump) finished() {
	p.goneOne.Do(func() {
		close(p.gone)
		p.tcp.SetWriteDeadline(time.Now().Add(p.e.cfg.CloseTimeout))
	})
}

func (p *tlsPump) closeAll() {
	p.closeMu.Do(func() {
		p.tcp.Close()
		p.app.Close()
	})
}

func (p *tlsPump) exit() {
	if p.left.Add(-1) == 0 {
		p.closeAll()
		p.e.tlsEng().done(p.run)
	}
}

func (p *tlsPump) up() {
	defer p.exit()
	defer close(p.upDone)
	buf := make([]byte, 64<<10)
	for {
		n, err := p.tc.Read(buf)
		if n > 0 {
			if _, werr := p.app.Write(buf[:n]); werr != nil {
				// The connection is gone: nobody reads any more.
				p.closeAll()
				return
			}
		}
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) {
			if cw, ok := p.app.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			}
			return
		}
		if !errors.Is(err, net.ErrClosed) {
			p.setErr(ktls.UserErr(err))
		}
		p.closeAll()
		return
	}
}

func (p *tlsPump) down() {
	defer p.exit()
	buf := make([]byte, 64<<10)
	for {
		n, err := p.app.Read(buf)
		if n > 0 {
			if _, werr := p.tc.Write(buf[:n]); werr != nil {
				p.setErr(ktls.UserErr(werr))
				p.closeAll()
				return
			}
		}
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) {
			p.tc.CloseWrite() // close_notify, then the TCP half-close
			select {
			case <-p.upDone:
			case <-p.gone:
			}
		}
		p.closeAll()
		return
	}
}
