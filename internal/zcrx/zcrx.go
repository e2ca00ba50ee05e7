package zcrx

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
)

var (
	// ErrNotSupported is the one sentinel every zcnet package shares.
	ErrNotSupported = errs.ErrNotSupported
	// ErrClosed: the receiver (or its queue) is closed.
	ErrClosed = fmt.Errorf("zcrx: receiver closed: %w", errs.ErrClosed)
	// ErrCanceled ends a stream stopped with Stream.Cancel.
	ErrCanceled = errors.New("zcrx: stream canceled")
	// ErrStale: the Buf was released already.
	ErrStale = errors.New("zcrx: stale buffer handle")
	// ErrLost ends a stream that received bytes it could not deliver (a completion outside
	// the area, or more buffers held by the application than the receiver tracks): the
	// stream stops there, so the bytes its handler saw are a prefix of what was sent and
	// never a stream with a gap in it.
	ErrLost = errors.New("zcrx: received bytes could not be delivered")
)

// Error is a failed zcrx operation.
type Error struct {
	Op  string // "register", "recv", "share", ...
	Err error
}

func (e *Error) Error() string { return "zcrx: " + e.Op + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Config describes a Receiver.
type Config struct {
	// IfIndex and RxQueue name the NIC hardware RX queue to bind (hwq's binding for a flow).
	IfIndex, RxQueue int
	// NoDev asks for a device-less instance (Linux 7.1+): no NIC, RECV_ZC on any TCP socket,
	// every byte copied into the area by the kernel. IfIndex and RxQueue must be 0.
	NoDev bool
	// AreaSize is the receive area in bytes (default 2 MiB), rounded up to whole pages. It is
	// the receive window of every stream of the receiver together.
	AreaSize int
	// HugePages backs the area with 2 MiB pages where reserved (transparent huge pages
	// otherwise; memreg's Info says which).
	HugePages bool
	// Dmabuf backs the area with a dmabuf (memreg Options.Dmabuf) registered as such
	// (IORING_ZCRX_AREA_DMABUF): only a NIC that can map it accepts it.
	Dmabuf bool
	// RqEntries is the refill ring size (default: one entry per area page, rounded up to a
	// power of two, at most 32768).
	RqEntries int
}

// Handler receives a stream's data on the queue's goroutine. It must not block.
type Handler interface {
	// Data hands over one completion: b is a view of the area, valid until buf.Release
	// (which may happen later, on any goroutine).
	Data(s *Stream, b []byte, buf Buf)
	// End is called once when the stream ends: io.EOF at the peer's FIN, ErrCanceled after
	// Cancel, ErrClosed when the receiver or queue closed, or the receive error.
	End(s *Stream, err error)
}

// Stats are a receiver's counters, safe to read from any goroutine.
type Stats struct {
	NoDev        bool   // device-less instance: every byte was copied by the kernel
	Bytes        uint64 // bytes delivered to handlers
	CQEs         uint64 // data completions delivered
	Refills      uint64 // buffers returned through the refill ring
	Flushes      uint64 // ZCRX_CTRL_FLUSH_RQ calls
	ENOSPCRearms uint64 // requests ended by a full completion queue and re-armed
	NoMoreRearms uint64 // requests ended without F_MORE (not EOF, not an error) and re-armed
	AreaStalls   uint64 // requests ended by an exhausted area (ENOMEM), re-armed after releases
	Held         int64  // buffers the application holds now
	Streams      int64  // armed streams
	// KernelCopyBytes is the kernel's own count of bytes it copied into the area (Linux 7.2+;
	// copies of a socket's linear data are not in it). KernelStats says whether it is known.
	KernelCopyBytes uint64
	KernelStats     bool
	Stray           uint64 // completions for unknown streams or outside the area (a bug if non-zero)
	Lost            uint64 // streams ended with ErrLost
}

// area is the registered memory, shared by a receiver and those it was shared with; the
// last one to let go closes it.
type area struct {
	region *memreg.Region
	mem    []byte
	refs   atomic.Int32
	// out counts the area's buffers on the application's side, all sharers together: held
	// by it, or released and not yet back in the kernel's free list.
	out atomic.Int64

	mu    sync.Mutex
	recvs []*Receiver // sharers, to wake their waiting streams on releases
}

func (a *area) put(r *Receiver) {
	a.mu.Lock()
	for i, x := range a.recvs {
		if x == r {
			a.recvs = append(a.recvs[:i], a.recvs[i+1:]...)
			break
		}
	}
	a.mu.Unlock()
	if a.refs.Add(-1) == 0 {
		a.region.Close()
	}
}

// wake re-arms the waiting streams of the other sharers after from released buffers.
func (a *area) wake(from *Receiver) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.recvs {
		if r != from && r.nwaiting.Load() > 0 {
			r.wake.Store(true)
			r.schedule()
		}
	}
}

