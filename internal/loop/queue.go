package loop

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
)

// ErrClosed is returned for work posted to a closed queue.
var ErrClosed = fmt.Errorf("loop: queue closed: %w", os.ErrClosed)

// Config describes one queue. Zero fields take the defaults noted.
type Config struct {
	ID          int
	Entries     uint32 // SQ entries (default 512; the CQ is twice as large)
	CPU         int    // pin the queue's thread to this CPU; -1 (or NoPin) leaves it free
	NoPin       bool
	SendBufSize int // bytes per send buffer (default 64 KiB)
	SendBufs    int // send buffers (default 256)
	RecvBufSize int // bytes per receive buffer (default 32 KiB)
	RecvBufs    int // receive buffers, a power of two (default 256)
	NoBundles   bool
	// Flags overrides the setup flags (default: SINGLE_ISSUER|DEFER_TASKRUN|TASKRUN_FLAG where
	// supported, else COOP_TASKRUN|TASKRUN_FLAG).
	Flags uint32
	// CloseWait bounds how long Close waits for zero-copy notifications (default 2 s).
	CloseWait time.Duration
}

func (c *Config) defaults() {
	if c.Entries == 0 {
		c.Entries = 512
	}
	if c.SendBufSize == 0 {
		c.SendBufSize = 64 << 10
	}
	if c.SendBufs == 0 {
		c.SendBufs = 256
	}
	if c.RecvBufSize == 0 {
		c.RecvBufSize = 32 << 10
	}
	if c.RecvBufs == 0 {
		c.RecvBufs = 256
	}
	if c.CloseWait == 0 {
		c.CloseWait = 2 * time.Second
	}
}

// Owner receives the completions of the operations it submitted with UserData(id, tag).
type Owner interface {
	OnCQE(q *Queue, c uring.CQE)
}

// Flusher is called on the loop before the queue submits, after MarkDirty.
type Flusher interface {
	Flush(q *Queue)
}

// Stats are a queue's counters, safe to read from any goroutine.
type Stats struct {
	Enters          uint64 // io_uring_enter calls
	CQEs            uint64 // completions handled
	Wakeups         uint64 // eventfd writes by other goroutines to wake the queue
	OverflowFlushes uint64 // CQ overflowed and had to be flushed
	RecvBufsOut     int64  // receive buffers held by the application or in flight to it
	BufRingEmpty    uint64 // times a recv found the buffer ring empty (ENOBUFS)
	BundleMismatch  uint64 // bundle CQEs whose first buffer id did not match the ring order
	NotifsPending   int64  // zero-copy sends whose notification has not arrived
	StrayCQEs       uint64 // completions for owners that no longer exist (a bug if non-zero)
}

type ownerSlot struct {
	o   Owner
	gen uint16
}

const (
	slotBits = 20
	slotMask = 1<<slotBits - 1
	selfTag  = 1 // eventfd read
)

// Queue is one ring and its loop.
type Queue struct {
	cfg  Config
	ring *uring.Ring

	inbox    inbox
	sleeping atomic.Int32
	efd      int
	scratch  []byte // mmap'd page the kernel writes asynchronously (eventfd counter)

	owners     []ownerSlot
	freeOwners []uint32
	dirty      []Flusher
	bufWaiters []Flusher

	send     *memreg.Region
	recv     *memreg.Region
	bufRing  *uring.BufRing
	shadow   []uint16 // buffer id at each ring slot
	rhead    uint32   // ring entries the kernel consumed
	rtail    uint32   // ring entries added
	addsOpen int      // added since the last Advance
	bundles  bool

	cqes     []uring.CQE
	tid      atomic.Int32
	stopping bool
	stopReq  atomic.Bool
	done     chan struct{}
	closed   atomic.Bool
	closeErr error

	enters, cqeCount, wakeups, overflow, bufEmpty, mismatch, stray atomic.Uint64
	recvOut, notifs                                                atomic.Int64
}

// New starts a queue: its goroutine locks an OS thread, creates the ring there, registers the
// regions and starts looping. It returns once the queue is ready or failed.
func New(cfg Config) (*Queue, error) {
	cfg.defaults()
	if cfg.RecvBufs&(cfg.RecvBufs-1) != 0 || cfg.RecvBufs > 32768 {
		return nil, fmt.Errorf("loop: %d receive buffers: need a power of two <= 32768: %w", cfg.RecvBufs, unix.EINVAL)
	}
	q := &Queue{cfg: cfg, efd: -1, done: make(chan struct{}), owners: make([]ownerSlot, 1, 64)}
	ready := make(chan error, 1)
	go q.run(ready)
	if err := <-ready; err != nil {
		<-q.done
		return nil, err
	}
	return q, nil
}

