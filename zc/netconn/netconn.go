package netconn

import (
	"github.com/zcnet/zcnet/zc"

	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// How the face reads. By default its connections read the socket themselves
// (zc.ListenOptions.ReadSelf, zc.Conn.Read: read(2) on the reading goroutine, waiting in
// Go's poller, one copy kernel to p, as in Go's net). With Options.Ring (and where reading
// the socket yourself is not possible: the zcshim backend, RecvZcrx, RecvMapped) the
// handler queues received Data for Read, which copies out of it; flow control is then the
// engine's: the queued Data counts toward zc.Config.MaxRecvHeld, so a reader that falls behind
// stops the connection's receiving, not the queue's. Write is zc.Conn.Write (direct
// write(2) when nothing is queued), ReadFrom is zc.Conn.ReadFrom (sendfile, splice). Every
// connection is opened Exclusive: its handler is its reader for good, so a zc.Relay or
// SetHandler of it is refused.

type netConn struct {
	c       *zc.Conn
	network string

	wmu     sync.Mutex // serializes Write and ReadFrom (a write is never interleaved)
	mu      sync.Mutex
	rq      []zc.Data
	roff    int
	rerr    error
	closed  atomic.Bool // Close ran (set under mu, read anywhere)
	readyCh chan struct{}

	direct bool // the connection reads the socket itself (zc.Conn.Read); fixed at creation

	// Write from the caller's slice (writeRef, wmu held): one SendBytes in flight at a time.
	refDone    chan struct{} // the last callback of a writeBufs ran
	refCB      func(error)   // the callback, made once
	refPending atomic.Int32  // SendBytes callbacks owed (+1 while queuing)
	refErr     atomic.Pointer[error]
	refWaiting atomic.Bool // a Write waits for refDone (deadline changes signal wdlCh)
	wdlCh      chan struct{}
	wdl        atomic.Pointer[time.Time] // the write deadline, as set on the zc.Conn
	noRef      atomic.Bool               // SendBytes refused (zcshim + SendZeroCopy): copy

	addrs atomic.Pointer[[2]net.Addr] // local, remote: made on first use (errors, LocalAddr)
	rto   atomic.Pointer[net.OpError] // Read's deadline error, made on first use

	// The ring path's read waits (direct connections wait in zc.Conn.Read).
	readers atomic.Int32 // goroutines waiting in Read
	rdl     atomic.Pointer[time.Time]
	dlMu    sync.Mutex
	dlCh    chan struct{} // closed (and replaced) when a deadline changes: a broadcast
}

func (n *netConn) deadlineChanged() {
	n.dlMu.Lock()
	if n.dlCh != nil {
		close(n.dlCh)
		n.dlCh = make(chan struct{})
	}
	n.dlMu.Unlock()
}

func (n *netConn) deadlineWatch() <-chan struct{} {
	n.dlMu.Lock()
	defer n.dlMu.Unlock()
	return n.dlCh
}

func newNetConn(c *zc.Conn, network string, direct bool) *netConn {
	n := &netConn{c: c, network: network, direct: direct}
	if !n.direct {
		// The ring path's wake-ups; a direct connection waits in the poller and carries
		// neither (signal on a nil channel does nothing).
		n.readyCh, n.dlCh = make(chan struct{}, 1), make(chan struct{})
	}
	return n
}

// errNilEngine is Listen's and Dial's error without an engine.
var errNilEngine = fmt.Errorf("nil engine: %w", zc.ErrInvalid)

// errEngineClosedConn is what a ring connection's Read returns once the engine closed it
// (after what had arrived), as zc.Conn.Read does for a direct one: it matches net.ErrClosed.
var errEngineClosedConn = fmt.Errorf("the engine closed the connection: %w", net.ErrClosed)

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// direct reports whether the face's connections on e read the socket themselves: RecvRing
// engines on a backend that lets them (io_uring, plain), unless o.Ring.
func (o Options) direct(e *zc.Engine) bool {
	cfg := e.Config()
	return !o.Ring && cfg.RecvPath == zc.RecvRing && cfg.Backend != zc.BackendShim
}

// Handler side (loop goroutine).

func (n *netConn) OnData(c *zc.Conn, d zc.Data) {
	n.mu.Lock()
	if n.closed.Load() {
		n.mu.Unlock()
		d.Release()
		return
	}
	n.rq = append(n.rq, d)
	n.mu.Unlock()
	if n.readers.Load() > 0 {
		c.Wake(n.readyCh) // let the reader run now, not when the runtime notices
	} else {
		signal(n.readyCh)
	}
}

func (n *netConn) OnEOF(c *zc.Conn, err error) {
	n.mu.Lock()
	if n.rerr == nil {
		n.rerr = err
	}
	n.mu.Unlock()
	signal(n.readyCh)
}

func (n *netConn) OnClose(c *zc.Conn, err error) {
	n.mu.Lock()
	if n.rerr == nil {
		if err == nil {
			err = errEngineClosedConn // not by this face's Close (n.closed), nor by the peer (OnEOF)
		}
		n.rerr = err
	}
	n.mu.Unlock()
	signal(n.readyCh)
}

func (n *netConn) opErr(op string, err error) error {
	if err == io.EOF {
		return err
	}
	if zerr, ok := err.(*zc.OpError); ok {
		err = zerr.Err // what the zc.Conn returns (no reflection: net/http meets one a request)
	} else {
		var zerr *zc.OpError
		if errors.As(err, &zerr) {
			err = zerr.Err
		}
	}
	if err == os.ErrDeadlineExceeded && op == "read" {
		return n.readTimeout()
	}
	a := n.addrPair()
	return &net.OpError{Op: op, Net: n.network, Source: a[0], Addr: a[1], Err: err}
}

// readTimeout is Read's error when its deadline passed, made once per connection (zc.Conn's
// own is made once too): net/http ends a background Read with a deadline on every request,
// and Go's net allocates a new *net.OpError each time.
func (n *netConn) readTimeout() error {
	if e := n.rto.Load(); e != nil {
		return e
	}
	a := n.addrPair()
	e := &net.OpError{Op: "read", Net: n.network, Source: a[0], Addr: a[1], Err: os.ErrDeadlineExceeded}
	n.rto.CompareAndSwap(nil, e)
	return n.rto.Load()
}

// addrPair returns the connection's addresses as net.Addrs, made once: net/http ends a
// background Read with a deadline on every request, and each error names both.
func (n *netConn) addrPair() *[2]net.Addr {
	if a := n.addrs.Load(); a != nil {
		return a
	}
	a := &[2]net.Addr{n.c.LocalAddr(), n.c.RemoteAddr()}
	n.addrs.CompareAndSwap(nil, a)
	return n.addrs.Load()
}

func deadlineOf(p *atomic.Pointer[time.Time]) time.Time {
	if t := p.Load(); t != nil {
		return *t
	}
	return time.Time{}
}

// Read reads received bytes, blocking until some arrive, the deadline passes or the
// connection closes. On a queue goroutine it returns zc.ErrWouldBlock instead of waiting.
func (n *netConn) Read(p []byte) (int, error) {
	if n.direct {
		if n.isClosed() {
			return 0, n.opErr("read", net.ErrClosed)
		}
		k, err := n.c.Read(p)
		if err != nil && err != io.EOF {
			if n.isClosed() {
				err = net.ErrClosed // closed under us
			}
			return k, n.opErr("read", err)
		}
		return k, err
	}
	for {
		n.mu.Lock()
		if n.closed.Load() {
			n.mu.Unlock()
			return 0, n.opErr("read", net.ErrClosed)
		}
		if len(n.rq) > 0 {
			got := 0
			for got < len(p) && len(n.rq) > 0 {
				b := n.rq[0].Bytes()
				if b == nil || n.roff >= len(b) {
					// Released elsewhere or consumed: drop it (never spin on it).
					n.rq[0].Release()
					n.rq[0] = zc.Data{}
					n.rq = n.rq[1:]
					n.roff = 0
					continue
				}
				k := copy(p[got:], b[n.roff:])
				got += k
				n.roff += k
				if n.roff == len(b) {
					n.rq[0].Release()
					n.rq[0] = zc.Data{}
					n.rq = n.rq[1:]
					n.roff = 0
				}
			}
			more := len(n.rq) > 0 || n.rerr != nil
			n.mu.Unlock()
			if more {
				signal(n.readyCh) // another reader may proceed
			}
			if got > 0 || len(p) == 0 {
				return got, nil
			}
			continue
		}
		if n.rerr != nil {
			err := n.rerr
			n.mu.Unlock()
			signal(n.readyCh)
			return 0, n.opErr("read", err)
		}
		n.mu.Unlock()
		if len(p) == 0 {
			return 0, nil
		}
		if n.c.OnQueue() {
			return 0, n.opErr("read", zc.ErrWouldBlock)
		}
		if err := n.wait(n.readyCh, &n.rdl); err != nil {
			return 0, n.opErr("read", err)
		}
	}
}

// wait blocks until ch is signalled, the deadline passes or changes.
func (n *netConn) wait(ch chan struct{}, dl *atomic.Pointer[time.Time]) error {
	n.readers.Add(1)
	defer n.readers.Add(-1)
	changed := n.deadlineWatch()
	d := deadlineOf(dl)
	var t <-chan time.Time
	if !d.IsZero() {
		left := time.Until(d)
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		tm := time.NewTimer(left)
		defer tm.Stop()
		t = tm.C
	}
	select {
	case <-ch:
		return nil
	case <-changed:
		return nil
	case <-n.c.Done():
		signal(ch)
		return nil
	case <-t:
		return os.ErrDeadlineExceeded
	}
}

// Write sends p. A p of at least 512 KiB is sent from p itself (zc.Conn.SendBytes: no copy
// into send buffers) and Write returns once the kernel no longer needs p: p is the
// caller's again whatever Write returns. A smaller p is copied into the connection's send
// buffers (zc.Conn.Write: written at once when nothing is queued and the socket takes it)
// and Write returns once it is queued; it blocks while the connection has too much
// queued, bounded by the write deadline.
//
// A write deadline that passes while a large Write waits for the kernel closes the
// connection (unlike Go's net, where it stays usable): the bytes queued from p cannot be
// taken back while the kernel may read them. Write then returns os.ErrDeadlineExceeded
// only once the close let go of p: at once when the socket had taken everything, otherwise
// within zc.Config.CloseTimeout on a silent peer and zc.Config.CloseStall on one that
// answers but does not read. A Close (or a reset, or zc.Engine.Close) while a large Write
// waits makes it return likewise, with the error that ended the connection, once p is
// released; after such an error Write reports 0 bytes written (how much of p reached the
// kernel is not known to the face, and the connection is gone). Concurrent Writes are sent
// one after the other, each whole, as Go's net does.
func (n *netConn) Write(p []byte) (int, error) {
	n.wmu.Lock()
	defer n.wmu.Unlock()
	if n.isClosed() {
		return 0, n.opErr("write", net.ErrClosed)
	}
	if len(p) >= refWriteMin && !n.noRef.Load() && !n.c.OnQueue() {
		one := [1][]byte{p}
		k, err := n.writeBufs(one[:])
		return int(k), err
	}
	k, err := n.c.Write(p)
	if err != nil {
		return k, n.writeErr(err)
	}
	return k, nil
}

// WriteBuffers writes the buffers of v in order, as one write: concurrent Writes do not
// come between them (what net.Buffers' WriteTo gives on a *net.TCPConn with writev). Each
// buffer of at least 512 KiB is sent from its own memory (as Write sends one that large),
// the others are copied, and WriteBuffers returns once the kernel no longer needs any of
// them; deadlines, Close and errors are as for Write. It consumes what it wrote from v, as
// net.Buffers.WriteTo does. A nil v is refused with zc.ErrInvalid (nothing written).
//
// net.Buffers.WriteTo cannot find this method: it looks for an interface unexported by
// package net, so on any net.Conn outside it (this face included) v.WriteTo(c) calls Write
// once per buffer (each whole, but another goroutine's Write may come between two).
// Call c.WriteBuffers(&v) instead.
func (n *netConn) WriteBuffers(v *net.Buffers) (int64, error) {
	if v == nil {
		return 0, n.opErr("write", fmt.Errorf("WriteBuffers of a nil *net.Buffers: %w", zc.ErrInvalid))
	}
	n.wmu.Lock()
	defer n.wmu.Unlock()
	if n.isClosed() {
		return 0, n.opErr("write", net.ErrClosed)
	}
	var k int64
	var err error
	if n.c.OnQueue() || n.noRef.Load() {
		for _, b := range *v {
			var m int
			m, err = n.c.Write(b)
			k += int64(m)
			if err != nil {
				err = n.writeErr(err)
				break
			}
		}
	} else {
		k, err = n.writeBufs(*v)
	}
	for rest := k; len(*v) > 0; {
		l := int64(len((*v)[0]))
		if rest < l {
			(*v)[0] = (*v)[0][rest:]
			break
		}
		rest -= l
		*v = (*v)[1:]
	}
	if len(*v) == 0 {
		*v = nil
	}
	return k, err
}

// refWriteMin is the size from which the face's Write sends from the caller's slice and
// waits for the kernel to be done with it, instead of zc.Conn.Write (which writes directly
// from the slice when the socket takes it all and copies the rest into send buffers).
// Measured on loopback (doc/notes/issue-29-s12-face29.md, BenchmarkFaceWrite): by
// reference costs 3-4x the CPU at 16 KiB and +40% per request for net/http's 60 KiB body
// writes under wrk (the hand-off to the queue and back costs more than the copy, and the
// direct write(2) already sends from the slice), ties at 256 KiB and saves 23-28% at 1 and
// 4 MiB. 512 KiB, not 1 MiB: net/http writes a 1 MiB body as 1 MiB minus what filled its
// 4 KiB bufio.Writer, which a 1 MiB threshold never sent by reference (zcbench's wrk 1 MiB
// ×32, two alternating pairs of runs: zc-net ÷ net 0.96× and 0.84× at 512 KiB against 1.15×
// and 0.95× at 1 MiB; bench/results/2026-11-29-wrk-refwritemin-*.txt). A variable for the
// tests.
var refWriteMin = 512 << 10

// writeBufs sends bufs in order (wmu held, not on a queue goroutine): those of at least
// refWriteMin bytes from their own memory, the others copied, and waits until the kernel
// is done with every one sent by reference.
func (n *netConn) writeBufs(bufs [][]byte) (int64, error) {
	if d := deadlineOf(&n.wdl); !d.IsZero() && !time.Now().Before(d) {
		return 0, n.opErr("write", os.ErrDeadlineExceeded)
	}
	if n.refDone == nil {
		n.refDone = make(chan struct{}, 1)
		n.wdlCh = make(chan struct{}, 1)
		n.refCB = func(err error) {
			if err != nil {
				n.refErr.CompareAndSwap(nil, &err)
			}
			if n.refPending.Add(-1) == 0 {
				signal(n.refDone) // capacity 1, one writeBufs at a time: never blocks
			}
		}
	}
	n.refErr.Store(nil)
	n.refPending.Store(1) // held until every buffer is queued: no callback signals before
	var written int64
	var qerr error
	for _, p := range bufs {
		if len(p) == 0 {
			continue
		}
		if len(p) < refWriteMin || n.noRef.Load() {
			k, err := n.c.Write(p)
			written += int64(k)
			if err != nil {
				qerr = n.writeErr(err)
				break
			}
			continue
		}
		n.refPending.Add(1)
		if err := n.c.SendBytes(p, n.refCB); err != nil {
			n.refPending.Add(-1)
			if errors.Is(err, zc.ErrNotSupported) && !n.noRef.Load() {
				// The zcshim backend under SendZeroCopy sends from registered memory only.
				n.noRef.Store(true)
				k, err := n.c.Write(p)
				written += int64(k)
				if err != nil {
					qerr = n.writeErr(err)
					break
				}
				continue
			}
			qerr = n.writeErr(err)
			break
		}
		written += int64(len(p))
	}
	if n.refPending.Add(-1) == 0 {
		if qerr != nil {
			return written, qerr
		}
		if e := n.refErr.Load(); e != nil {
			return 0, n.writeErr(*e)
		}
		return written, nil
	}
	n.refWaiting.Store(true)
	defer n.refWaiting.Store(false)
	timedOut := false
	for {
		var t <-chan time.Time
		var tm *time.Timer
		if d := deadlineOf(&n.wdl); !d.IsZero() && !timedOut {
			left := time.Until(d)
			if left <= 0 {
				timedOut = true
				n.closeForDeadline()
				continue
			}
			tm = time.NewTimer(left)
			t = tm.C
		}
		select {
		case <-n.refDone:
		case <-t:
			continue
		case <-n.wdlCh: // the deadline changed: take the new one
			if tm != nil {
				tm.Stop()
			}
			continue
		}
		if tm != nil {
			tm.Stop()
		}
		break
	}
	switch e := n.refErr.Load(); {
	case timedOut:
		return 0, n.opErr("write", os.ErrDeadlineExceeded)
	case qerr != nil:
		return written, qerr
	case e != nil:
		return 0, n.writeErr(*e)
	}
	return written, nil
}

// closeForDeadline closes the connection because a write deadline passed while the kernel
// held a large Write's bytes: the face's Read and Write fail from now on (as after Close,
// with the deadline's error for the Write that waits).
func (n *netConn) closeForDeadline() {
	n.Close()
}

// writeErr is the face's error for a failed Write or ReadFrom.
func (n *netConn) writeErr(err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, zc.ErrCloseTimeout):
		// zc.ErrCloseTimeout: Engine.Close's graceful close gave up: say that queued bytes
		// were dropped.
	case errors.Is(err, zc.ErrClosed) && !n.isClosed():
		err = io.ErrClosedPipe
	}
	return n.opErr("write", err)
}

