package zc

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// Handler receives a connection's events. Its methods run on the connection's queue
// goroutine (or, on the plain backend, the connection's reader goroutine): they must not
// block. They may call the connection's methods.
type Handler interface {
	// OnData delivers received bytes. d is borrowed until d.Release; holding many buffers
	// starves the queue's receive ring, so release them promptly.
	OnData(c *Conn, d Data)
	// OnEOF reports that the receive side ended: io.EOF when the peer closed its side, or
	// the error. Sending may still work after io.EOF.
	OnEOF(c *Conn, err error)
	// OnClose reports that the connection is closed and its resources freed: err is nil
	// after a local Close, otherwise the error that killed it.
	OnClose(c *Conn, err error)
}

// HandlerFuncs adapts functions to Handler. A nil Data releases the data unread.
type HandlerFuncs struct {
	Data  func(c *Conn, d Data)
	EOF   func(c *Conn, err error)
	Close func(c *Conn, err error)
}

func (h HandlerFuncs) OnData(c *Conn, d Data) {
	if h.Data != nil {
		h.Data(c, d)
	} else {
		d.Release()
	}
}

func (h HandlerFuncs) OnEOF(c *Conn, err error) {
	if h.EOF != nil {
		h.EOF(c, err)
	}
}

func (h HandlerFuncs) OnClose(c *Conn, err error) {
	if h.Close != nil {
		h.Close(c, err)
	}
}

// Data is a borrowed receive buffer.
type Data struct {
	buf memreg.Buf
	n   int
	mr  *mappedData // set for data from the mapped receive window
}

// Bytes returns the received bytes, or nil after Release.
func (d Data) Bytes() []byte {
	if d.mr != nil {
		return d.mr.bytes()
	}
	b := d.buf.Bytes()
	if b == nil {
		return nil
	}
	return b[:d.n]
}

// Len returns the number of bytes received.
func (d Data) Len() int { return d.n }

// Mapped reports whether the bytes are pages of the socket's receive queue mapped into the
// connection's window (RecvMapped), rather than a copy in a receive buffer.
func (d Data) Mapped() bool { return d.mr != nil && d.mr.mapped }

// Release gives the buffer back (to the queue's receive ring, or the mapped window). A second
// Release returns memreg.ErrStale.
func (d Data) Release() error {
	if d.mr != nil {
		return d.mr.release()
	}
	return d.buf.Release()
}

// ConnStats are one connection's counters.
type ConnStats struct {
	BytesSentZC   uint64
	BytesZCCopied uint64
	BytesSentCopy uint64
	BytesRecv     uint64
	// BytesRecvMapped is the part of BytesRecv that arrived as mapped pages (RecvMapped).
	BytesRecvMapped uint64
	SendOps         uint64
	SendZCOps       uint64
	ZCSwitches      uint64
	ZCProbes        uint64
	ZeroCopyOn      bool // whether the next large send would use SEND_ZC
	NotifsPending   int
}

type sendReq struct {
	loan memreg.Loan
	n    int
}

type sendSlot struct {
	loan    memreg.Loan
	off, n  int
	refs    int   // notifications still to come
	zcSent  []int // bytes of each SEND_ZC whose notification has not arrived
	done    bool  // all bytes sent (or abandoned)
	lastZC  bool
	inChain bool // part of the chain in flight: freed at chain completion, not before
}

const (
	tagRecv = iota + 1
	tagSend
	tagSendZC
	tagConnect
	tagTimer
	tagIgnore
	tagPoll
)

const maxChain = 32

// Conn is a TCP connection served by one queue for its whole life.
type Conn struct {
	e       *Engine
	q       *equeue // nil on the plain backend
	alt     altConn // the connection on a non-io_uring backend (plain sockets, shim)
	fd      int
	id      uint32
	h       Handler
	network string
	laddr   *net.TCPAddr
	raddr   *net.TCPAddr

	// Producer side (any goroutine), guarded by wmu.
	wmu      sync.Mutex
	wpending []sendReq
	wspare   []sendReq
	stage    memreg.Buf
	stageN   int
	hasStage bool
	busy     bool // the loop has work of ours, or will look at wpending again
	queued   int  // bytes accepted by Send/Write and not yet sent
	werr     error
	space    chan struct{}

	scheduled atomic.Bool
	closeReq  atomic.Bool
	done      chan struct{}

	// Loop side.
	slots      []sendSlot
	freeSlots  []int32
	pending    []int32
	chain      []int32
	chainDone  int
	recvArmed  bool
	needArm    bool
	paused     bool
	eof        bool
	started    bool
	closing    bool
	closeErr   error
	fdClosed   bool
	finished   bool
	timerArmed bool
	deadline   time.Time
	timerTS    uring.Timespec
	notifOut   int
	sendFailed error

	shutdownWhenDrained bool
	wrShut              bool

	zcState   atomic.Int32
	zcStreak  int
	copySends int
	reprobe   int

	m *mappedRecv // the mapped receive window (RecvMapped), nil on the ring path

	steer *bpf.Steering // the listener's steering, to forget the flow on close
	flow  bpf.FlowKey

	connectDone chan error
	connectSA   *tcpglue.RawSockaddr

	ctr struct {
		sentZC, zcCopied, sentCopy, recv, sendOps, sendZCOps, switches, probes atomic.Uint64
		recvMapped                                                             atomic.Uint64
		notifs                                                                 atomic.Int64
	}
}