// OnLoop reports whether the caller runs on the queue's goroutine (its thread is locked to
// it, so the thread id tells). Code that would block waiting for the loop uses it to fail
// instead of deadlocking.
func (q *Queue) OnLoop() bool { return int32(unix.Gettid()) == q.tid.Load() }

// ID returns the queue's id.
func (q *Queue) ID() int { return q.cfg.ID }

// Ring returns the queue's ring (loop only).
func (q *Queue) Ring() *uring.Ring { return q.ring }

// SendRegion returns the region whose buffers the ring knows as fixed buffers.
func (q *Queue) SendRegion() *memreg.Region { return q.send }

// RecvRegion returns the region backing the provided-buffer ring.
func (q *Queue) RecvRegion() *memreg.Region { return q.recv }

// BufGroup returns the provided-buffer group id for multishot recv.
func (q *Queue) BufGroup() uint16 { return 0 }

// Bundles reports whether recv bundles are in use.
func (q *Queue) Bundles() bool { return q.bundles }

func (q *Queue) init() error {
	caps := uring.DetectCapabilities()
	if caps.Err != nil {
		return caps.Err
	}
	flags := q.cfg.Flags
	if flags == 0 {
		if caps.SetupOK(uring.SetupSingleIssuer | uring.SetupDeferTaskrun) {
			flags = uring.SetupSingleIssuer | uring.SetupDeferTaskrun | uring.SetupTaskrunFlag
		} else if caps.SetupOK(uring.SetupCoopTaskrun | uring.SetupTaskrunFlag) {
			flags = uring.SetupCoopTaskrun | uring.SetupTaskrunFlag
		}
		if caps.SetupOK(uring.SetupSubmitAll) {
			flags |= uring.SetupSubmitAll
		}
	}
	var err error
	q.ring, err = uring.New(q.cfg.Entries, &uring.Options{Flags: flags})
	if err != nil {
		return err
	}
	q.cqes = make([]uring.CQE, q.ring.CQEntries())
	q.bundles = !q.cfg.NoBundles && caps.Has(uring.FeatRecvsendBundle)
	q.scratch, err = unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return os.NewSyscallError("mmap", err)
	}
	q.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return os.NewSyscallError("eventfd", err)
	}
	if err := q.ring.RegisterBuffersSparse(16); err != nil {
		return fmt.Errorf("loop: fixed-buffer table: %w", err)
	}
	q.send, err = memreg.New(memreg.Options{BufSize: q.cfg.SendBufSize, Count: q.cfg.SendBufs})
	if err != nil {
		return err
	}
	if err := q.send.Register(q.ring, 0); err != nil {
		return err
	}
	q.recv, err = memreg.New(memreg.Options{BufSize: q.cfg.RecvBufSize, Count: q.cfg.RecvBufs})
	if err != nil {
		return err
	}
	q.bufRing, err = q.ring.RegisterBufRing(uint32(q.cfg.RecvBufs), q.BufGroup(), 0)
	if err != nil {
		return err
	}
	q.shadow = make([]uint16, q.cfg.RecvBufs)
	q.recv.Provide(q.cfg.RecvBufs, func(l memreg.Loan) { q.addRecvBuf(l.Index()) })
	q.publishRecvBufs()
	q.recv.SetRecycler(q.recycle)
	q.armEventfd()
	return nil
}

func (q *Queue) teardown() {
	if q.bufRing != nil {
		q.bufRing.Close()
	}
	if q.ring != nil {
		if q.send != nil {
			q.send.Forget(q.ring)
		}
		q.ring.Close()
	}
	for _, r := range []*memreg.Region{q.send, q.recv} {
		if r != nil {
			r.Abandon()
			r.Close()
		}
	}
	if q.efd >= 0 {
		unix.Close(q.efd)
	}
	if q.scratch != nil {
		unix.Munmap(q.scratch)
	}
}

func (q *Queue) run(ready chan<- error) {
	defer close(q.done)
	// The thread stays locked until the goroutine exits; the runtime then retires the thread,
	// taking its io_uring task context with it.
	runtime.LockOSThread()
	q.tid.Store(int32(unix.Gettid()))
	if !q.cfg.NoPin && q.cfg.CPU >= 0 {
		var set unix.CPUSet
		set.Set(q.cfg.CPU)
		unix.SchedSetaffinity(0, &set) // best effort: a cpuset may forbid it
	}
	if err := q.init(); err != nil {
		q.teardown()
		ready <- err
		return
	}
	ready <- nil
	q.loop()
	q.drainNotifs()
	q.teardown()
}

