package zc

import (
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/tcpglue"
)

// allowedCPUs lists the CPUs this process may run on (its affinity mask, which a container
// or taskset may have narrowed), so queue i is pinned to the i-th of them.
func allowedCPUs() []int {
	var set unix.CPUSet
	var cpus []int
	if unix.SchedGetaffinity(0, &set) == nil {
		for c := 0; c < 1024 && len(cpus) < set.Count(); c++ {
			if set.IsSet(c) {
				cpus = append(cpus, c)
			}
		}
	}
	if len(cpus) == 0 {
		for c := 0; c < runtime.NumCPU(); c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

// Listener accepts connections on every queue: one listening socket per queue in one
// SO_REUSEPORT group (or a single socket, see SteeringMode), each with a multishot accept.
type Listener struct {
	e       *Engine
	network string
	addr    *net.TCPAddr
	accept  func(*Conn) Handler
	socks   []*tcpglue.Socket
	parts   []*lpart
	closed  atomic.Bool
	wg      sync.WaitGroup
	rr      atomic.Uint32

	acceptErrs atomic.Uint64
	accepted   atomic.Uint64

	steer    *bpf.Steering // nil without BPF steering
	steerErr error         // why BPF steering is not in use (SteerAuto fell back)
}

type lpart struct {
	l       *Listener
	q       *equeue
	fd      int
	id      uint32
	armed   bool
	closing bool
}

// Listen listens on address and serves accepted connections on the engine's queues. accept
// runs on the owning queue's goroutine for each new connection and returns its Handler (nil
// closes the connection).
func (e *Engine) Listen(network, address string, accept func(c *Conn) Handler) (*Listener, error) {
	if e.closed.Load() {
		return nil, &OpError{Op: "listen", Net: network, Err: ErrClosed}
	}
	if accept == nil {
		return nil, &OpError{Op: "listen", Net: network, Err: fmt.Errorf("nil accept func: %w", ErrInvalid)}
	}
	n := len(e.queues)
	if e.alt != nil || e.cfg.Steering == SteerSingleListener {
		n = 1
	}
	opts := tcpglue.ListenOptions{ReusePort: n > 1, Backlog: 4096, Control: e.cfg.SocketOptions}
	socks, err := tcpglue.ListenGroup(network, address, n, opts)
	if err != nil {
		return nil, &OpError{Op: "listen", Net: network, Err: err}
	}
	l := &Listener{e: e, network: network, accept: accept, socks: socks}
	if ap, err := socks[0].LocalAddr(); err == nil {
		l.addr = net.TCPAddrFromAddrPort(ap)
	}
	if n > 1 && (e.cfg.Steering == SteerAuto || e.cfg.Steering == SteerBPF) {
		l.steer, l.steerErr = bpf.NewSteering(l.FDs(), &bpf.Options{Policy: e.cfg.SteerPolicy})
		if l.steerErr != nil {
			if e.cfg.Steering == SteerBPF {
				l.closeSockets()
				return nil, &OpError{Op: "listen", Net: network, Addr: l.addr, Err: fmt.Errorf("BPF steering: %w", l.steerErr)}
			}
			e.steerFallbacks.Add(1)
		}
	}
	e.mu.Lock()
	if e.closed.Load() {
		e.mu.Unlock()
		l.closeSockets()
		return nil, &OpError{Op: "listen", Net: network, Err: ErrClosed}
	}
	e.listeners[l] = struct{}{}
	e.mu.Unlock()
	if e.alt != nil {
		l.wg.Add(1)
		go e.alt.serve(l, socks[0])
		return l, nil
	}
	for i, s := range socks {
		p := &lpart{l: l, q: e.queues[i], fd: s.Fd()}
		l.parts = append(l.parts, p)
		l.wg.Add(1)
		if err := p.q.Post(p.start); err != nil {
			l.wg.Done()
		}
	}
	return l, nil
}

// Steering returns the listener's BPF steering (flow table, drain, statistics), or nil when
// the listener uses plain SO_REUSEPORT hashing (see SteeringFallback).
func (l *Listener) Steering() *bpf.Steering { return l.steer }

// SteeringFallback returns why BPF steering is not in use ("" when it is, or was not asked).
func (l *Listener) SteeringFallback() string {
	if l.steerErr == nil {
		return ""
	}
	return l.steerErr.Error()
}

// Addr returns the listening address.
func (l *Listener) Addr() net.Addr { return l.addr }

// FDs returns the listening sockets' descriptors, one per queue in queue order (for BPF
// steering). They stay owned by the listener.
func (l *Listener) FDs() []int {
	fds := make([]int, len(l.socks))
	for i, s := range l.socks {
		fds[i] = s.Fd()
	}
	return fds
}

// Accepted returns how many connections were accepted, and AcceptErrors how many accepts failed.
func (l *Listener) Accepted() uint64     { return l.accepted.Load() }
func (l *Listener) AcceptErrors() uint64 { return l.acceptErrs.Load() }

func (p *lpart) start() {
	p.id = p.q.AddOwner(p)
	p.arm()
}

func (p *lpart) arm() {
	sqe := p.q.GetSQE()
	sqe.PrepMultishotAccept(int32(p.fd), unix.SOCK_CLOEXEC)
	sqe.UserData = loop.UserData(p.id, tagRecv)
	p.armed = true
}

func (p *lpart) OnCQE(q *loop.Queue, c uring.CQE) {
	if uint32(c.UserData)&0xff != tagRecv {
		return
	}
	if c.Res >= 0 {
		if p.closing {
			closeFD(int(c.Res))
		} else {
			p.l.accepted.Add(1)
			p.l.handoff(p.q, int(c.Res))
		}
	} else if c.Res != -int32(unix.ECANCELED) {
		p.l.acceptErrs.Add(1)
	}
	if !c.More() {
		p.armed = false
		if p.closing {
			p.finish()
		} else {
			p.arm()
		}
	}
}

func (p *lpart) stop() {
	if p.closing {
		return
	}
	p.closing = true
	if !p.armed {
		p.finish()
		return
	}
	sqe := p.q.GetSQE()
	sqe.PrepCancel(loop.UserData(p.id, tagRecv), 0)
	sqe.UserData = loop.UserData(p.id, tagIgnore)
}

func (p *lpart) finish() {
	p.q.RemoveOwner(p.id)
	p.l.wg.Done()
}

// handoff creates the connection for an accepted fd on the queue that will own it.
func (l *Listener) handoff(from *equeue, fd int) {
	target := from
	if len(l.e.queues) > 1 && len(l.socks) == 1 {
		target = l.e.queues[int(l.rr.Add(1)-1)%len(l.e.queues)]
	}
	create := func() {
		c := newConn(l.e, target, fd, l.network)
		if !l.e.addConn(c) {
			closeFD(fd)
			return
		}
		c.fillAddrs()
		if l.steer != nil {
			if k, err := bpf.FlowKeyFromFD(fd); err == nil {
				c.steer, c.flow = l.steer, k
			}
		}
		c.id = target.AddOwner(c)
		c.started = true
		h := l.accept(c)
		if h == nil {
			c.h = HandlerFuncs{}
			c.closeReq.Store(true)
			c.beginClose(nil)
			return
		}
		if c.h == nil {
			c.h = h
		}
		c.setupRecvPath()
		c.armRecv()
	}
	if target == from {
		create()
		return
	}
	if err := target.Post(create); err != nil {
		closeFD(fd)
	}
}

// Close stops accepting and closes the listening sockets. Accepted connections stay open.
// A second Close returns an error wrapping net.ErrClosed.
func (l *Listener) Close() error {
	if !l.closed.CompareAndSwap(false, true) {
		return &OpError{Op: "close", Net: l.network, Addr: l.addr, Err: ErrClosed}
	}
	for _, p := range l.parts {
		if err := p.q.Post(p.stop); err != nil {
			l.wg.Done()
		}
	}
	if l.e.alt != nil {
		// Unblock the accept goroutine.
		l.socks[0].Shutdown(unix.SHUT_RDWR)
	}
	l.wg.Wait()
	l.closeSockets()
	l.e.mu.Lock()
	delete(l.e.listeners, l)
	l.e.mu.Unlock()
	return nil
}

func (l *Listener) closeSockets() {
	if l.steer != nil {
		l.steer.Close()
	}
	for _, s := range l.socks {
		s.Close()
	}
}
