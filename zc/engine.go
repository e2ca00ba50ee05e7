package zc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/tcpglue"
)

// Engine owns queues, listeners and connections.
type Engine struct {
	cfg      Config
	backend  Backend
	fallback error // why the engine fell back to plain sockets (nil when it did not)
	queues   []*equeue
	alt      altBackend // the backend when io_uring is not used

	mu        sync.Mutex
	conns     map[*Conn]struct{}
	listeners map[*Listener]struct{}
	closed    atomic.Bool
	rr        atomic.Uint32

	steerFallbacks atomic.Uint64
}

// equeue is one queue with the engine's per-queue counters (written by its loop only).
type equeue struct {
	*loop.Queue
	e     *Engine
	idx   int
	space chan struct{} // signalled when send buffers return to the region
	ctr   counters
}

// counters are written by one goroutine (a queue loop, or a plain connection's goroutines
// through atomics) and read by anyone.
type counters struct {
	sentZC, zcCopied, sentCopy, sendOps, sendZCOps atomic.Uint64
	recvRing, recvPlain, sentPlain                 atomic.Uint64
	recvMapped, recvMappedCopied, mappedFallbacks  atomic.Uint64
	zcSwitches, zcProbes, bufEmpty                 atomic.Uint64
}

// New creates an engine: its queues, each on its own locked OS thread.
func New(cfg Config) (*Engine, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, &OpError{Op: "new", Err: err}
	}
	e := &Engine{cfg: cfg, conns: map[*Conn]struct{}{}, listeners: map[*Listener]struct{}{}}
	if cfg.Backend == BackendPlain || cfg.Backend == BackendShim {
		if err := e.startAlt(cfg.Backend, nil); err != nil {
			return nil, &OpError{Op: "new", Err: err}
		}
		return e, nil
	}
	err := e.startQueues()
	if err == nil {
		e.backend = BackendIOUring
		return e, nil
	}
	if cfg.Backend == BackendIOUring || cfg.NoFallback {
		return nil, &OpError{Op: "new", Err: fmt.Errorf("io_uring backend unavailable (fallback forbidden): %w", err)}
	}
	// Fall back: the kernel-queue shim when its module is loaded, else plain sockets.
	started := false
	if shimBackend != nil && shimAvailable() == nil {
		if serr := e.startAlt(BackendShim, err); serr == nil {
			started = true
		} else {
			// The module is there but its queues could not start (locked-memory limit, ...):
			// plain sockets, with both reasons in the fallback report.
			err = fmt.Errorf("%w; zcshim: %v", err, serr)
		}
	}
	if !started {
		if ferr := e.startAlt(BackendPlain, err); ferr != nil {
			return nil, &OpError{Op: "new", Err: ferr}
		}
	}
	if cfg.OnFallback != nil {
		cfg.OnFallback(err)
	}
	return e, nil
}

func (e *Engine) startQueues() error {
	caps := uring.DetectCapabilities()
	if caps.Err != nil {
		return caps.Err
	}
	if err := caps.NeedOp(uring.OpSendZC, "SEND_ZC", "6.0"); err != nil && e.cfg.SendPath == SendZeroCopy {
		return err
	}
	cpus := allowedCPUs()
	for i := 0; i < e.cfg.Queues; i++ {
		q, err := loop.New(loop.Config{
			ID: i, CPU: cpus[i%len(cpus)], NoPin: e.cfg.NoPin,
			SendBufSize: e.cfg.SendBufSize, SendBufs: e.cfg.SendBufs,
			RecvBufSize: e.cfg.RecvBufSize, RecvBufs: e.cfg.RecvBufs,
			NoBundles: e.cfg.NoBundles, CloseWait: e.cfg.CloseTimeout,
		})
		if err != nil {
			for _, eq := range e.queues {
				eq.Close()
			}
			e.queues = nil
			return err
		}
		e.queues = append(e.queues, &equeue{Queue: q, e: e, idx: i, space: make(chan struct{}, 1)})
	}
	return nil
}

// Backend returns the backend in use.
func (e *Engine) Backend() Backend { return e.backend }

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