// Close closes the connection gracefully and returns at once, as net.TCPConn's Close does:
// queued bytes still go out, bounded by zc.Config.CloseTimeout. A close that then gives up
// cannot be reported here; Zc().Stats().BytesDropped counts what it dropped. When
// zc.Engine.Close's close gives up instead, Read and Write return an error matching
// zc.ErrCloseTimeout (and net.ErrClosed).
func (n *netConn) Close() error {
	n.mu.Lock()
	if n.closed.Load() {
		n.mu.Unlock()
		return n.opErr("close", net.ErrClosed)
	}
	n.closed.Store(true)
	rq := n.rq
	n.rq = nil
	n.mu.Unlock()
	for _, d := range rq {
		d.Release()
	}
	err := n.c.Close() // a direct Read waiting in the poller wakes
	signal(n.readyCh)
	n.deadlineChanged()
	if err != nil && !errors.Is(err, zc.ErrClosed) {
		return n.opErr("close", err)
	}
	return nil
}

// CloseWrite shuts down the sending side after queued data is sent.
func (n *netConn) CloseWrite() error { return n.c.CloseWrite() }

func (n *netConn) LocalAddr() net.Addr  { return n.addrPair()[0] }
func (n *netConn) RemoteAddr() net.Addr { return n.addrPair()[1] }