func newConn(e *Engine, q *equeue, fd int, network string) *Conn {
	c := &Conn{e: e, q: q, fd: fd, network: network, space: make(chan struct{}, 1), done: make(chan struct{}),
		reprobe: e.cfg.ZCReprobe}
	c.zcState.Store(zcFresh)
	return c
}

// LocalAddr returns the local address.
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.raddr }

// Queue returns the index of the queue that owns the connection (-1 on the plain backend,
// which has none).
func (c *Conn) Queue() int {
	if c.q != nil {
		return c.q.idx
	}
	if qi, ok := c.alt.(interface{ queueIndex() int }); ok {
		return qi.queueIndex()
	}
	return -1
}

// Done is closed once the connection is fully closed (OnClose has run).
func (c *Conn) Done() <-chan struct{} { return c.done }

// SetHandler replaces the handler (call it from a handler method, or before any event).
func (c *Conn) SetHandler(h Handler) { c.h = h }

// Stats returns the connection's counters.
func (c *Conn) Stats() ConnStats {
	return ConnStats{
		BytesSentZC: c.ctr.sentZC.Load(), BytesZCCopied: c.ctr.zcCopied.Load(), BytesSentCopy: c.ctr.sentCopy.Load(),
		BytesRecv: c.ctr.recv.Load(), BytesRecvMapped: c.ctr.recvMapped.Load(), SendOps: c.ctr.sendOps.Load(), SendZCOps: c.ctr.sendZCOps.Load(),
		ZCSwitches: c.ctr.switches.Load(), ZCProbes: c.ctr.probes.Load(), NotifsPending: int(c.ctr.notifs.Load()),
		ZeroCopyOn: c.e.cfg.SendPath == SendZeroCopy || (c.e.cfg.SendPath == SendAdaptive && c.q != nil && c.zcState.Load() != zcOff),
	}
}

// Socket runs fn with the connection's socket (for options: TCP_INFO, congestion control,
// pacing ...). The socket must not be closed or used for I/O by fn.
func (c *Conn) Socket(fn func(s *tcpglue.Socket) error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil && errors.Is(c.werr, ErrClosed) {
		return c.opErr("control", ErrClosed)
	}
	s, err := tcpglue.FromFD(c.fd)
	if err != nil {
		return c.opErr("control", err)
	}
	defer s.Disown()
	return fn(s)
}

func (c *Conn) opErr(op string, err error) error {
	if err == io.EOF {
		return err
	}
	var a net.Addr
	if c.raddr != nil {
		a = c.raddr
	}
	return &OpError{Op: op, Net: c.network, Addr: a, Err: err}
}

// Buffer returns an empty send buffer from the connection's queue region. Fill it and pass it
// to Send, or Release it. It fails with memreg.ErrExhausted when every buffer is in use.
func (c *Conn) Buffer() (memreg.Buf, error) {
	r := c.sendRegion()
	b, err := r.Get()
	if err != nil {
		return b, c.opErr("buffer", err)
	}
	return b, nil
}

// BufferWait is Buffer that waits (up to timeout, 0 = forever) for a buffer to come back.
func (c *Conn) BufferWait(timeout time.Duration) (memreg.Buf, error) {
	var t <-chan time.Time
	if timeout > 0 {
		tm := time.NewTimer(timeout)
		defer tm.Stop()
		t = tm.C
	}
	for {
		b, err := c.sendRegion().Get()
		if err == nil {
			return b, nil
		}
		if !errors.Is(err, memreg.ErrExhausted) {
			return b, c.opErr("buffer", err)
		}
		if c.onOwnLoop() {
			return b, c.opErr("buffer", ErrWouldBlock)
		}
		select {
		case <-c.spaceChan():
		case <-c.done:
			return memreg.Buf{}, c.opErr("buffer", ErrClosed)
		case <-t:
			return memreg.Buf{}, c.opErr("buffer", errTimeout)
		}
	}
}

func (c *Conn) sendRegion() *memreg.Region {
	if c.q != nil {
		return c.q.SendRegion()
	}
	return c.e.alt.sendRegion()
}

