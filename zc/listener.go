package zc

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/hwq"
	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/rawfd"
	"github.com/zcnet/zcnet/tcpglue"
)

// Listener accepts connections on every queue: one listening socket per queue in one
// SO_REUSEPORT group (or a single socket, see SteeringMode).
type Listener struct {
	e         *Engine
	network   string
	addr      *net.TCPAddr
	accept    func(*Conn) Handler
	family    int
	readSelf  bool          // ListenOptions.ReadSelf
	exclusive bool          // ListenOptions.Exclusive
	tls       tlsSetupHooks // ListenOptions.TLS (tls.go)
	socks     []*tcpglue.Socket
	parts     []*lpart
	closed    atomic.Bool
	wg        sync.WaitGroup
	rr        atomic.Uint32
	done      chan struct{}

	acceptErrs atomic.Uint64
	accepted   atomic.Uint64
	backoffs   atomic.Uint64

	steer    *bpf.Steering // nil without BPF steering
	steerErr error         // why BPF steering is not in use (SteerAuto fell back)
	// feats: the features' parts (hooks.go: listenerPart), set by Listen
	feats []listenerPart
}

// lpart is one listening socket served by one queue.
type lpart struct {
	l       *Listener
	q       *queue
	fd      int
	ud      uint64
	armed   bool
	closing bool
	paused  bool // accepting suspended (SetAcceptPaused)
	stopped atomic.Bool
	backoff time.Duration
	timer   *loop.Timer
}

const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// Listen listens on address and serves accepted connections on the engine's queues. accept
// runs on the owning queue's goroutine for each new connection and returns its Handler (nil
// closes the connection). Listening on an address something else already listens on fails
// with EADDRINUSE (see ListenOptions.Shared). opts, at most one, are per-listener settings
// (ReadSelf, Exclusive, Shared, KeepAlive, Backlog, steering, ZcrxNIC); none is the zero
// ListenOptions.
func (e *Engine) Listen(network, address string, accept func(c *Conn) Handler, opts ...ListenOptions) (*Listener, error) {
	fail := func(a net.Addr, err error) (*Listener, error) {
		return nil, &OpError{Op: "listen", Net: network, Addr: a, Err: err}
	}
	o, err := oneOption(opts, "listen", network)
	if err != nil {
		return nil, err
	}
	if e.closed.Load() {
		return fail(nil, ErrClosed)
	}
	if accept == nil {
		return fail(nil, fmt.Errorf("nil accept func: %w", ErrInvalid))
	}
	if o.Backlog < 0 {
		return fail(nil, fmt.Errorf("negative backlog %d: %w", o.Backlog, ErrInvalid))
	}
	if o.Backlog == 0 {
		o.Backlog = 4096
	}
	if err := features.steerCheck(e, &o); err != nil {
		return fail(nil, err)
	}
	if o.ReadSelf {
		if err := features.readSelfCheck(e); err != nil {
			return fail(nil, err)
		}
	}
	ts, err := e.setupTLS(o.TLS, false, o.ReadSelf, o.ZcrxNIC)
	if err != nil {
		return fail(nil, err)
	}
	ap, err := tcpglue.Resolve(network, address)
	if err != nil {
		return fail(nil, err)
	}
	n := len(e.queues)
	if e.cfg.Steering == SteerSingleListener {
		n = 1
	}
	ka := e.keepAliveFor(o.KeepAlive)
	lopts := tcpglue.ListenOptions{ReusePort: true, Backlog: o.Backlog, Nonblock: true,
		Control: func(s *tcpglue.Socket) error {
			if e.cfg.SocketOptions != nil {
				if err := e.cfg.SocketOptions(s); err != nil {
					return err
				}
			}
			return keepAlive(s, ka) // accepted sockets inherit it
		}}
	var probe *tcpglue.Socket
	if !o.Shared && ap.Port() != 0 {
		// Our sockets join any SO_REUSEPORT group on the address; refuse instead, unless asked
		// to share. The probe stays bound (not listening) until the group is up, so nobody can
		// slip in between; with SO_REUSEADDR on both sides it does not conflict with ours.
		probe, err = probeAddr(network, ap)
		if err != nil {
			return fail(net.TCPAddrFromAddrPort(ap), err)
		}
	}
	socks, err := tcpglue.ListenGroup(network, ap.String(), n, lopts)
	if probe != nil {
		probe.Close()
	}
	if err != nil {
		return fail(net.TCPAddrFromAddrPort(ap), err)
	}
	l := &Listener{e: e, network: network, accept: accept, socks: socks, done: make(chan struct{}), family: socks[0].Family()}
	l.readSelf, l.exclusive = o.ReadSelf, o.Exclusive
	l.tls = ts
	if la, err := socks[0].LocalAddr(); err == nil {
		l.addr = net.TCPAddrFromAddrPort(la)
	}
	for _, mk := range [...]func(*Listener, *ListenOptions) (listenerPart, error){features.zcrxNIC, features.steer} {
		p, err := mk(l, &o)
		if p != nil {
			l.feats = append(l.feats, p)
		}
		if err != nil {
			l.closeSockets()
			return fail(l.addr, err)
		}
	}
	e.mu.Lock()
	if e.closed.Load() {
		e.mu.Unlock()
		l.closeSockets()
		return fail(l.addr, ErrClosed)
	}
	e.listeners[l] = struct{}{}
	e.mu.Unlock()
	for i, s := range socks {
		p := &lpart{l: l, q: e.queues[i], fd: s.Fd()}
		l.parts = append(l.parts, p)
		l.wg.Add(1)
		if err := p.q.Post(p.start); err != nil {
			p.finish()
		}
	}
	return l, nil
}