// isClosed reports whether Close ran.
func (n *netConn) isClosed() bool { return n.closed.Load() }

// closedSet is what the deadline setters return on a closed connection (as Go's net does).
func (n *netConn) closedSet() error {
	if n.isClosed() {
		return n.opErr("set", net.ErrClosed)
	}
	return nil
}

func (n *netConn) SetDeadline(t time.Time) error {
	if err := n.closedSet(); err != nil {
		return err
	}
	n.SetReadDeadline(t)
	n.setWriteDeadline(t)
	return nil
}

func (n *netConn) SetReadDeadline(t time.Time) error {
	if err := n.closedSet(); err != nil {
		return err
	}
	if n.direct {
		n.c.SetReadDeadline(t) // Read waits in the poller, which wakes it itself
		return nil
	}
	n.setRingReadDeadline(t)
	return nil
}

// setRingReadDeadline is SetReadDeadline on the ring path. A function of its own: t's address
// taken in SetReadDeadline would put t on the heap on every call, the direct path's too
// (net/http sets four read deadlines a request; Go's net allocates none).
func (n *netConn) setRingReadDeadline(t time.Time) {
	if sameDeadline(n.rdl.Load(), t) {
		return
	}
	dl := t // a copy made here: &t would put t on the heap before the check
	n.rdl.Store(&dl)
	// Only a waiting reader needs the broadcast (net/http sets a deadline twice a request):
	// one that starts waiting after the check counts itself first and reads the new
	// deadline.
	if n.readers.Load() > 0 {
		n.deadlineChanged()
	}
}