func (c *Conn) spaceChan() chan struct{} {
	if c.q != nil {
		return c.q.space
	}
	return c.e.alt.spaceChan()
}

// Send queues the first n bytes of b for sending and takes ownership of b: the handle is
// stale once Send returns, and the buffer returns to its region when the kernel is done
// with it (after the zero-copy notification when the send was zero-copy). On error the
// buffer is released (no leak), except memreg.ErrStale for a handle not owned by the caller.
func (c *Conn) Send(b memreg.Buf, n int) error {
	if n < 0 || n > len(b.Bytes()) {
		if b.Valid() {
			b.Release()
			return c.opErr("send", ErrTooLarge)
		}
		return c.opErr("send", memreg.ErrStale)
	}
	loan, err := b.Lend()
	if err != nil {
		return c.opErr("send", err)
	}
	if n == 0 {
		loan.Return()
		return nil
	}
	return c.queueLoan(loan, n)
}

// SendData forwards received bytes without copying them (a proxy's or echo server's fast
// path): the receive buffer is sent as is and returns to its queue's receive ring when the
// kernel is done with it. d is released by the call, whatever its result.
func (c *Conn) SendData(d Data) error {
	if d.n == 0 {
		d.Release()
		return nil
	}
	if d.mr != nil {
		// Mapped pages belong to the socket's receive queue: copy them out.
		_, err := c.Write(d.Bytes())
		d.Release()
		return err
	}
	loan, err := d.buf.Lend()
	if err != nil {
		return c.opErr("send", err)
	}
	return c.queueLoan(loan, d.n)
}

func (c *Conn) queueLoan(loan memreg.Loan, n int) error {
	c.wmu.Lock()
	if c.werr != nil {
		err := c.werr
		c.wmu.Unlock()
		loan.Return()
		return c.opErr("send", err)
	}
	c.flushStageLocked()
	c.wpending = append(c.wpending, sendReq{loan: loan, n: n})
	c.queued += n
	kick := c.kickLocked()
	c.wmu.Unlock()
	if kick {
		c.schedule()
	}
	return nil
}

// Write copies p into send buffers and queues them; it blocks while the connection has
// MaxQueuedBytes queued or no buffer is free. Small writes are coalesced while a send is in
// flight. It returns once p is queued, not once it is sent.
func (c *Conn) Write(p []byte) (int, error) { return c.write(p, nil) }

// write is Write bounded by the deadline dl returns (nil or zero: none); dl is re-read while
// waiting so that a deadline set meanwhile applies.
func (c *Conn) write(p []byte, dl func() time.Time) (int, error) {
	written := 0
	c.wmu.Lock()
	for len(p) > 0 {
		if c.werr != nil {
			err := c.werr
			c.wmu.Unlock()
			return written, c.opErr("write", err)
		}
		if c.queued >= c.e.cfg.MaxQueuedBytes {
			kick := c.kickLocked()
			c.wmu.Unlock()
			if kick {
				c.schedule()
			}
			if err := c.waitSpace(c.space, dl); err != nil {
				return written, c.opErr("write", err)
			}
			c.wmu.Lock()
			continue
		}
		if !c.hasStage {
			b, err := c.sendRegion().Get()
			if err != nil {
				kick := c.kickLocked()
				c.wmu.Unlock()
				if kick {
					c.schedule()
				}
				if !errors.Is(err, memreg.ErrExhausted) {
					return written, c.opErr("write", err)
				}
				if err := c.waitSpace(c.spaceChan(), dl); err != nil {
					return written, c.opErr("write", err)
				}
				c.wmu.Lock()
				continue
			}
			c.stage, c.stageN, c.hasStage = b, 0, true
		}
		buf := c.stage.Bytes()
		k := copy(buf[c.stageN:], p)
		c.stageN += k
		c.queued += k
		p = p[k:]
		written += k
		if c.stageN == len(buf) {
			c.flushStageLocked()
		}
	}
	if !c.busy {
		c.flushStageLocked()
	}
	kick := c.kickLocked()
	c.wmu.Unlock()
	if kick {
		c.schedule()
	}
	return written, nil
}

var errTimeout = &timeoutError{}

type timeoutError struct{}

func (*timeoutError) Error() string   { return "i/o timeout" }
func (*timeoutError) Timeout() bool   { return true }
func (*timeoutError) Temporary() bool { return true }
func (*timeoutError) Is(target error) bool {
	return target == errDeadline
}

var errDeadline = errors.New("deadline exceeded")

// ErrWouldBlock: a call made on the connection's own queue goroutine (from a Handler) would
// have to wait for that same goroutine. Handlers must not block; use Buffer/Send and retry
// later, or SendData.
var ErrWouldBlock = errors.New("would block the queue's own goroutine")