func (q *Queue) loop() {
	for {
		q.runInbox()
		if q.stopReq.Load() && !q.stopping {
			q.stopping = true
			return
		}
		q.flush()
		var wait uint32 = 1
		if !q.inbox.empty() || len(q.dirty) > 0 {
			wait = 0
		} else {
			q.sleeping.Store(1)
			if !q.inbox.empty() {
				q.sleeping.Store(0)
				wait = 0
			}
		}
		_, err := q.ring.SubmitAndWait(wait)
		q.sleeping.Store(0)
		q.enters.Add(1)
		if err != nil && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			q.closeErr = err
			return
		}
		q.reap()
	}
}

// reap dispatches every ready completion.
func (q *Queue) reap() {
	for {
		n := q.ring.PeekBatch(q.cqes)
		if n == 0 {
			return
		}
		q.cqeCount.Add(uint64(n))
		for i := 0; i < n; i++ {
			q.dispatch(q.cqes[i])
		}
	}
}

func (q *Queue) dispatch(c uring.CQE) {
	id := uint32(c.UserData >> 32)
	if id == 0 {
		if uint32(c.UserData) == selfTag {
			q.armEventfd()
		}
		return
	}
	slot, gen := id&slotMask, uint16(id>>slotBits)
	if int(slot) >= len(q.owners) || q.owners[slot].o == nil || q.owners[slot].gen&0xfff != gen {
		q.stray.Add(1)
		return
	}
	q.owners[slot].o.OnCQE(q, c)
}

func (q *Queue) armEventfd() {
	sqe := q.GetSQE()
	sqe.PrepRead(int32(q.efd), uintptr(unsafe.Pointer(&q.scratch[0])), 8)
	sqe.UserData = selfTag
}

// runInbox runs posted work in FIFO order.
func (q *Queue) runInbox() {
	t := q.inbox.takeAll()
	for t != nil {
		next := t.next
		switch {
		case t.fn != nil:
			t.fn()
		case t.owner != nil:
			q.MarkDirty(t.owner)
		default:
			q.addRecvBuf(int(t.bid))
		}
		*t = task{}
		taskPool.Put(t)
		t = next
	}
}

// flush runs dirty flushers, publishes returned receive buffers and wakes conns that waited
// for them.
func (q *Queue) flush() {
	if q.addsOpen > 0 {
		q.publishRecvBufs()
	}
	for len(q.dirty) > 0 {
		d := q.dirty
		q.dirty = nil
		for _, f := range d {
			f.Flush(q)
		}
		if q.dirty == nil {
			q.dirty = d[:0]
		}
	}
}

// MarkDirty asks the loop to call f.Flush before it next submits (loop only).
func (q *Queue) MarkDirty(f Flusher) { q.dirty = append(q.dirty, f) }

// WaitBuffers calls f.Flush once receive buffers were returned to the ring (loop only).
func (q *Queue) WaitBuffers(f Flusher) { q.bufWaiters = append(q.bufWaiters, f) }

// Post runs fn on the queue's goroutine. It never blocks and does not allocate beyond fn's
// closure; it wakes the queue only if it sleeps.
func (q *Queue) Post(fn func()) error {
	if q.closed.Load() {
		return ErrClosed
	}
	t := taskPool.Get().(*task)
	t.fn = fn
	q.push(t)
	return nil
}

// Schedule asks the loop to call f.Flush, from any goroutine, without allocating.
func (q *Queue) Schedule(f Flusher) error {
	if q.closed.Load() {
		return ErrClosed
	}
	t := taskPool.Get().(*task)
	t.owner = f
	q.push(t)
	return nil
}

func (q *Queue) push(t *task) {
	q.inbox.push(t)
	if q.sleeping.Load() == 1 && q.sleeping.CompareAndSwap(1, 0) {
		var one = [8]byte{1}
		unix.Write(q.efd, one[:])
		q.wakeups.Add(1)
	}
}

// Do runs fn on the queue's goroutine and waits for its result.
func (q *Queue) Do(fn func() error) error {
	ch := make(chan error, 1)
	if err := q.Post(func() { ch <- fn() }); err != nil {
		return err
	}
	select {
	case err := <-ch:
		return err
	case <-q.done:
		select {
		case err := <-ch:
			return err
		default:
			return ErrClosed
		}
	}
}

// AddOwner registers o and returns its id for UserData (loop only).
func (q *Queue) AddOwner(o Owner) uint32 {
	var slot uint32
	if n := len(q.freeOwners); n > 0 {
		slot = q.freeOwners[n-1]
		q.freeOwners = q.freeOwners[:n-1]
	} else {
		slot = uint32(len(q.owners))
		q.owners = append(q.owners, ownerSlot{})
	}
	s := &q.owners[slot]
	s.gen = (s.gen + 1) & 0xfff
	s.o = o
	return slot | uint32(s.gen)<<slotBits
}