// sameDeadline reports whether t is the deadline cur points to (nil: none).
func sameDeadline(cur *time.Time, t time.Time) bool {
	if cur == nil {
		return t.IsZero()
	}
	return cur.Equal(t)
}

func (n *netConn) SetWriteDeadline(t time.Time) error {
	if err := n.closedSet(); err != nil {
		return err
	}
	n.setWriteDeadline(t)
	return nil
}

// setWriteDeadline sets the deadline of Write and ReadFrom (the zc.Conn's). After the engine
// closed the connection there is nothing left to bound: its error is not the face's.
func (n *netConn) setWriteDeadline(t time.Time) {
	if !sameDeadline(n.wdl.Load(), t) {
		// A copy made here, not &t: t would go to the heap on every call (net/http clears
		// the write deadline on every request).
		dl := t
		n.wdl.Store(&dl)
	}
	n.c.SetWriteDeadline(t)
	if n.refWaiting.Load() {
		signal(n.wdlCh)
	}
}

// Zc returns the underlying connection (counters, socket options).
func (n *netConn) Zc() *zc.Conn { return n.c }

// Conn is the net.Conn face of a zc connection; it also exposes the zc.Conn (counters,
// socket options, sends). Where the face reads directly (the default, see Options.Ring), the
// zc.Conn's receive side is unused: SetReceivePaused and MaxRecvHeld have no effect, and the
// socket's receive buffer is the flow control, as in Go's net.
type Conn interface {
	net.Conn
	CloseWrite() error // shuts down the sending side after queued data is sent
	// WriteBuffers writes v as one write (writev); see the package doc. Use it instead of
	// v.WriteTo(c), which writes buffer by buffer on any net.Conn outside package net.
	WriteBuffers(v *net.Buffers) (int64, error)
	Zc() *zc.Conn
}