var openReceivers atomic.Int64

// OpenReceivers returns how many receivers still hold their area (tests use it for leaks).
func OpenReceivers() int64 { return openReceivers.Load() }

// Receiver is one zcrx instance on one queue.
type Receiver struct {
	q     *loop.Queue
	u     *loop.URing
	z     *uring.Zcrx
	area  *area
	mem   []byte
	nodev bool

	// loop only
	streams  []*Stream
	freeTags []uint32
	pending  []uring.ZcrxRqe
	waiting  []*Stream
	closed   bool
	timer    *loop.Timer // back-off re-arm of waiting streams
	slabs    slab

	// any goroutine
	rel       atomic.Uint64 // lock-free list of released slots (index+1; 0 = empty)
	scheduled atomic.Bool
	held      atomic.Int64
	closing   atomic.Bool // the queue is gone: releases only count down
	freed     atomic.Bool
	nstreams  atomic.Int64
	nwaiting  atomic.Int32 // streams waiting for area buffers
	wake      atomic.Bool  // another sharer released buffers: re-arm the waiting streams
	closeCall atomic.Bool

	bytes, cqes, refills, flushes, enospc, nomore, stalls, stray, lost atomic.Uint64
	flushErr                                                           atomic.Pointer[error]
}

// onLoop runs fn on q's goroutine (directly when already there).
func onLoop(q *loop.Queue, fn func() error) error {
	if q.OnLoop() {
		return fn()
	}
	err := q.Do(fn)
	if errors.Is(err, loop.ErrClosed) {
		return ErrClosed
	}
	return err
}