func (c *Conn) onOwnLoop() bool {
	if l, ok := c.alt.(interface{ onLoop() bool }); ok { // the shim backend's queue goroutine
		return l.onLoop()
	}
	return c.q != nil && c.q.OnLoop()
}

func (c *Conn) waitSpace(ch chan struct{}, dl func() time.Time) error {
	if c.onOwnLoop() {
		return ErrWouldBlock
	}
	var t <-chan time.Time
	var deadline time.Time
	if dl != nil {
		deadline = dl()
	}
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return errTimeout
		}
		tm := time.NewTimer(d)
		defer tm.Stop()
		t = tm.C
	}
	// Re-check periodically as well: the signal is shared by every writer of the queue.
	tick := time.NewTimer(10 * time.Millisecond)
	defer tick.Stop()
	select {
	case <-ch:
	case <-c.space:
	case <-c.done:
		return ErrClosed
	case <-t:
		return errTimeout
	case <-tick.C:
	}
	return nil
}

// flushStageLocked moves the staging buffer to the pending list (wmu held).
func (c *Conn) flushStageLocked() {
	if !c.hasStage {
		return
	}
	c.hasStage = false
	if c.stageN == 0 {
		c.stage.Release()
		return
	}
	loan, err := c.stage.Lend()
	if err != nil {
		return
	}
	c.wpending = append(c.wpending, sendReq{loan: loan, n: c.stageN})
}

// kickLocked decides whether the loop must be told about new work (wmu held).
func (c *Conn) kickLocked() bool {
	if c.busy || (len(c.wpending) == 0 && !c.hasStage) {
		return false
	}
	if len(c.wpending) == 0 {
		c.flushStageLocked()
	}
	c.busy = true
	return true
}

func (c *Conn) schedule() {
	if c.alt != nil {
		c.alt.kick()
		return
	}
	if c.scheduled.CompareAndSwap(false, true) {
		if c.q.Schedule(c) != nil {
			c.scheduled.Store(false)
		}
	}
}

// Close closes the connection: queued sends still go out (bounded by CloseTimeout), then the
// socket is closed; OnClose runs when everything is released (Done is closed then). A
// second Close returns an error wrapping net.ErrClosed.
func (c *Conn) Close() error {
	if !c.closeReq.CompareAndSwap(false, true) {
		return c.opErr("close", ErrClosed)
	}
	c.wmu.Lock()
	if c.werr == nil {
		c.werr = ErrClosed
	}
	c.flushStageLocked()
	c.busy = true
	c.wmu.Unlock()
	if c.alt != nil {
		c.alt.close(nil)
		return nil
	}
	c.scheduled.Store(true)
	if err := c.q.Schedule(c); err != nil {
		return c.opErr("close", err)
	}
	return nil
}

// CloseWrite half-closes the sending side once queued sends are out (SHUT_WR).
func (c *Conn) CloseWrite() error {
	c.wmu.Lock()
	if c.werr != nil {
		err := c.werr
		c.wmu.Unlock()
		return c.opErr("close", err)
	}
	c.werr = errWriteClosed
	c.flushStageLocked()
	kick := c.kickLocked()
	c.wmu.Unlock()
	if kick {
		c.schedule()
	}
	if c.alt != nil {
		c.alt.shutdownWrite()
		return nil
	}
	return c.q.Post(func() { c.shutdownWhenDrained = true; c.maybeShutdownWrite() })
}

var errWriteClosed = errors.New("write side closed")

// ---- loop side -------------------------------------------------------------------------

func (c *Conn) ud(tag uint32) uint64 { return loop.UserData(c.id, tag) }

func (c *Conn) armRecv() {
	if c.recvArmed || c.eof || c.closing || c.paused {
		return
	}
	sqe := c.q.GetSQE()
	if c.m != nil {
		sqe.PrepPollAdd(int32(c.fd), unix.POLLIN|unix.POLLRDHUP, true)
		sqe.UserData = c.ud(tagPoll)
	} else {
		sqe.PrepRecvMultishot(int32(c.fd), c.q.BufGroup(), 0, c.q.Bundles())
		sqe.UserData = c.ud(tagRecv)
	}
	c.recvArmed = true
	c.needArm = false
}

func (c *Conn) startConnect() {
	c.id = c.q.AddOwner(c)
	c.started = true
	sqe := c.q.GetSQE()
	sqe.PrepConnect(int32(c.fd), uintptr(c.connectSA.Pointer()), c.connectSA.Len())
	sqe.UserData = c.ud(tagConnect)
	c.q.Ring().Keep(c.connectSA)
}