// Options choose how the face's connections receive. The zero value is the default
// (Listen, Dial).
type Options struct {
	// Ring makes the face receive through the engine queue's receive ring, as the
	// event-loop API does: Read copies out of receive buffers, bounded by
	// zc.Config.MaxRecvHeld. By default Read calls read(2) on the reading goroutine and waits
	// in Go's poller, as Go's net does: one copy instead of two and no hand-off to the
	// queue's thread (zc.Stats.Recv.BytesDirect); each such connection holds a second
	// descriptor (a duplicate for the poller). The zcshim backend and the RecvMapped and
	// RecvZcrx paths always receive through the queue.
	Ring bool
}

// Dial dials address on e with the default Options (see Options.Dial).
func Dial(ctx context.Context, e *zc.Engine, network, address string) (Conn, error) {
	return Options{}.Dial(ctx, e, network, address)
}

// Listen listens on address with e and the default Options (see Options.Listen).
func Listen(e *zc.Engine, network, address string) (net.Listener, error) {
	return Options{}.Listen(e, network, address)
}

// Dial dials like zc.Engine.Dial and returns a net.Conn (errors are *net.OpError). Where
// the connection reads directly (the default) and its socket cannot be duplicated for Go's
// poller, the connection is closed and Dial fails with the errno (EMFILE: out of
// descriptors).
func (o Options) Dial(ctx context.Context, e *zc.Engine, network, address string) (Conn, error) {
	if e == nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: errNilEngine}
	}
	nc := newNetConn(nil, network, o.direct(e))
	c, err := e.Dial(ctx, network, address, nc, zc.DialOptions{ReadSelf: nc.direct, Exclusive: true})
	if err != nil {
		var zerr *zc.OpError
		if errors.As(err, &zerr) {
			return nil, &net.OpError{Op: "dial", Net: network, Addr: zerr.Addr, Err: zerr.Err}
		}
		return nil, err
	}
	nc.c = c
	return nc, nil
}