// RemoveOwner unregisters an owner; completions still arriving for it are dropped and counted
// as stray (loop only). Remove an owner only when it has nothing in flight.
func (q *Queue) RemoveOwner(id uint32) {
	slot := id & slotMask
	if int(slot) < len(q.owners) && q.owners[slot].o != nil {
		q.owners[slot].o = nil
		q.freeOwners = append(q.freeOwners, slot)
	}
}

// UserData builds the user_data for an owner's operation.
func UserData(owner, tag uint32) uint64 { return uint64(owner)<<32 | uint64(tag) }

// GetSQE returns a free SQE, submitting first when the SQ is full (loop only).
func (q *Queue) GetSQE() *uring.SQE {
	for {
		if sqe := q.ring.GetSQE(); sqe != nil {
			return sqe
		}
		if _, err := q.ring.Submit(); err != nil {
			q.enters.Add(1)
			q.reap()
			continue
		}
		q.enters.Add(1)
	}
}

// NotifStarted / NotifDone count zero-copy sends waiting for their notification (loop only).
func (q *Queue) NotifStarted() { q.notifs.Add(1) }
func (q *Queue) NotifDone()    { q.notifs.Add(-1) }

func (q *Queue) addRecvBuf(idx int) {
	q.bufRing.Add(q.recv.Addr(idx), uint32(q.cfg.RecvBufSize), uint16(idx), q.addsOpen)
	q.shadow[(q.rtail+uint32(q.addsOpen))&uint32(len(q.shadow)-1)] = uint16(idx)
	q.addsOpen++
	if q.addsOpen == len(q.shadow) {
		q.publishRecvBufs()
	}
}

func (q *Queue) publishRecvBufs() {
	q.rtail += uint32(q.addsOpen)
	q.bufRing.Advance(q.addsOpen)
	q.addsOpen = 0
	if len(q.bufWaiters) > 0 {
		q.dirty = append(q.dirty, q.bufWaiters...)
		q.bufWaiters = q.bufWaiters[:0]
	}
}

// recycle runs (on any goroutine) when the application releases a received buffer.
func (q *Queue) recycle(idx int) {
	q.recvOut.Add(-1)
	if q.closed.Load() {
		return
	}
	t := taskPool.Get().(*task)
	t.bid = int32(idx)
	q.push(t)
}

// Received hands the buffers a recv CQE consumed to fn, in order, as borrowed buffers with
// their byte counts (loop only). It must be called for every CQE with the buffer flag.
func (q *Queue) Received(c uring.CQE, fn func(b memreg.Buf, n int)) {
	if !c.HasBuffer() {
		return
	}
	left := int(c.Res)
	mask := uint32(len(q.shadow) - 1)
	first := true
	for {
		bid := q.shadow[q.rhead&mask]
		if first && bid != c.BufferID() {
			// The ring order we track disagrees with the kernel: trust the kernel's id.
			q.mismatch.Add(1)
			bid = c.BufferID()
		}
		first = false
		q.rhead++
		n := min(left, q.cfg.RecvBufSize)
		b, err := q.recv.Received(int(bid))
		if err == nil {
			q.recvOut.Add(1)
			fn(b, n)
		}
		left -= n
		if left <= 0 {
			return
		}
	}
}

// NoteBufRingEmpty counts a recv that ended with ENOBUFS.
func (q *Queue) NoteBufRingEmpty() { q.bufEmpty.Add(1) }

// Stats returns the queue's counters.
func (q *Queue) Stats() Stats {
	return Stats{
		Enters: q.enters.Load(), CQEs: q.cqeCount.Load(), Wakeups: q.wakeups.Load(),
		RecvBufsOut: q.recvOut.Load(), BufRingEmpty: q.bufEmpty.Load(), BundleMismatch: q.mismatch.Load(),
		NotifsPending: q.notifs.Load(), StrayCQEs: q.stray.Load(), OverflowFlushes: q.overflow.Load(),
	}
}

// drainNotifs keeps reaping until no zero-copy notification is pending or CloseWait passed.
func (q *Queue) drainNotifs() {
	deadline := time.Now().Add(q.cfg.CloseWait)
	for q.notifs.Load() > 0 && time.Now().Before(deadline) {
		q.ring.SubmitAndWaitTimeout(1, 10*time.Millisecond)
		q.reap()
	}
}

// Stopped is closed when the queue's loop has exited.
func (q *Queue) Stopped() <-chan struct{} { return q.done }

// Close stops the loop, waits (bounded) for zero-copy notifications, and frees the ring, the
// regions and the fds. It is idempotent; later calls return ErrClosed.
func (q *Queue) Close() error {
	if !q.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	q.stopReq.Store(true)
	t := taskPool.Get().(*task)
	t.fn = func() {}
	q.push(t)
	unix.Write(q.efd, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	<-q.done
	return q.closeErr
}
