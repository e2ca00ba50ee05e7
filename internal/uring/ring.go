package uring

import (
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Options tune io_uring_setup. The zero value is a plain ring.
type Options struct {
	Flags        uint32 // Setup* flags
	CQEntries    uint32 // with SetupCQSize: CQ size (rounded up to a power of two by the kernel)
	SQThreadCPU  uint32 // with SetupSQPoll|SetupSQAff
	SQThreadIdle uint32 // with SetupSQPoll: idle time in milliseconds before the thread sleeps
	WQFd         uint32 // with SetupAttachWQ
}

// Stats are counters a Ring keeps about its own syscalls.
type Stats struct {
	Enters          uint64 // io_uring_enter calls
	Submitted       uint64 // SQEs the kernel consumed
	OverflowFlushes uint64 // enters made only to flush overflowed CQEs (CQ was full)
}

type keepEntry struct {
	v    any
	tail uint32
}

// Ring is one io_uring instance with its mapped rings.
type Ring struct {
	fd       int
	flags    uint32
	features uint32

	ringMem []byte
	cqMem   []byte // separate CQ mapping on kernels without FeatSingleMmap
	sqeMem  []byte

	sqHead, sqTail, sqFlags, sqDropped *uint32
	sqMask, sqEntries                  uint32
	sqes                               unsafe.Pointer
	sqeShift                           uint
	sqeHead, sqeTail                   uint32 // local: prepared but not yet published

	cqHead, cqTail, cqOverflow *uint32
	cqMask, cqEntries          uint32
	cqes                       unsafe.Pointer
	cqeShift                   uint

	enterFd    int
	enterFlags uint32

	keep []keepEntry

	waitTs  Timespec
	waitArg geteventsArg

	stats  Stats
	closed bool
}

var openRings atomic.Int64

// OpenRings returns how many Rings this process has open; tests use it to find leaks.
func OpenRings() int64 { return openRings.Load() }

// New creates a ring with room for entries SQEs.
func New(entries uint32, opt *Options) (*Ring, error) {
	var p Params
	if opt != nil {
		p.Flags = opt.Flags
		p.CQEntries = opt.CQEntries
		p.SQThreadCPU = opt.SQThreadCPU
		p.SQThreadIdle = opt.SQThreadIdle
		p.WQFd = opt.WQFd
	}
	if entries == 0 || entries > 32768 {
		return nil, fmt.Errorf("uring: %d entries: %w", entries, unix.EINVAL)
	}
	fd, err := setup(entries, &p)
	if err != nil {
		return nil, err
	}
	r := &Ring{fd: fd, enterFd: fd, flags: p.Flags, features: p.Features}
	if err := r.mmap(&p); err != nil {
		r.unmap()
		unix.Close(fd)
		return nil, err
	}
	openRings.Add(1)
	return r, nil
}

func (r *Ring) mmap(p *Params) error {
	cqeSize := uintptr(unsafe.Sizeof(CQE{}))
	if p.Flags&SetupCQE32 != 0 {
		cqeSize *= 2
		r.cqeShift = 1
	}
	sqeSize := uintptr(unsafe.Sizeof(SQE{}))
	if p.Flags&SetupSQE128 != 0 {
		sqeSize *= 2
		r.sqeShift = 1
	}
	sqSize := uintptr(p.SQOff.Array) + uintptr(p.SQEntries)*4
	cqSize := uintptr(p.CQOff.CQEs) + uintptr(p.CQEntries)*cqeSize
	single := p.Features&FeatSingleMmap != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	r.ringMem, err = unix.Mmap(r.fd, offSQRing, int(sqSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return os.NewSyscallError("mmap(io_uring sq ring)", err)
	}
	cq := r.ringMem
	if !single {
		r.cqMem, err = unix.Mmap(r.fd, offCQRing, int(cqSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return os.NewSyscallError("mmap(io_uring cq ring)", err)
		}
		cq = r.cqMem
	}
	r.sqeMem, err = unix.Mmap(r.fd, offSQEs, int(uintptr(p.SQEntries)*sqeSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return os.NewSyscallError("mmap(io_uring sqes)", err)
	}
	u32 := func(b []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
	r.sqHead = u32(r.ringMem, p.SQOff.Head)
	r.sqTail = u32(r.ringMem, p.SQOff.Tail)
	r.sqFlags = u32(r.ringMem, p.SQOff.Flags)
	r.sqDropped = u32(r.ringMem, p.SQOff.Dropped)
	r.sqMask = *u32(r.ringMem, p.SQOff.RingMask)
	r.sqEntries = *u32(r.ringMem, p.SQOff.RingEntries)
	r.sqes = unsafe.Pointer(&r.sqeMem[0])
	if p.Flags&SetupNoSQArray == 0 {
		// Identity mapping, written once: SQE i sits in slot i.
		arr := unsafe.Slice(u32(r.ringMem, p.SQOff.Array), r.sqEntries)
		for i := range arr {
			arr[i] = uint32(i)
		}
	}
	r.cqHead = u32(cq, p.CQOff.Head)
	r.cqTail = u32(cq, p.CQOff.Tail)
	r.cqOverflow = u32(cq, p.CQOff.Overflow)
	r.cqMask = *u32(cq, p.CQOff.RingMask)
	r.cqEntries = *u32(cq, p.CQOff.RingEntries)
	r.cqes = unsafe.Pointer(&cq[p.CQOff.CQEs])
	return nil
}

func (r *Ring) unmap() {
	for _, m := range [][]byte{r.sqeMem, r.cqMem, r.ringMem} {
		if m != nil {
			unix.Munmap(m)
		}
	}
	r.sqeMem, r.cqMem, r.ringMem = nil, nil, nil
}

// Close unmaps the rings and closes the ring fd. The kernel cancels requests still in flight.
// A second Close returns os.ErrClosed.
func (r *Ring) Close() error {
	if r == nil || r.closed {
		return os.ErrClosed
	}
	r.closed = true
	r.unmap()
	r.keep = nil
	openRings.Add(-1)
	return unix.Close(r.fd)
}

// Fd returns the ring's file descriptor.
func (r *Ring) Fd() int { return r.fd }

// Flags returns the setup flags the ring was created with.
func (r *Ring) Flags() uint32 { return r.flags }

// Features returns the kernel's feature word (Feat*).
func (r *Ring) Features() uint32 { return r.features }

// SQEntries and CQEntries return the ring sizes the kernel chose.
func (r *Ring) SQEntries() uint32 { return r.sqEntries }
func (r *Ring) CQEntries() uint32 { return r.cqEntries }

// Stats returns the ring's syscall counters.
func (r *Ring) Stats() Stats { return r.stats }

// CQOverflow returns the kernel's count of completions it had to drop (only possible without
// FeatNodrop, or when the kernel could not allocate an overflow entry).
func (r *Ring) CQOverflow() uint32 { return atomic.LoadUint32(r.cqOverflow) }

// GetSQE returns the next free SQE, zeroed, or nil when the SQ is full (submit first).
func (r *Ring) GetSQE() *SQE {
	head := atomic.LoadUint32(r.sqHead)
	if r.sqeTail-head >= r.sqEntries {
		return nil
	}
	sqe := (*SQE)(unsafe.Add(r.sqes, uintptr(r.sqeTail&r.sqMask)<<(6+r.sqeShift)))
	*sqe = SQE{}
	r.sqeTail++
	return sqe
}

// SQSpace returns how many SQEs can be taken before the SQ is full.
func (r *Ring) SQSpace() uint32 { return r.sqEntries - (r.sqeTail - atomic.LoadUint32(r.sqHead)) }

// Pending returns how many SQEs were prepared and not yet handed to the kernel.
func (r *Ring) Pending() uint32 { return r.sqeTail - atomic.LoadUint32(r.sqHead) }

// Keep holds v reachable until the SQE most recently taken by GetSQE has been consumed by the
// kernel. Use it for Go-heap arguments the kernel reads during submission (timespecs,
// sockaddrs for connect).
func (r *Ring) Keep(v any) { r.keep = append(r.keep, keepEntry{v: v, tail: r.sqeTail}) }

func (r *Ring) releaseKept() {
	if len(r.keep) == 0 {
		return
	}
	head := atomic.LoadUint32(r.sqHead)
	n := 0
	for n < len(r.keep) && int32(r.keep[n].tail-head) <= 0 {
		r.keep[n].v = nil
		n++
	}
	if n == len(r.keep) {
		r.keep = r.keep[:0]
	} else if n > 0 {
		r.keep = append(r.keep[:0], r.keep[n:]...)
	}
}

// flushSQ publishes prepared SQEs to the kernel and returns how many it has not consumed yet.
func (r *Ring) flushSQ() uint32 {
	if r.sqeHead != r.sqeTail {
		r.sqeHead = r.sqeTail
		atomic.StoreUint32(r.sqTail, r.sqeTail)
	}
	return r.sqeTail - atomic.LoadUint32(r.sqHead)
}

func (r *Ring) cqNeedsEnter() bool {
	return r.flags&SetupIOPoll != 0 || atomic.LoadUint32(r.sqFlags)&(SQCQOverflow|SQTaskrun) != 0
}

// Submit hands prepared SQEs to the kernel and returns how many it consumed.
func (r *Ring) Submit() (int, error) { return r.submitAndWait(0, nil) }

// SubmitAndWait submits and then waits until at least waitNr completions are ready.
func (r *Ring) SubmitAndWait(waitNr uint32) (int, error) { return r.submitAndWait(waitNr, nil) }

// SubmitAndWaitTimeout is SubmitAndWait bounded by timeout; a timeout returns an error matching
// unix.ETIME (the submission itself still happened).
func (r *Ring) SubmitAndWaitTimeout(waitNr uint32, timeout time.Duration) (int, error) {
	if timeout < 0 {
		timeout = 0
	}
	return r.submitAndWait(waitNr, &timeout)
}

func (r *Ring) submitAndWait(waitNr uint32, timeout *time.Duration) (int, error) {
	if r.closed {
		return 0, os.ErrClosed
	}
	toSubmit := r.flushSQ()
	flags := r.enterFlags
	need := toSubmit > 0
	if r.flags&SetupSQPoll != 0 {
		need = false
		if atomic.LoadUint32(r.sqFlags)&SQNeedWakeup != 0 {
			flags |= EnterSQWakeup
			need = true
		}
	}
	if waitNr > 0 || r.cqNeedsEnter() {
		flags |= EnterGetevents
		need = true
	}
	if !need {
		r.releaseKept()
		return int(toSubmit), nil
	}
	var arg unsafe.Pointer
	var argSz uintptr
	if timeout != nil && flags&EnterGetevents != 0 {
		r.waitTs = Timespec{Sec: int64(*timeout / time.Second), Nsec: int64(*timeout % time.Second)}
		r.waitArg = geteventsArg{Ts: uint64(uintptr(unsafe.Pointer(&r.waitTs)))}
		arg, argSz = unsafe.Pointer(&r.waitArg), unsafe.Sizeof(r.waitArg)
		flags |= EnterExtArg
	}
	if r.flags&SetupSQPoll != 0 {
		toSubmit = 0 // the SQ thread submits; enter only wakes it or waits
	}
	n, err := enter(r.enterFd, toSubmit, waitNr, flags, arg, argSz)
	r.stats.Enters++
	if n > 0 {
		r.stats.Submitted += uint64(n)
	}
	r.releaseKept()
	if err != nil {
		if err == unix.ETIME {
			return n, os.NewSyscallError("io_uring_enter", err)
		}
		return n, os.NewSyscallError("io_uring_enter", err)
	}
	return n, nil
}

// CQReady returns how many completions are waiting in the CQ.
func (r *Ring) CQReady() uint32 { return atomic.LoadUint32(r.cqTail) - *r.cqHead }

func (r *Ring) cqeAt(i uint32) *CQE {
	return (*CQE)(unsafe.Add(r.cqes, uintptr(i&r.cqMask)<<(4+r.cqeShift)))
}

// ready returns the number of ready completions; when the CQ is empty it first flushes
// completions the kernel kept aside (CQ overflow, deferred task work) with a non-blocking enter.
func (r *Ring) ready() uint32 {
	ready := r.CQReady()
	if ready == 0 && r.cqNeedsEnter() {
		if atomic.LoadUint32(r.sqFlags)&SQCQOverflow != 0 {
			r.stats.OverflowFlushes++
		}
		r.stats.Enters++
		enter(r.enterFd, 0, 0, EnterGetevents|r.enterFlags, nil, 0)
		ready = r.CQReady()
	}
	return ready
}

// PeekBatch copies up to len(out) ready completions into out, consumes them and returns the
// count. When the CQ is empty it flushes completions the kernel kept aside (CQ overflow,
// deferred task work) with a non-blocking enter. On a CQE32 ring it drops the second halves
// (use PeekBatch32 there).
func (r *Ring) PeekBatch(out []CQE) int {
	if r.closed || len(out) == 0 {
		return 0
	}
	ready := r.ready()
	n := min(uint32(len(out)), ready)
	head := *r.cqHead
	for i := uint32(0); i < n; i++ {
		out[i] = *r.cqeAt(head + i)
	}
	if n > 0 {
		atomic.StoreUint32(r.cqHead, head+n)
	}
	return int(n)
}

// CQE32 is a completion of a ring set up with SetupCQE32: the CQE and its 16 extra bytes
// (big_cqe; a RECV_ZC completion keeps struct io_uring_zcrx_cqe there).
type CQE32 struct {
	CQE
	Big [2]uint64
}

// BigCQE reports whether the ring posts 32-byte completions (SetupCQE32).
func (r *Ring) BigCQE() bool { return r.cqeShift == 1 }

// PeekBatch32 is PeekBatch for a CQE32 ring: it copies the whole 32-byte completions. On a
// ring with 16-byte CQEs Big stays zero.
func (r *Ring) PeekBatch32(out []CQE32) int {
	if r.closed || len(out) == 0 {
		return 0
	}
	ready := r.ready()
	n := min(uint32(len(out)), ready)
	head := *r.cqHead
	for i := uint32(0); i < n; i++ {
		if r.cqeShift == 1 {
			out[i] = *(*CQE32)(unsafe.Pointer(r.cqeAt(head + i)))
		} else {
			out[i] = CQE32{CQE: *r.cqeAt(head + i)}
		}
	}
	if n > 0 {
		atomic.StoreUint32(r.cqHead, head+n)
	}
	return int(n)
}

// PeekCQE returns one ready completion, if any.
func (r *Ring) PeekCQE() (CQE, bool) {
	var c [1]CQE
	if r.PeekBatch(c[:]) == 1 {
		return c[0], true
	}
	return CQE{}, false
}

// WaitCQE blocks until a completion is ready and returns it.
func (r *Ring) WaitCQE() (CQE, error) {
	for {
		if c, ok := r.PeekCQE(); ok {
			return c, nil
		}
		if _, err := r.SubmitAndWait(1); err != nil {
			return CQE{}, err
		}
	}
}

// WaitCQETimeout is WaitCQE bounded by timeout (error matching unix.ETIME when it expires).
func (r *Ring) WaitCQETimeout(timeout time.Duration) (CQE, error) {
	deadline := time.Now().Add(timeout)
	for {
		if c, ok := r.PeekCQE(); ok {
			return c, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return CQE{}, os.NewSyscallError("io_uring_enter", unix.ETIME)
		}
		if _, err := r.SubmitAndWaitTimeout(1, left); err != nil {
			if c, ok := r.PeekCQE(); ok {
				return c, nil
			}
			return CQE{}, err
		}
	}
}