func (e *Engine) pickQueue() *equeue {
	return e.queues[int(e.rr.Add(1)-1)%len(e.queues)]
}

func (e *Engine) addConn(c *Conn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return false
	}
	e.conns[c] = struct{}{}
	return true
}

func (e *Engine) removeConn(c *Conn) {
	e.mu.Lock()
	delete(e.conns, c)
	e.mu.Unlock()
}

// Dial connects to address ("host:port") and returns a connection served by one of the
// engine's queues; h receives its events. The connect itself goes through io_uring.
func (e *Engine) Dial(ctx context.Context, network, address string, h Handler) (*Conn, error) {
	if e.closed.Load() {
		return nil, &OpError{Op: "dial", Net: network, Err: ErrClosed}
	}
	if h == nil {
		return nil, &OpError{Op: "dial", Net: network, Err: fmt.Errorf("nil handler: %w", ErrInvalid)}
	}
	if err := ctx.Err(); err != nil {
		return nil, &OpError{Op: "dial", Net: network, Err: err}
	}
	ap, err := tcpglue.Resolve(network, address)
	if err != nil {
		return nil, &OpError{Op: "dial", Net: network, Err: err}
	}
	raddr := net.TCPAddrFromAddrPort(ap)
	if e.alt != nil {
		return e.alt.dial(ctx, network, ap, h)
	}
	family := familyOf(ap)
	s, err := tcpglue.NewSocket(family, false)
	if err != nil {
		return nil, &OpError{Op: "dial", Net: network, Addr: raddr, Err: err}
	}
	if e.cfg.SocketOptions != nil {
		if err := e.cfg.SocketOptions(s); err != nil {
			s.Close()
			return nil, &OpError{Op: "dial", Net: network, Addr: raddr, Err: err}
		}
	}
	fd, err := s.Disown()
	if err != nil {
		s.Close()
		return nil, &OpError{Op: "dial", Net: network, Addr: raddr, Err: err}
	}
	sa, err := tcpglue.NewRawSockaddr(ap, family)
	if err != nil {
		closeFD(fd)
		return nil, &OpError{Op: "dial", Net: network, Addr: raddr, Err: err}
	}
	q := e.pickQueue()
	c := newConn(e, q, fd, network)
	c.h = h
	c.raddr = raddr
	if !e.addConn(c) {
		closeFD(fd)
		return nil, &OpError{Op: "dial", Net: network, Addr: raddr, Err: ErrClosed}
	}
	res := make(chan error, 1)
	c.connectDone = res
	c.connectSA = sa
	if err := q.Post(c.startConnect); err != nil {
		e.removeConn(c)
		closeFD(fd)
		return nil, &OpError{Op: "dial", Net: network, Addr: raddr, Err: ErrClosed}
	}
	select {
	case err = <-res:
	case <-ctx.Done():
		q.Post(c.cancelConnect)
		err = <-res
		if err == nil {
			// Connected just before the cancel took effect: honour the context anyway.
			c.Close()
			<-c.done
			err = ctx.Err()
		} else if errors.Is(err, errCanceled) {
			err = ctx.Err()
		}
	}
	if err != nil {
		return nil, &OpError{Op: "dial", Net: network, Addr: raddr, Err: err}
	}
	return c, nil
}

func familyOf(ap netip.AddrPort) int {
	if ap.Addr().Is4() || ap.Addr().Is4In6() {
		return 2 // AF_INET
	}
	return 10 // AF_INET6
}

// Close closes listeners and connections (letting queued sends go out and zero-copy
// notifications arrive, bounded by CloseTimeout), then the queues, regions and rings.
// It is idempotent; later calls return an error wrapping ErrClosed.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return &OpError{Op: "close", Err: ErrClosed}
	}
	e.mu.Lock()
	ls := make([]*Listener, 0, len(e.listeners))
	for l := range e.listeners {
		ls = append(ls, l)
	}
	cs := make([]*Conn, 0, len(e.conns))
	for c := range e.conns {
		cs = append(cs, c)
	}
	e.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, c := range cs {
		c.Close()
	}
	deadline := time.After(e.cfg.CloseTimeout + time.Second)
	for _, c := range cs {
		select {
		case <-c.done:
		case <-deadline:
		}
	}
	var first error
	for _, q := range e.queues {
		if err := q.Close(); err != nil && first == nil {
			first = err
		}
	}
	if e.alt != nil {
		e.alt.close()
	}
	return first
}