// netListener is the net.Listener face. Accepted connections wait in a queue for Accept;
// when acceptBacklog of them wait, the listener stops accepting (the kernel's backlog holds
// the rest) until Accept catches up: a slow Accept never makes zc refuse connections.
type netListener struct {
	l       *zc.Listener
	network string
	mu      sync.Mutex
	q       []*netConn
	paused  bool
	shut    bool // Close ran: refuse what is still accepted
	ready   chan struct{}
	closed  chan struct{}
	once    sync.Once
	pauses  atomic.Uint64
}

const acceptBacklog = 1024

// Listen listens like zc.Engine.Listen and returns a net.Listener whose Accept returns
// Conns (errors are *net.OpError). Where the connections read directly (the default), one
// whose socket cannot be duplicated for Go's poller (out of descriptors) is closed and
// counted in zc.Stats.Faults.AcceptErrors, as if its accept had failed.
func (o Options) Listen(e *zc.Engine, network, address string) (net.Listener, error) {
	if e == nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: errNilEngine}
	}
	nl := &netListener{ready: make(chan struct{}, 1), closed: make(chan struct{}), network: network}
	direct := o.direct(e)
	l, err := e.Listen(network, address, func(c *zc.Conn) zc.Handler {
		nc := newNetConn(c, network, direct)
		nl.mu.Lock()
		if nl.shut {
			nl.mu.Unlock()
			return nil // closed meanwhile: refuse
		}
		nl.q = append(nl.q, nc)
		pause := len(nl.q) >= acceptBacklog && !nl.paused
		if pause {
			nl.paused = true
		}
		nl.mu.Unlock()
		if pause {
			nl.pauses.Add(1)
			nl.l.SetAcceptPaused(true)
		}
		signal(nl.ready)
		return nc
	}, zc.ListenOptions{ReadSelf: direct, Exclusive: true})
	if err != nil {
		var zerr *zc.OpError
		if errors.As(err, &zerr) {
			return nil, &net.OpError{Op: "listen", Net: network, Addr: zerr.Addr, Err: zerr.Err}
		}
		return nil, err
	}
	nl.l = l
	return nl, nil
}

