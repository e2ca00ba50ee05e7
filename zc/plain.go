package zc

import (
	"context"
	"io"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// The plain backend: the same Conn API over blocking syscalls, one reader and one writer
// goroutine per connection. It is what New falls back to when io_uring cannot be set up, and
// it is counted separately (Stats.Backend, BytesSentPlain, BytesRecvPlain).

type plainState struct {
	e          *Engine
	send, recv *memreg.Region
	free       chan int // receive buffers ready for the next read
	space      chan struct{}
	ctr        counters
}

func newPlainBackend(e *Engine) (altBackend, error) {
	p := &plainState{e: e, space: make(chan struct{}, 1), free: make(chan int, e.cfg.RecvBufs)}
	var err error
	if p.send, err = memreg.New(memreg.Options{BufSize: e.cfg.SendBufSize, Count: e.cfg.SendBufs}); err != nil {
		p.close()
		return nil, err
	}
	if p.recv, err = memreg.New(memreg.Options{BufSize: e.cfg.RecvBufSize, Count: e.cfg.RecvBufs}); err != nil {
		p.close()
		return nil, err
	}
	p.recv.Provide(e.cfg.RecvBufs, func(l memreg.Loan) { p.free <- l.Index() })
	p.recv.SetRecycler(func(idx int) { p.free <- idx })
	return p, nil
}

func (p *plainState) sendRegion() *memreg.Region { return p.send }
func (p *plainState) spaceChan() chan struct{}   { return p.space }
func (p *plainState) counters() *counters        { return &p.ctr }

func (p *plainState) close() {
	for _, r := range []*memreg.Region{p.send, p.recv} {
		if r != nil {
			r.Abandon()
			r.Close()
		}
	}
}

type plainConn struct {
	c        *Conn
	kickCh   chan struct{}
	drained  chan struct{}
	stop     chan struct{}
	rdone    chan struct{}
	wdone    chan struct{}
	once     sync.Once
	shutWant bool
	mu       sync.Mutex
	paused   bool
	resume   chan struct{}
	posted   []func()
}

func (p *plainConn) post(fn func()) error {
	if p.closing() {
		return ErrClosed
	}
	p.mu.Lock()
	p.posted = append(p.posted, fn)
	p.mu.Unlock()
	p.kick()
	return nil
}

func (p *plainConn) runPosted() {
	p.mu.Lock()
	fns := p.posted
	p.posted = nil
	p.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

func (p *plainConn) setPaused(on bool) {
	p.mu.Lock()
	p.paused = on
	p.mu.Unlock()
	if !on {
		select {
		case p.resume <- struct{}{}:
		default:
		}
	}
}

func (p *plainConn) waitResumed() bool {
	for {
		p.mu.Lock()
		paused := p.paused
		p.mu.Unlock()
		if !paused {
			return true
		}
		select {
		case <-p.resume:
		case <-p.stop:
			return false
		}
	}
}

// attachPlain gives a new connection its plain-backend state; run starts its goroutines.
func (e *Engine) attachPlain(c *Conn) *plainConn {
	p := &plainConn{c: c, kickCh: make(chan struct{}, 1), drained: make(chan struct{}, 1),
		stop: make(chan struct{}), rdone: make(chan struct{}), wdone: make(chan struct{}),
		resume: make(chan struct{}, 1)}
	c.alt = p
	return p
}

func (p *plainConn) run() {
	go p.reader()
	go p.writer()
}

func (p *plainConn) closing() bool {
	select {
	case <-p.stop:
		return true
	default:
		return p.c.closeReq.Load()
	}
}

func (p *plainConn) kick() {
	select {
	case p.kickCh <- struct{}{}:
	default:
	}
}

func (p *plainConn) reader() {
	c := p.c
	defer close(p.rdone)
	st := c.e.alt.(*plainState)
	for {
		if !p.waitResumed() {
			return
		}
		var idx int
		select {
		case idx = <-st.free:
		case <-p.stop:
			return
		}
		b, err := st.recv.Received(idx)
		if err != nil {
			return
		}
		var n int
		for {
			n, err = unix.Read(c.fd, b.Bytes())
			if err != unix.EINTR {
				break
			}
		}
		if n > 0 {
			c.ctr.recv.Add(uint64(n))
			st.ctr.recvPlain.Add(uint64(n))
			c.h.OnData(c, Data{buf: b, n: n})
			continue
		}
		b.Release()
		select {
		case <-p.stop:
			return
		default:
		}
		if n == 0 && err == nil {
			c.h.OnEOF(c, io.EOF)
			return
		}
		rerr := c.opErr("read", err)
		c.h.OnEOF(c, rerr)
		go p.close(rerr)
		return
	}
}

func (p *plainConn) writer() {
	c := p.c
	defer close(p.wdone)
	st := c.e.alt.(*plainState)
	for {
		select {
		case <-p.kickCh:
		case <-p.stop:
			return
		}
		p.runPosted()
		for {
			c.wmu.Lock()
			if len(c.wpending) == 0 {
				c.flushStageLocked()
			}
			reqs := c.wpending
			c.wpending = nil
			if len(reqs) == 0 {
				c.busy = false
				c.wmu.Unlock()
				break
			}
			c.wmu.Unlock()
			for i, r := range reqs {
				data := r.loan.Data()[:r.n]
				for len(data) > 0 {
					n, err := unix.Write(c.fd, data)
					if err == unix.EINTR {
						continue
					}
					if err != nil {
						for _, rest := range reqs[i:] {
							rest.loan.Return()
						}
						werr := c.opErr("write", err)
						c.wmu.Lock()
						if c.werr == nil || c.werr == ErrClosed {
							c.werr = werr
						}
						c.wmu.Unlock()
						go p.close(werr)
						return
					}
					data = data[n:]
					c.ctr.sentCopy.Add(uint64(n))
					st.ctr.sentPlain.Add(uint64(n))
					c.sentPlain(n)
				}
				r.loan.Return()
				select {
				case st.space <- struct{}{}:
				default:
				}
			}
		}
		if w, ok := c.h.(Writable); ok && !p.closing() {
			w.OnWritable(c)
		}
		p.mu.Lock()
		if p.shutWant {
			p.shutWant = false
			unix.Shutdown(c.fd, unix.SHUT_WR)
		}
		p.mu.Unlock()
		select {
		case p.drained <- struct{}{}:
		default:
		}
	}
}

func (c *Conn) sentPlain(n int) {
	c.wmu.Lock()
	c.queued -= n
	c.wmu.Unlock()
	select {
	case c.space <- struct{}{}:
	default:
	}
}

func (p *plainConn) shutdownWrite() {
	p.mu.Lock()
	p.shutWant = true
	p.mu.Unlock()
	p.kick()
}

// close closes the connection once: graceful (err == nil) lets queued writes finish first,
// bounded by CloseTimeout.
func (p *plainConn) close(err error) {
	p.once.Do(func() {
		c := p.c
		go func() {
			if err == nil {
				deadline := time.NewTimer(c.e.cfg.CloseTimeout)
				for {
					c.wmu.Lock()
					idle := !c.busy || (len(c.wpending) == 0 && !c.hasStage)
					c.wmu.Unlock()
					if idle {
						break
					}
					p.kick()
					select {
					case <-p.drained:
						continue
					case <-deadline.C:
					case <-p.wdone:
					}
					break
				}
				deadline.Stop()
			}
			close(p.stop)
			unix.Shutdown(c.fd, unix.SHUT_RDWR)
			<-p.rdone
			<-p.wdone
			c.dropProducer()
			closeFD(c.fd)
			c.e.removeConn(c)
			c.h.OnClose(c, err)
			close(c.done)
		}()
	})
}

func (p *plainState) dial(ctx context.Context, network string, ap netip.AddrPort, h Handler) (*Conn, error) {
	c, err := p.e.dialBlocking(ctx, network, ap, h, func(c *Conn) { p.e.attachPlain(c) })
	if err != nil {
		return nil, err
	}
	c.alt.(*plainConn).run()
	return c, nil
}

func (p *plainState) serve(l *Listener, s *tcpglue.Socket) {
	l.acceptBlocking(s, func(c *Conn) { p.e.attachPlain(c) }, func(c *Conn) {
		l.accepted.Add(1)
		h := l.accept(c)
		refused := h == nil
		if refused {
			h = HandlerFuncs{}
		}
		if c.h == nil {
			c.h = h
		}
		c.alt.(*plainConn).run()
		if refused {
			c.Close()
		}
	})
}