// Stats are engine-wide counters.
type Stats struct {
	Backend  string
	Fallback string // why the engine fell back to plain sockets; "" when it did not
	Queues   int
	Conns    int

	BytesSentZC    uint64 // sent with SEND_ZC, and the kernel did not copy them
	BytesZCCopied  uint64 // sent with SEND_ZC, but the kernel reported it copied them
	BytesSentCopy  uint64 // sent with a copying SEND
	BytesSentPlain uint64 // sent by the plain-socket backend (write(2))
	BytesRecvRing  uint64 // received through the provided-buffer ring
	BytesRecvPlain uint64 // received by the plain-socket backend (read(2))
	// BytesRecvMapped / BytesRecvMappedCopied: received through the mapped window (RecvMapped),
	// as mapped pages / copied because they could not be mapped.
	BytesRecvMapped       uint64
	BytesRecvMappedCopied uint64
	RecvMappedFallbacks   uint64 // connections that wanted RecvMapped and use the ring
	SendOps               uint64 // copying SEND operations
	SendZCOps             uint64 // SEND_ZC operations
	ZCSwitches            uint64 // times an adaptive connection switched to copying sends
	ZCProbes              uint64 // times an adaptive connection tried zero-copy again

	Enters         uint64 // io_uring_enter calls
	CQEs           uint64
	Wakeups        uint64 // cross-goroutine wake-ups of sleeping queues
	CQOverflows    uint64
	BufRingEmpty   uint64 // recvs that found no provided buffer (ENOBUFS)
	NotifsPending  int64  // zero-copy notifications outstanding
	BundleMismatch uint64
	StrayCQEs      uint64
	// SteeringFallbacks counts listeners that wanted BPF steering (SteerAuto) and fell back
	// to plain SO_REUSEPORT hashing (the reason: Listener.SteeringFallback).
	SteeringFallbacks uint64
}

func (s *Stats) addCounters(c *counters) {
	s.BytesSentZC += c.sentZC.Load()
	s.BytesZCCopied += c.zcCopied.Load()
	s.BytesSentCopy += c.sentCopy.Load()
	s.BytesSentPlain += c.sentPlain.Load()
	s.BytesRecvRing += c.recvRing.Load()
	s.BytesRecvPlain += c.recvPlain.Load()
	s.BytesRecvMapped += c.recvMapped.Load()
	s.BytesRecvMappedCopied += c.recvMappedCopied.Load()
	s.RecvMappedFallbacks += c.mappedFallbacks.Load()
	s.SendOps += c.sendOps.Load()
	s.SendZCOps += c.sendZCOps.Load()
	s.ZCSwitches += c.zcSwitches.Load()
	s.ZCProbes += c.zcProbes.Load()
	s.BufRingEmpty += c.bufEmpty.Load()
}

// Stats returns engine-wide counters.
func (e *Engine) Stats() Stats {
	s := Stats{Backend: e.backend.String(), Queues: len(e.queues), SteeringFallbacks: e.steerFallbacks.Load()}
	if nq, ok := e.alt.(interface{ numQueues() int }); ok {
		s.Queues = nq.numQueues()
	}
	if e.fallback != nil {
		s.Fallback = e.fallback.Error()
	}
	e.mu.Lock()
	s.Conns = len(e.conns)
	e.mu.Unlock()
	for _, q := range e.queues {
		s.addCounters(&q.ctr)
		qs := q.Stats()
		s.Enters += qs.Enters
		s.CQEs += qs.CQEs
		s.Wakeups += qs.Wakeups
		s.CQOverflows += qs.OverflowFlushes
		s.BufRingEmpty += qs.BufRingEmpty
		s.NotifsPending += qs.NotifsPending
		s.BundleMismatch += qs.BundleMismatch
		s.StrayCQEs += qs.StrayCQEs
	}
	if e.alt != nil {
		s.addCounters(e.alt.counters())
	}
	return s
}