// New registers a receiver on u's ring (from any goroutine). The ring must have been set up
// with loop.URingConfig.CQE32 (and, as every zcnet ring where the kernel has it,
// SINGLE_ISSUER|DEFER_TASKRUN).
func New(u *loop.URing, cfg Config) (*Receiver, error) {
	var r *Receiver
	err := onLoop(u.Queue(), func() error {
		var err error
		r, err = newOnLoop(u, cfg)
		return err
	})
	var ze *Error
	if err != nil && !errors.As(err, &ze) {
		err = &Error{Op: "register", Err: err}
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

func newOnLoop(u *loop.URing, cfg Config) (*Receiver, error) {
	if cfg.NoDev && (cfg.IfIndex != 0 || cfg.RxQueue != 0) {
		return nil, fmt.Errorf("a device-less receiver takes no interface or queue: %w", unix.EINVAL)
	}
	if cfg.IfIndex < 0 || cfg.RxQueue < 0 || cfg.AreaSize < 0 || cfg.RqEntries < 0 {
		return nil, fmt.Errorf("negative interface, queue, area size or refill ring size: %w", unix.EINVAL)
	}
	ring := u.Ring()
	if !ring.BigCQE() {
		return nil, errNoCQE32
	}
	page := os.Getpagesize()
	size := cfg.AreaSize
	if size == 0 {
		size = 2 << 20
	}
	pages := (size + page - 1) / page
	if pages > 1<<24 {
		return nil, fmt.Errorf("area of %d bytes is too large: %w", size, unix.EINVAL)
	}
	rq := cfg.RqEntries
	if rq == 0 {
		rq = 1
		for rq < pages && rq < 32768 {
			rq <<= 1
		}
	}
	region, err := memreg.New(memreg.Options{BufSize: page, Count: pages, HugePages: cfg.HugePages, Dmabuf: cfg.Dmabuf})
	if err != nil {
		return nil, err
	}
	mem := region.Memory()
	ua := uring.UserArea(mem)
	if cfg.Dmabuf {
		ua = uring.DmabufArea(region.DmabufFd(), uint64(len(mem)))
	}
	zc := uring.ZcrxConfig{IfIndex: uint32(cfg.IfIndex), RxQueue: uint32(cfg.RxQueue), NoDev: cfg.NoDev,
		RqEntries: uint32(rq), Area: ua}
	if qz, err := uring.QueryZcrx(); err == nil && qz.Features&uring.ZcrxFeatureEvent != 0 {
		zc.Stats = true
	}
	z, err := ring.RegisterZcrx(zc)
	if err != nil {
		region.Close()
		var ue *uring.ZcrxError
		if errors.As(err, &ue) {
			where := fmt.Sprintf("ifindex %d rx queue %d", cfg.IfIndex, cfg.RxQueue)
			if cfg.NoDev {
				where = "device-less"
			}
			return nil, &Error{Op: "register (" + where + ")", Err: ue.Err}
		}
		return nil, err
	}
	a := &area{region: region, mem: mem}
	a.refs.Store(1)
	return newReceiver(u, z, a, cfg.NoDev), nil
}

var errNoCQE32 = fmt.Errorf("the queue's ring posts 16-byte completions; zcrx needs loop.URingConfig.CQE32: %w", unix.EINVAL)

func newReceiver(u *loop.URing, z *uring.Zcrx, a *area, nodev bool) *Receiver {
	r := &Receiver{q: u.Queue(), u: u, z: z, area: a, mem: a.mem, nodev: nodev}
	a.mu.Lock()
	a.recvs = append(a.recvs, r)
	a.mu.Unlock()
	u.OnClose(r.queueClosed)
	openReceivers.Add(1)
	return r
}

// NoDev reports whether the receiver is device-less.
func (r *Receiver) NoDev() bool { return r.nodev }

// AreaSize returns the area's size in bytes.
func (r *Receiver) AreaSize() int { return len(r.mem) }

// AreaInfo says how the area is backed (huge pages, dmabuf).
func (r *Receiver) AreaInfo() memreg.Info { return r.area.region.Info() }

// Queue returns the queue the receiver lives on.
func (r *Receiver) Queue() *loop.Queue { return r.q }

// Buffers returns the number of buffers of the area (pages) and their size.
func (r *Receiver) Buffers() (n, size int) {
	page := os.Getpagesize()
	return len(r.mem) / page, page
}

// Stats returns the receiver's counters.
func (r *Receiver) Stats() Stats {
	s := Stats{NoDev: r.nodev, Bytes: r.bytes.Load(), CQEs: r.cqes.Load(), Refills: r.refills.Load(),
		Flushes: r.flushes.Load(), ENOSPCRearms: r.enospc.Load(), NoMoreRearms: r.nomore.Load(),
		AreaStalls: r.stalls.Load(), Held: r.held.Load(), Streams: r.nstreams.Load(), Stray: r.stray.Load(), Lost: r.lost.Load()}
	if !r.closing.Load() {
		// The refill region holds the kernel's counters until the queue closes.
		if ks, ok := r.z.Stats(); ok {
			s.KernelCopyBytes, s.KernelStats = ks.CopyBytes, true
		}
	}
	return s
}

// FlushError returns the last refill flush failure, if any (the buffers it carried stay
// queued and are retried with the next release).
func (r *Receiver) FlushError() error {
	if p := r.flushErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Stream is one socket receiving through a Receiver.
type Stream struct {
	r      *Receiver
	tag    uint32
	ud     uint64 // the stream's operation (loop.Queue.NewOp), for its whole life
	fd     int32
	h      Handler
	armed  bool
	cancel bool
	ended  bool
	dry    int // consecutive ENOMEM ends with no buffer on the application's side
	bytes  uint64
	err    error // set when bytes were lost: nothing more is delivered, End gets it
}

// Fd returns the stream's socket.
func (s *Stream) Fd() int { return int(s.fd) }

// Bytes returns how many bytes the stream delivered.
func (s *Stream) Bytes() uint64 { return s.bytes }

// Receiver returns the stream's receiver.
func (s *Stream) Receiver() *Receiver { return s.r }

// Recv starts receiving fd (a connected TCP socket; the caller keeps owning it) into the area
// (loop only). h gets every completion and, once, the end.
func (r *Receiver) Recv(fd int, h Handler) (*Stream, error) {
	if r.closed || r.closing.Load() {
		return nil, &Error{Op: "recv", Err: ErrClosed}
	}
	if fd < 0 || h == nil {
		return nil, &Error{Op: "recv", Err: fmt.Errorf("fd %d, handler %v: %w", fd, h, unix.EINVAL)}
	}
	s := &Stream{r: r, fd: int32(fd), h: h}
	if n := len(r.freeTags); n > 0 {
		s.tag = r.freeTags[n-1]
		r.freeTags = r.freeTags[:n-1]
		r.streams[s.tag] = s
	} else {
		s.tag = uint32(len(r.streams))
		r.streams = append(r.streams, s)
	}
	s.ud = r.q.NewOp(r, s.tag)
	r.nstreams.Add(1)
	r.arm(s)
	return s, nil
}

func (r *Receiver) arm(s *Stream) {
	sqe := r.u.GetSQE()
	sqe.PrepRecvZC(s.fd, r.z.ID(), 0)
	sqe.UserData = s.ud
	s.armed = true
}

// Cancel stops the stream (loop only): its handler's End follows with ErrCanceled once the
// kernel confirmed. Buffers already handed over stay valid until released.
func (s *Stream) Cancel() {
	if s.ended || s.cancel {
		return
	}
	s.cancel = true
	r := s.r
	if !s.armed {
		r.removeWaiting(s)
		r.end(s, ErrCanceled)
		return
	}
	r.u.CancelOp(s.ud) // the cancel's own completion goes nowhere
}

func (r *Receiver) removeWaiting(s *Stream) {
	for i, w := range r.waiting {
		if w == s {
			r.waiting = append(r.waiting[:i], r.waiting[i+1:]...)
			r.nwaiting.Store(int32(len(r.waiting)))
			return
		}
	}
}

func (r *Receiver) end(s *Stream, err error) {
	if s.ended {
		return
	}
	s.ended, s.armed = true, false
	// Nothing arrives for the operation any more: it ended without F_MORE, was never
	// re-armed, or the ring is gone.
	r.q.FreeOp(s.ud)
	r.streams[s.tag] = nil
	r.freeTags = append(r.freeTags, s.tag)
	r.nstreams.Add(-1)
	s.h.End(s, err)
}

// OnEvent handles a RECV_ZC completion (the queue calls it; loop only). ev.Tag is the
// stream's index, ev.Big[0] the offset of the data in the area.
func (r *Receiver) OnEvent(q *loop.Queue, ev loop.Event) {
	tag := ev.Tag
	if int(tag) >= len(r.streams) || r.streams[tag] == nil || r.streams[tag].ud != ev.UD {
		r.stray.Add(1)
		if ev.Res > 0 {
			// A buffer nobody will release: give it back at once.
			r.giveBack(ev.Big[0], uint32(ev.Res))
		}
		return
	}
	s := r.streams[tag]
	if ev.Res > 0 {
		r.deliver(s, ev)
	}
	if ev.Flags&uring.CQEFMore != 0 {
		return
	}
	s.armed = false
	res := ev.Res
	switch {
	case s.err != nil:
		r.end(s, s.err)
	case s.cancel || r.closed:
		if r.closed && !s.cancel {
			r.end(s, ErrClosed)
		} else {
			r.end(s, ErrCanceled)
		}
	case res > 0:
		r.nomore.Add(1)
		r.arm(s)
	case res == 0:
		r.end(s, io.EOF)
	case res == -int32(unix.ENOSPC):
		r.enospc.Add(1)
		r.arm(s)
	case res == -int32(unix.ENOMEM):
		r.stalls.Add(1)
		// Wait for the next release of any sharer of the area. Publish the wait before
		// looking at the count; a sharer decrements the count before looking for waiters,
		// so one of the two sees the other.
		r.waiting = append(r.waiting, s)
		r.nwaiting.Store(int32(len(r.waiting)))
		if r.area.out.Load() > 0 {
			return
		}
		// Nothing on the application's side: the buffers are in flight to another sharer
		// (in its completion queue), or, with a NIC, in its page pool. Try again at once,
		// then after a growing pause (1 ms to 128 ms) rather than spinning.
		s.dry++
		if s.dry <= 2 {
			r.removeWaiting(s)
			r.arm(s)
			return
		}
		r.armTimer(time.Millisecond << min(s.dry-3, 7))
	default:
		r.end(s, &Error{Op: "recv", Err: os.NewSyscallError("io_uring RECV_ZC", unix.Errno(-res))})
	}
}

func (r *Receiver) deliver(s *Stream, ev loop.Event) {
	off := ev.Big[0] // struct io_uring_zcrx_cqe's off
	o, n := off&^uring.ZcrxAreaMask, uint64(ev.Res)
	if s.err != nil {
		r.giveBack(off, uint32(ev.Res)) // after a loss nothing more is delivered
		return
	}
	if off&uring.ZcrxAreaMask != r.z.AreaToken() || o+n > uint64(len(r.mem)) {
		// Not in our area: nothing we can show. Count it, hand it back, and end the
		// stream: what follows would reach the handler with a gap before it.
		r.stray.Add(1)
		r.giveBack(off, uint32(ev.Res))
		r.lose(s, fmt.Errorf("%w: a completion of %d bytes at offset %#x is outside the area", ErrLost, n, off))
		return
	}
	idx, sl := r.slabs.get()
	if sl == nil {
		r.stray.Add(1)
		r.giveBack(off, uint32(ev.Res))
		r.lose(s, fmt.Errorf("%w: the application holds every buffer slot", ErrLost))
		return
	}
	sl.off, sl.n = off, uint32(ev.Res)
	gen := sl.gen.Add(1) // odd: held by the application
	r.held.Add(1)
	r.area.out.Add(1)
	r.bytes.Add(n)
	r.cqes.Add(1)
	s.bytes += n
	s.dry = 0
	s.h.Data(s, r.mem[o:o+n:o+n], Buf{r: r, idx: idx, gen: gen})
}

// lose ends s with err (ErrLost) once the kernel confirms: its receive is cancelled and
// nothing more is delivered.
func (r *Receiver) lose(s *Stream, err error) {
	r.lost.Add(1)
	s.err = &Error{Op: "recv", Err: err}
	if !s.cancel {
		s.cancel = true
		r.u.CancelOp(s.ud)
	}
}

// Flush runs on the queue's goroutine before it submits: it takes the released buffers,
// writes them to the refill ring and re-arms streams that waited for buffers.
func (r *Receiver) Flush(q *loop.Queue) {
	r.scheduled.Store(false)
	for i := r.rel.Swap(0); i != 0; {
		sl := r.slabs.at(uint32(i - 1))
		next := sl.next
		r.pending = append(r.pending, uring.ZcrxRqe{Off: sl.off, Len: sl.n})
		r.slabs.put(uint32(i - 1))
		i = next
	}
	back := r.refill()
	if back {
		r.area.wake(r)
	}
	if back || r.wake.Swap(false) {
		r.rearmWaiting()
	}
}

func (r *Receiver) rearmWaiting() {
	if len(r.waiting) == 0 {
		return
	}
	w := r.waiting
	r.waiting = nil
	r.nwaiting.Store(0)
	for _, s := range w {
		if !s.ended && !s.armed {
			r.arm(s)
		}
	}
}

// armTimer re-arms the waiting streams after d, unless a release does it first (loop only).
func (r *Receiver) armTimer(d time.Duration) {
	if r.timer.Pending() {
		return
	}
	r.timer = r.q.After(d, func() {
		if !r.closed && !r.closing.Load() {
			r.rearmWaiting()
		}
	})
}

// giveBack queues a buffer that goes straight back to the kernel (loop only).
func (r *Receiver) giveBack(off uint64, n uint32) {
	r.area.out.Add(1)
	r.pending = append(r.pending, uring.ZcrxRqe{Off: off, Len: n})
	r.q.MarkDirty(r)
}

// refill writes the pending buffers to the refill ring (loop only) and reports whether any
// went back to the kernel.
func (r *Receiver) refill() bool {
	back := false
	for len(r.pending) > 0 && !r.closing.Load() {
		k := r.z.Refill(r.pending)
		r.refills.Add(uint64(k))
		r.pending = r.pending[:copy(r.pending, r.pending[k:])]
		if !r.nodev && k > 0 && len(r.pending) == 0 {
			// A NIC's page pool pulls them when it needs buffers.
			r.area.out.Add(-int64(k))
			return true
		}
		// Device-less: nothing pulls the refill ring, FLUSH_RQ makes the kernel take it
		// now. A full ring on a device: the same, so the rest fits.
		if err := r.z.FlushRQ(); err != nil {
			r.flushErr.Store(&err)
			return back
		}
		r.flushes.Add(1)
		if k > 0 {
			r.area.out.Add(-int64(k))
			back = true
		} else if r.z.RQPending() > 0 {
			return back // the kernel did not consume: retry with the next release
		}
	}
	return back
}

// queueClosed runs on the queue's goroutine after its ring closed: the kernel dropped the
// instance, nothing arrives any more.
func (r *Receiver) queueClosed() {
	r.closing.Store(true)
	r.timer.Stop()
	for _, s := range r.streams {
		if s != nil && !s.ended {
			r.end(s, ErrClosed)
		}
	}
	r.waiting = nil
	r.nwaiting.Store(0)
	r.pending = nil
	r.z.Close()
	r.maybeFree()
}

func (r *Receiver) maybeFree() {
	if r.closing.Load() && r.held.Load() == 0 && r.freed.CompareAndSwap(false, true) {
		r.area.put(r)
		openReceivers.Add(-1)
	}
}

// Close stops every stream (their handlers get ErrClosed) and refuses new ones; from any
// goroutine. The kernel keeps the instance until the queue closes; the area is unmapped
// after that and after the last release. A second Close returns ErrClosed.
func (r *Receiver) Close() error {
	if !r.closeCall.CompareAndSwap(false, true) {
		return ErrClosed
	}
	err := onLoop(r.q, func() error {
		r.closed = true
		for _, s := range r.streams {
			if s == nil || s.ended {
				continue
			}
			if s.armed {
				r.u.CancelOp(s.ud)
			} else {
				r.removeWaiting(s)
				r.end(s, ErrClosed)
			}
		}
		return nil
	})
	if errors.Is(err, ErrClosed) {
		return nil // the queue closed first and ended everything
	}
	return err
}

// Share makes the receiver's instance usable on another queue's ring (set up with CQE32):
// the instance is exported from r's ring and imported into u2's (Linux 7.0+), and both
// receive into the same area. The new receiver has its own streams and counters.
func (r *Receiver) Share(u2 *loop.URing) (*Receiver, error) {
	var fd int
	err := onLoop(r.q, func() error {
		if r.closed || r.closing.Load() {
			return ErrClosed
		}
		var err error
		fd, err = r.z.Export()
		if err == nil {
			r.area.refs.Add(1)
		}
		return err
	})
	if err != nil {
		return nil, &Error{Op: "share", Err: err}
	}
	defer unix.Close(fd)
	var r2 *Receiver
	err = onLoop(u2.Queue(), func() error {
		if !u2.BigCQE() {
			return errNoCQE32
		}
		z2, err := u2.Ring().ImportZcrx(fd, r.z)
		if err != nil {
			return err
		}
		r2 = newReceiver(u2, z2, r.area, r.nodev)
		return nil
	})
	if err != nil {
		r.area.put(nil)
		return nil, &Error{Op: "share", Err: err}
	}
	return r2, nil
}