// probeAddr binds a throwaway socket (SO_REUSEADDR, not SO_REUSEPORT) to ap: EADDRINUSE when
// something listens there.
func probeAddr(network string, ap netip.AddrPort) (*tcpglue.Socket, error) {
	s, err := tcpglue.NewSocket(tcpglue.AddrFamily(ap), false)
	if err != nil {
		return nil, err
	}
	if err := s.SetReuseAddr(true); err != nil {
		s.Close()
		return nil, err
	}
	if s.Family() == unix.AF_INET6 {
		s.SetV6Only(!(network == "tcp" && ap.Addr().IsUnspecified() || ap.Addr().Is4In6()))
	}
	if err := s.Bind(ap); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Steering returns the listener's BPF steering (flow table, drain, statistics), or nil when
// the listener uses plain SO_REUSEPORT hashing (Stats().Steering says why).
func (l *Listener) Steering() *bpf.Steering { return l.steer }

// Addr returns the listening address.
func (l *Listener) Addr() net.Addr { return l.addr }

// fds returns the listening sockets' descriptors, one per queue in queue order (for BPF
// steering). They stay owned by the listener.
func (l *Listener) fds() []int {
	fds := make([]int, len(l.socks))
	for i, s := range l.socks {
		fds[i] = s.Fd()
	}
	return fds
}

// ListenerStats are a listener's counters, and how it steers and receives (Listener.Stats).
type ListenerStats struct {
	Accepted     uint64 // connections accepted
	AcceptErrors uint64 // accepts that failed (and ReadSelf connections refused: no descriptor)
	// AcceptBackoffs counts the times accepting paused because the process (or system) ran
	// out of descriptors (EMFILE/ENFILE: it resumes after 5 ms, doubling up to 1 s).
	AcceptBackoffs uint64
	// Steering says how the listener spreads connections over the queues: what was asked,
	// what is in effect and why; Steering.Fallback why BPF steering is not in use ("" when
	// it is, or was not asked). SteeringSummary says it in one line.
	Steering struct {
		// Mode is what Config.Steering asked for.
		Mode SteeringMode
		// BPF is true when zcnet's sk_reuseport program places new connections (flow table,
		// then Policy, then a hash); false when the kernel's SO_REUSEPORT hash does (or one
		// listening socket hands connections round robin: SteerSingleListener).
		BPF bool
		// Fallback says why BPF steering is not in use although SteerAuto asked for it ("" when
		// it is in use or was not asked).
		Fallback string
		// Policy in effect under BPF steering: never bpf.PolicyAuto (the auto choice is resolved
		// to PolicyCPU or PolicyHash); PolicyHash without BPF steering.
		Policy bpf.Policy
		// PolicyReason says why Policy is what it is.
		PolicyReason string
		// Exact: the CPU policy is in effect and every queue's thread is pinned on the CPU the
		// map names for it, no two queues on one CPU: a connection lands on the queue of the CPU
		// that received its SYN (or the queue nearest to it).
		Exact bool
		// QueueCPUs[q] is the CPU queue q's thread is pinned on, -1 when it is not pinned
		// (Config.NoPin, or the kernel refused the pinning: a cpuset).
		QueueCPUs []int
		// CPUQueues[c] is the queue the CPU→queue map names for CPU c (-1: none, the hash places
		// SYNs received there); nil unless Policy includes bpf.PolicyCPU.
		CPUQueues []int
		// Interfaces are the XDP and tc attachments asked for by ListenOptions.SteerInterfaces,
		// in that order.
		Interfaces []InterfaceSteering
	}
	SteeringSummary string
	// ZcrxNICFallback says why the listener's connections do not receive through the NIC
	// queue ListenOptions.ZcrxNIC named ("" when they do, or it was not asked for): they use
	// the queues' own receive path (Stats.Recv.ZcrxFallback says which). ZcrxNIC is hwq's
	// binding of the listener's address to that NIC RX queue, nil without one (undone when
	// the listener closes).
	ZcrxNICFallback string
	ZcrxNIC         *hwq.Binding
}

// InterfaceSteering is the state of one ListenOptions.SteerInterfaces entry.
type InterfaceSteering struct {
	Name  string
	Index int // interface index in the listener's network namespace (0 if unknown)
	// XDP: the XDP program is attached (it counts packets per RX queue);
	// XDPRedirect: and it redirects the packets of the listener's flows through a cpumap
	// to the CPU of the queue that owns them (needs pinned queues).
	XDP, XDPRedirect bool
	// TC: the tc egress program is attached: packets of the listener's flows leave on the
	// TX queue numbered like their queue (modulo the device's TX queues).
	TC bool
	// XPS: the device has XPS configured, which overrides the tc program's TX queue.
	XPS bool
	// Reason says what is missing and why ("" when XDP redirect and tc are in place and XPS
	// is off).
	Reason string
	// Note says how the attachment was adapted to the device (veth: generic XDP).
	Note string
}

// Stats returns the listener's counters and state (safe from any goroutine).
func (l *Listener) Stats() ListenerStats {
	s := ListenerStats{Accepted: l.accepted.Load(), AcceptErrors: l.acceptErrs.Load(),
		AcceptBackoffs: l.backoffs.Load()}
	for _, p := range l.feats {
		p.stats(&s) // steering, the zcrx NIC
	}
	return s
}

func (p *lpart) start() {
	if p.closing {
		p.finish()
		return
	}
	if !p.paused {
		p.q.be.listen(p)
	}
}

// SetAcceptPaused stops (true) or restarts (false) accepting: while paused new connections
// wait in the kernel's backlog (and beyond it are refused by the kernel), which is how a
// consumer that cannot keep up pushes back. It is asynchronous.
func (l *Listener) SetAcceptPaused(on bool) error {
	if l.closed.Load() {
		return &OpError{Op: "pause", Net: l.network, Addr: l.addr, Err: ErrClosed}
	}
	for _, p := range l.parts {
		p.q.Post(func() {
			if p.closing || p.paused == on {
				return
			}
			p.paused = on
			if on {
				if p.armed {
					p.q.be.pauseListen(p)
				}
			} else if p.timer == nil {
				p.q.be.listen(p)
			}
		})
	}
	return nil
}

// accepted takes one accepted descriptor (loop only).
func (p *lpart) accepted(fd int) {
	if p.closing || p.l.e.closed.Load() {
		rawfd.Close(fd)
		return
	}
	p.backoff = 0
	p.l.accepted.Add(1)
	if p.l.tls != nil {
		p.l.tls.accept(p.l, p.q, fd) // the handshake first (tls.go)
		return
	}
	p.l.handoff(p.q, fd)
}

// acceptFailed handles an accept error; it reports whether accepting should pause (the
// backend then calls resume later through the timer).
func (p *lpart) acceptFailed(err unix.Errno) bool {
	if err == unix.ECANCELED || p.closing {
		return false
	}
	p.l.acceptErrs.Add(1)
	p.q.ctr.acceptErrs.Add(1)
	switch err {
	case unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM:
		// Out of descriptors or memory: retrying at once would spin. Back off like net/http.
		p.backoff = min(max(2*p.backoff, acceptBackoffMin), acceptBackoffMax)
		p.l.backoffs.Add(1)
		p.q.ctr.acceptBackoffs.Add(1)
		return true
	}
	return false
}

// pauseAccept re-arms accepting after the backoff (loop only).
func (p *lpart) pauseAccept() {
	if p.timer != nil || p.closing {
		return
	}
	p.timer = p.q.After(p.backoff, func() {
		p.timer = nil
		if p.closing {
			if !p.armed {
				p.finish()
			}
		} else if !p.paused {
			p.q.be.listen(p)
		}
	})
}

func (p *lpart) stop() {
	if p.closing {
		return
	}
	p.closing = true
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.q.be.stopListen(p)
}

// finish: the part no longer accepts (loop only).
func (p *lpart) finish() {
	if p.stopped.CompareAndSwap(false, true) {
		p.l.wg.Done()
	}
}

// handoff creates the connection for an accepted descriptor on the queue that will own it.
func (l *Listener) handoff(from *queue, fd int) {
	target := l.target(from)
	if target == from {
		l.create(target, fd)
		return
	}
	if err := target.Post(func() { l.create(target, fd) }); err != nil {
		rawfd.Close(fd)
	}
}

// target is the queue that will own a connection accepted on from's socket.
func (l *Listener) target(from *queue) *queue {
	if len(l.e.queues) > 1 && len(l.socks) == 1 {
		return l.e.queues[int(l.rr.Add(1)-1)%len(l.e.queues)]
	}
	return from
}

// create makes the connection on its queue and asks the accept function for its handler.
func (l *Listener) create(q *queue, fd int) {
	if l.e.closed.Load() {
		rawfd.Close(fd)
		return
	}
	s, err := tcpglue.FromAcceptedFD(fd, l.family, true) // every backend: non-blocking
	if err != nil {
		rawfd.Close(fd)
		return
	}
	l.open(q, s, fd, nil)
}

// open makes the connection of socket s (descriptor fd) on q (a TLS connection's after its
// handshake: t) and asks the accept function for its handler.
func (l *Listener) open(q *queue, s *tcpglue.Socket, fd int, t tlsAttach) {
	c := newConn(l.e, q, s, fd, l.network)
	if t != nil {
		t.attach(c)
	}
	c.fillAddrs()
	if l.steer != nil && c.laddr.IsValid() && c.raddr.IsValid() {
		c.steer = l.steer
	}
	q.addConn(c)
	if err := q.be.start(c); err != nil {
		c.h = HandlerFuncs{}
		c.st.Open()
		c.fail(c.opErr("accept", err))
		return
	}
	c.st.Open()
	if l.readSelf {
		if err := features.readSelfOpen(c); err != nil {
			// Out of descriptors, most likely: as if the accept had failed.
			l.acceptErrs.Add(1)
			q.ctr.acceptErrs.Add(1)
			c.h = HandlerFuncs{}
			c.Close()
			c.service()
			return
		}
	}
	h, err := l.callAccept(c)
	if (err != nil || h == nil) && c.self != nil {
		c.self.appClosed() // refused: nobody will read or close the duplicate
	}
	if c.ended() {
		return
	}
	if err != nil || h == nil {
		if c.h == nil {
			c.h = HandlerFuncs{}
		}
		if err != nil {
			c.fail(c.opErr("accept", err))
		} else {
			c.Close()
			c.service()
		}
		return
	}
	if c.h == nil {
		c.h = h
	}
	c.takeReader(l.exclusive)
	for _, p := range l.feats {
		p.accepted(c) // the zcrx NIC's receive path
	}
	c.setupRecvPath()
	c.armRecv()
	c.service() // sends queued by the accept function
}

func (l *Listener) callAccept(c *Conn) (h Handler, err error) {
	defer func() {
		if v := recover(); v != nil {
			c.q.ctr.handlerPanics.Add(1)
			h, err = nil, newPanicError("accept", v)
		}
	}()
	return l.accept(c), nil
}

// Close stops accepting and closes the listening sockets. Accepted connections stay open.
// A second Close returns an error wrapping ErrClosed. Called from a handler it returns at
// once and the sockets close in the background (Done tells when).
func (l *Listener) Close() error {
	if !l.closed.CompareAndSwap(false, true) {
		return &OpError{Op: "close", Net: l.network, Addr: l.addr, Err: ErrClosed}
	}
	for _, p := range l.parts {
		if err := p.q.Post(p.stop); err != nil {
			p.finish() // the queue is gone: nothing accepts any more
		}
	}
	if l.e.onAnyLoop() {
		go l.finishClose()
		return nil
	}
	l.finishClose()
	return nil
}

// Done is closed once the listener's sockets are closed.
func (l *Listener) Done() <-chan struct{} { return l.done }

func (l *Listener) finishClose() {
	l.wg.Wait()
	l.closeSockets()
	l.e.mu.Lock()
	delete(l.e.listeners, l)
	l.e.mu.Unlock()
	close(l.done)
}

func (l *Listener) closeSockets() {
	if l.steer != nil {
		l.steer.Close()
	}
	for _, p := range l.feats {
		p.close() // the zcrx NIC binding
	}
	for _, s := range l.socks {
		s.Close()
	}
}

// fillAddrs reads the connection's addresses and sets TCP_NODELAY (as Go's net does).
func (c *Conn) fillAddrs() {
	if !c.e.cfg.Nagle {
		c.sock.SetNoDelay(true)
	}
	if ap, err := c.sock.LocalAddr(); err == nil {
		c.laddr = ap
	}
	if !c.raddr.IsValid() {
		if ap, err := c.sock.RemoteAddr(); err == nil {
			c.raddr = ap
		}
	}
}