func (nl *netListener) Accept() (net.Conn, error) {
	for {
		nl.mu.Lock()
		if len(nl.q) > 0 {
			c := nl.q[0]
			nl.q[0] = nil
			nl.q = nl.q[1:]
			resume := nl.paused && len(nl.q) <= acceptBacklog/2
			if resume {
				nl.paused = false
			}
			more := len(nl.q) > 0
			nl.mu.Unlock()
			if resume {
				nl.l.SetAcceptPaused(false)
			}
			if more {
				signal(nl.ready)
			}
			return c, nil
		}
		nl.mu.Unlock()
		select {
		case <-nl.ready:
		case <-nl.closed:
			return nil, &net.OpError{Op: "accept", Net: nl.network, Addr: nl.l.Addr(), Err: net.ErrClosed}
		case <-nl.l.Done(): // zc.Engine.Close closed the listener under us
			return nil, &net.OpError{Op: "accept", Net: nl.network, Addr: nl.l.Addr(), Err: net.ErrClosed}
		}
	}
}

func (nl *netListener) Close() error {
	err := error(&net.OpError{Op: "close", Net: nl.network, Addr: nl.l.Addr(), Err: net.ErrClosed})
	nl.once.Do(func() {
		close(nl.closed)
		err = nl.l.Close()
		nl.mu.Lock()
		q := nl.q
		nl.q = nil
		nl.shut = true
		nl.mu.Unlock()
		for _, c := range q {
			c.Close()
		}
	})
	return err
}

func (nl *netListener) Addr() net.Addr { return nl.l.Addr() }