var errCanceled = errors.New("canceled")

func (c *Conn) cancelConnect() {
	if c.connectDone == nil {
		return
	}
	sqe := c.q.GetSQE()
	sqe.PrepCancel(c.ud(tagConnect), 0)
	sqe.UserData = c.ud(tagIgnore)
}

func (c *Conn) onConnect(res int32) {
	ch := c.connectDone
	c.connectDone = nil
	c.connectSA = nil
	if res < 0 {
		err := error(unix.Errno(-res))
		if res == -int32(unix.ECANCELED) {
			err = errCanceled
		}
		c.q.RemoveOwner(c.id)
		closeFD(c.fd)
		c.e.removeConn(c)
		c.finished = true
		close(c.done)
		ch <- err
		return
	}
	c.fillAddrs()
	c.setupRecvPath()
	c.armRecv()
	ch <- nil
}

func (c *Conn) fillAddrs() {
	if !c.e.cfg.Nagle {
		// Like Go's net package: small writes go out at once.
		unix.SetsockoptInt(c.fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	}
	if sa, err := unix.Getsockname(c.fd); err == nil {
		c.laddr = tcpglue.TCPAddrFromSockaddr(sa)
	}
	if c.raddr == nil {
		if sa, err := unix.Getpeername(c.fd); err == nil {
			c.raddr = tcpglue.TCPAddrFromSockaddr(sa)
		}
	}
}

// OnCQE handles the connection's completions (loop only).
func (c *Conn) OnCQE(q *loop.Queue, cqe uring.CQE) {
	tag := uint32(cqe.UserData)
	switch tag & 0xff {
	case tagRecv:
		c.onRecv(cqe)
	case tagSend, tagSendZC:
		c.onSend(cqe, int32(tag>>8))
	case tagConnect:
		c.onConnect(cqe.Res)
		return
	case tagTimer:
		c.timerArmed = false
	case tagPoll:
		c.onPoll(cqe)
	}
	c.maybeFinishClose()
}

func (c *Conn) onRecv(cqe uring.CQE) {
	if !cqe.More() {
		c.recvArmed = false
	}
	switch res := cqe.Res; {
	case res > 0:
		c.q.Received(cqe, func(b memreg.Buf, n int) {
			c.ctr.recv.Add(uint64(n))
			c.q.ctr.recvRing.Add(uint64(n))
			if c.closing {
				b.Release()
				return
			}
			c.h.OnData(c, Data{buf: b, n: n})
		})
	case res == 0:
		if !c.eof {
			c.eof = true
			if !c.closing {
				c.h.OnEOF(c, io.EOF)
			}
		}
	case res == -int32(unix.ENOBUFS):
		c.q.NoteBufRingEmpty()
		c.q.ctr.bufEmpty.Add(1)
		if !c.recvArmed {
			c.needArm = true
			c.q.WaitBuffers(c)
		}
		return
	case res == -int32(unix.ECANCELED):
	default:
		err := unix.Errno(-res)
		if !c.eof {
			c.eof = true
			if !c.closing {
				c.h.OnEOF(c, c.opErr("read", err))
			}
		}
		c.beginClose(c.opErr("read", err))
	}
	if !c.recvArmed {
		c.armRecv()
	}
}

func (c *Conn) newSlot(r sendReq) int32 {
	var idx int32
	if n := len(c.freeSlots); n > 0 {
		idx = c.freeSlots[n-1]
		c.freeSlots = c.freeSlots[:n-1]
	} else {
		idx = int32(len(c.slots))
		c.slots = append(c.slots, sendSlot{})
	}
	s := &c.slots[idx]
	*s = sendSlot{loan: r.loan, n: r.n, zcSent: s.zcSent[:0]}
	return idx
}

func (c *Conn) freeSlot(idx int32) {
	s := &c.slots[idx]
	s.loan.Return()
	s.loan = memreg.Loan{}
	c.freeSlots = append(c.freeSlots, idx)
	select {
	case c.q.space <- struct{}{}:
	default:
	}
}

// Adaptive zero-copy states.
const (
	zcProbe int32 = iota // one zero-copy send is out; copy until its notification decides
	zcOn                 // the kernel really sends our pages: use SEND_ZC
	zcOff                // the kernel copied: copy, and probe again after c.reprobe sends
	zcFresh              // nothing tried yet
)

// useZC decides the path of one send of n bytes (loop only).
func (c *Conn) useZC(n int) bool {
	switch c.e.cfg.SendPath {
	case SendCopy:
		return false
	case SendZeroCopy:
		return true
	}
	if n < c.e.cfg.ZCThreshold {
		return false
	}
	switch c.zcState.Load() {
	case zcOn:
		return true
	case zcProbe:
		return false
	case zcFresh:
		c.zcState.Store(zcProbe)
		return true
	}
	c.copySends++
	if c.copySends >= c.reprobe {
		c.copySends = 0
		c.zcState.Store(zcProbe)
		c.ctr.probes.Add(1)
		c.q.ctr.zcProbes.Add(1)
		return true
	}
	return false
}

// onNotif applies the kernel's verdict on one zero-copy send to the adaptive state.
func (c *Conn) onNotif(copied bool, n int) {
	if copied {
		c.ctr.zcCopied.Add(uint64(n))
		c.q.ctr.zcCopied.Add(uint64(n))
	} else {
		c.ctr.sentZC.Add(uint64(n))
		c.q.ctr.sentZC.Add(uint64(n))
	}
	if c.e.cfg.SendPath != SendAdaptive {
		return
	}
	state := c.zcState.Load()
	if !copied {
		c.zcStreak = 0
		c.reprobe = c.e.cfg.ZCReprobe
		if state == zcProbe {
			c.zcState.Store(zcOn)
		}
		return
	}
	c.zcStreak++
	switch {
	case state == zcProbe:
		// The probe was copied: back to copying, probing less often each time.
		if c.ctr.switches.Load() > 0 {
			c.reprobe = min(c.reprobe*2, 64<<10)
		}
		c.zcState.Store(zcOff)
		c.ctr.switches.Add(1)
		c.q.ctr.zcSwitches.Add(1)
	case state == zcOn && c.zcStreak >= 2:
		c.zcState.Store(zcOff)
		c.copySends = 0
		c.ctr.switches.Add(1)
		c.q.ctr.zcSwitches.Add(1)
	}
}

func (c *Conn) onSend(cqe uring.CQE, idx int32) {
	if idx < 0 || int(idx) >= len(c.slots) {
		return
	}
	s := &c.slots[idx]
	if cqe.Notif() {
		s.refs--
		c.notifOut--
		c.ctr.notifs.Add(-1)
		c.q.NotifDone()
		n := 0
		if len(s.zcSent) > 0 {
			n = s.zcSent[0]
			s.zcSent = s.zcSent[1:]
		}
		c.onNotif(cqe.ZCCopied(), n)
		if s.refs == 0 && s.done && !s.inChain {
			c.freeSlot(idx)
			if len(c.chain) == 0 {
				// A buffer came back after the last batch completed: a Writable sender that
				// ran out of buffers hears about it here, not from a batch completion.
				c.writable()
				c.pump()
			}
		}
		return
	}
	c.chainDone++
	if cqe.More() {
		s.refs++
		c.notifOut++
		c.ctr.notifs.Add(1)
		c.q.NotifStarted()
	}
	res := int(cqe.Res)
	if res > 0 {
		s.off += res
		if s.lastZC {
			s.zcSent = append(s.zcSent, res)
		} else {
			c.ctr.sentCopy.Add(uint64(res))
			c.q.ctr.sentCopy.Add(uint64(res))
		}
		c.sent(res)
	} else if res < 0 && cqe.Res != -int32(unix.ECANCELED) && c.sendFailed == nil {
		c.sendFailed = c.opErr("write", unix.Errno(-cqe.Res))
	} else if res < 0 && s.lastZC && cqe.More() {
		s.zcSent = append(s.zcSent, 0)
	}
	if s.off >= s.n {
		s.done = true
	}
	if c.chainDone < len(c.chain) {
		return
	}
	// The chain is complete: requeue what was cut short, in order, ahead of newer sends.
	var again []int32
	for _, i := range c.chain {
		if !c.slots[i].done {
			again = append(again, i)
		}
	}
	for _, i := range c.chain {
		c.slots[i].inChain = false
		if c.slots[i].done && c.slots[i].refs == 0 {
			c.freeSlot(i)
		}
	}
	c.chain = c.chain[:0]
	if len(again) > 0 {
		c.pending = append(again, c.pending...)
	}
	if c.sendFailed != nil {
		c.dropPending()
		c.beginClose(c.sendFailed)
		return
	}
	c.writable()
	c.pump()
}

// Writable is an optional Handler extension: OnWritable runs on the connection's queue
// goroutine whenever a batch of sends completed and less than half of MaxQueuedBytes is
// queued, so a sender can produce its next buffers right there, with no cross-thread
// hand-off (start it with Conn.Post). It is the event-loop way to stream.
type Writable interface {
	OnWritable(c *Conn)
}

func (c *Conn) writable() {
	w, ok := c.h.(Writable)
	if !ok || c.closing || c.closeReq.Load() {
		return
	}
	c.wmu.Lock()
	low := c.queued < c.e.cfg.MaxQueuedBytes/2 && c.werr == nil
	c.wmu.Unlock()
	if low {
		w.OnWritable(c)
	}
}

// Post runs fn on the connection's queue goroutine (on the plain backend: its writer
// goroutine, which also runs OnWritable), for example to start a Writable sender.
func (c *Conn) Post(fn func()) error {
	if c.alt != nil {
		if p, ok := c.alt.(poster); ok {
			return p.post(fn)
		}
		go fn()
		return nil
	}
	return c.q.Post(fn)
}

// sent accounts bytes that left the queue and wakes blocked writers.
func (c *Conn) sent(n int) {
	c.wmu.Lock()
	c.queued -= n
	c.wmu.Unlock()
	select {
	case c.space <- struct{}{}:
	default:
	}
}

// Flush is called by the queue loop after Schedule (loop only).
func (c *Conn) Flush(q *loop.Queue) {
	c.scheduled.Store(false)
	if c.finished {
		return
	}
	if !c.started {
		return
	}
	if c.needArm {
		c.armRecv()
	}
	if c.closeReq.Load() && !c.closing {
		c.beginClose(nil)
		return
	}
	if len(c.chain) == 0 {
		c.pump()
	}
	c.maybeFinishClose()
}

// takeWork moves producer requests into send slots (loop only). It returns false, clearing
// busy, when there is nothing.
func (c *Conn) takeWork() bool {
	c.wmu.Lock()
	if len(c.wpending) == 0 {
		c.flushStageLocked()
	}
	reqs := c.wpending
	if len(reqs) == 0 {
		c.busy = false
		c.wmu.Unlock()
		return false
	}
	c.wpending = c.wspare[:0]
	c.wmu.Unlock()
	for _, r := range reqs {
		c.pending = append(c.pending, c.newSlot(r))
	}
	c.wmu.Lock()
	c.wspare = reqs[:0]
	c.wmu.Unlock()
	return true
}

// pump starts a send chain when none is in flight (loop only).
func (c *Conn) pump() {
	if len(c.chain) > 0 || c.fdClosed {
		return
	}
	if len(c.pending) == 0 && !c.takeWork() {
		c.maybeShutdownWrite()
		return
	}
	ring := c.q.Ring()
	if ring.SQSpace() < 4 {
		ring.Submit()
	}
	n := min(len(c.pending), maxChain, max(int(ring.SQSpace())-2, 1))
	region := c.q.SendRegion()
	for i := 0; i < n; i++ {
		idx := c.pending[i]
		s := &c.slots[idx]
		left := s.n - s.off
		zc := c.useZC(left)
		addr := s.loan.Addr() + uintptr(s.off)
		sqe := c.q.GetSQE()
		flags := uint32(unix.MSG_WAITALL | unix.MSG_NOSIGNAL)
		if zc {
			if s.loan.Region() == region {
				sqe.PrepSendZCFixed(int32(c.fd), addr, uint32(left), flags, uring.SendZCReportUsage, 0)
			} else {
				sqe.PrepSendZC(int32(c.fd), addr, uint32(left), flags, uring.SendZCReportUsage)
			}
			sqe.UserData = c.ud(tagSendZC | uint32(idx)<<8)
			c.ctr.sendZCOps.Add(1)
			c.q.ctr.sendZCOps.Add(1)
		} else {
			sqe.PrepSend(int32(c.fd), addr, uint32(left), flags)
			sqe.UserData = c.ud(tagSend | uint32(idx)<<8)
			c.ctr.sendOps.Add(1)
			c.q.ctr.sendOps.Add(1)
		}
		s.lastZC = zc
		s.inChain = true
		if i < n-1 {
			sqe.Flags |= uring.SQEIOLink
		}
	}
	c.chain = append(c.chain[:0], c.pending[:n]...)
	c.pending = append(c.pending[:0], c.pending[n:]...)
	c.chainDone = 0
}

// dropPending abandons every send not yet in flight (loop only).
func (c *Conn) dropPending() {
	for _, i := range c.pending {
		s := &c.slots[i]
		c.sent(s.n - s.off)
		s.done = true
		if s.refs == 0 {
			c.freeSlot(i)
		}
	}
	c.pending = c.pending[:0]
	c.dropProducer()
}

// dropProducer abandons what Send/Write queued and no backend has taken yet.
func (c *Conn) dropProducer() {
	c.wmu.Lock()
	reqs := c.wpending
	c.wpending = nil
	if c.hasStage {
		c.hasStage = false
		c.queued -= c.stageN
		c.stage.Release()
	}
	for _, r := range reqs {
		c.queued -= r.n
	}
	c.wmu.Unlock()
	for _, r := range reqs {
		r.loan.Return()
	}
}

func (c *Conn) maybeShutdownWrite() {
	if c.shutdownWhenDrained && !c.wrShut && len(c.chain) == 0 && len(c.pending) == 0 && !c.fdClosed {
		c.wmu.Lock()
		empty := len(c.wpending) == 0 && !c.hasStage
		c.wmu.Unlock()
		if empty {
			c.wrShut = true
			unix.Shutdown(c.fd, unix.SHUT_WR)
		}
	}
}

// beginClose starts closing (loop only): err == nil is a graceful local Close.
func (c *Conn) beginClose(err error) {
	if c.closing {
		return
	}
	c.closing = true
	c.closeErr = err
	c.deadline = time.Now().Add(c.e.cfg.CloseTimeout)
	c.wmu.Lock()
	if c.werr == nil || (err != nil && c.werr == ErrClosed) {
		c.werr = ErrClosed
		if err != nil {
			c.werr = err
		}
	}
	c.wmu.Unlock()
	if err != nil {
		c.dropPending()
		unix.Shutdown(c.fd, unix.SHUT_RDWR)
	}
	if len(c.chain) == 0 {
		c.pump()
	}
	c.maybeFinishClose()
}

func (c *Conn) armTimer(d time.Duration) {
	if c.timerArmed {
		return
	}
	c.timerTS = uring.Timespec{Sec: int64(d / time.Second), Nsec: int64(d % time.Second)}
	sqe := c.q.GetSQE()
	sqe.PrepTimeout(c.q.Ring(), &c.timerTS, 0, 0)
	sqe.UserData = c.ud(tagTimer)
	c.timerArmed = true
}

// maybeFinishClose advances a closing connection (loop only).
func (c *Conn) maybeFinishClose() {
	if !c.closing || c.finished {
		return
	}
	if !c.fdClosed {
		c.wmu.Lock()
		producer := len(c.wpending) > 0 || c.hasStage
		c.wmu.Unlock()
		sending := len(c.chain) > 0 || len(c.pending) > 0 || producer
		if sending && time.Now().Before(c.deadline) {
			if len(c.chain) == 0 {
				c.pump()
			}
			c.armTimer(50 * time.Millisecond)
			return
		}
		if sending {
			// Close timeout: the peer is not reading. Abort what is left.
			c.dropPending()
			unix.Shutdown(c.fd, unix.SHUT_RDWR)
		}
		if c.recvArmed {
			sqe := c.q.GetSQE()
			sqe.PrepCancel(c.ud(c.recvTag()), 0)
			sqe.UserData = c.ud(tagIgnore)
		}
		// io_uring holds its own file references for requests still in flight.
		closeFD(c.fd)
		c.fdClosed = true
	}
	if c.recvArmed || len(c.chain) > 0 || c.timerArmed {
		return
	}
	if c.m != nil && !c.m.closeWindow(c, time.Now().Before(c.deadline.Add(c.e.cfg.CloseTimeout))) {
		c.armTimer(20 * time.Millisecond)
		return
	}
	if c.notifOut > 0 && time.Now().Before(c.deadline.Add(c.e.cfg.CloseTimeout)) {
		c.armTimer(20 * time.Millisecond)
		return
	}
	if c.notifOut > 0 {
		// Notifications that never came within twice CloseTimeout: keep the owner registered
		// (the kernel may still post them) but stop waiting; buffers stay lent until then.
		return
	}
	c.finished = true
	for i := range c.slots {
		if c.slots[i].loan.Region() != nil {
			c.slots[i].loan.Return()
			c.slots[i].loan = memreg.Loan{}
		}
	}
	c.q.RemoveOwner(c.id)
	if c.steer != nil {
		c.steer.Forget(c.flow) // no stale flow entries after churn
	}
	c.e.removeConn(c)
	c.h.OnClose(c, c.closeErr)
	close(c.done)
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

// SetReceivePaused stops (true) or restarts (false) receiving: while paused no OnData
// arrives and the kernel's receive window fills, pushing back on the peer.
func (c *Conn) SetReceivePaused(on bool) error {
	if c.alt != nil {
		c.alt.setPaused(on)
		return nil
	}
	if c.q.OnLoop() {
		c.setPausedLoop(on)
		return nil
	}
	return c.q.Post(func() { c.setPausedLoop(on) })
}

func (c *Conn) setPaused(on bool) { c.SetReceivePaused(on) }

func (c *Conn) setPausedLoop(on bool) {
	if c.finished || c.paused == on {
		return
	}
	c.paused = on
	if on {
		if c.recvArmed {
			sqe := c.q.GetSQE()
			sqe.PrepCancel(c.ud(c.recvTag()), 0)
			sqe.UserData = c.ud(tagIgnore)
		}
		return
	}
	c.armRecv()
	c.mappedResume()
}
