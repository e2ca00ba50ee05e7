package loop

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/uring"
)

// URingConfig configures the io_uring driver.
type URingConfig struct {
	Entries uint32 // SQ entries (default 256; the CQ is four times as large)
	// Flags overrides the setup flags (default: SINGLE_ISSUER|DEFER_TASKRUN|TASKRUN_FLAG where
	// supported, else COOP_TASKRUN|TASKRUN_FLAG; SUBMIT_ALL where supported).
	Flags uint32
	// FixedSlots is the size of the sparse fixed-buffer table (default 64 slots of up to
	// 1 GiB each): registered regions take consecutive slots.
	FixedSlots uint32
	// Caps are the probed capabilities (default: uring.DetectCapabilities()).
	Caps *uring.Capabilities
	// CQE32 sets the ring up with 32-byte completions (IORING_SETUP_CQE32): the extra 16
	// bytes reach owners in Event.Big. Zero-copy receive (internal/zcrx) needs it.
	CQE32 bool
}

// URing is the io_uring driver: a ring owned by the queue's thread.
type URing struct {
	q       *Queue
	ring    *uring.Ring
	caps    *uring.Capabilities
	cqes    []uring.CQE
	cqes32  []uring.CQE32 // instead of cqes on a CQE32 ring
	closers []func()
	reaping bool                 // reap is running (a nested one uses its own array)
	scratch []byte               // mmap'd: the kernel writes the eventfd counter here asynchronously
	fixed   []bool               // fixed-buffer slots in use
	regs    map[uintptr]fixedMem // the fixed-buffer table: registered memory by its base address
	recv    *RecvRing
}

// NewURing creates the io_uring driver on the loop thread (call it from Start's init).
func NewURing(q *Queue, cfg URingConfig) (*URing, error) {
	caps := cfg.Caps
	if caps == nil {
		caps = uring.DetectCapabilities()
	}
	if caps.Err != nil {
		return nil, caps.Err
	}
	if cfg.Entries == 0 {
		cfg.Entries = 256
	}
	if cfg.FixedSlots == 0 {
		cfg.FixedSlots = 64
	}
	flags := cfg.Flags
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
	if cfg.CQE32 {
		flags |= uring.SetupCQE32
	}
	u := &URing{q: q, caps: caps, fixed: make([]bool, cfg.FixedSlots), regs: map[uintptr]fixedMem{}}
	var err error
	u.ring, err = uring.New(cfg.Entries, &uring.Options{Flags: flags | uring.SetupCQSize, CQEntries: 4 * cfg.Entries})
	if err != nil {
		if errors.Is(err, unix.ENOMEM) {
			// The ring's own memory counts against RLIMIT_MEMLOCK on older kernels.
			return nil, fmt.Errorf("loop: ring setup (locked memory): %w", err)
		}
		return nil, err
	}
	fail := func(err error) (*URing, error) {
		u.Close()
		return nil, err
	}
	if u.ring.BigCQE() {
		u.cqes32 = make([]uring.CQE32, u.ring.CQEntries())
	} else {
		u.cqes = make([]uring.CQE, u.ring.CQEntries())
	}
	u.scratch, err = unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		u.scratch = nil
		return fail(os.NewSyscallError("mmap", err))
	}
	if err := u.ring.RegisterBuffersSparse(cfg.FixedSlots); err != nil {
		if errors.Is(err, unix.ENOMEM) {
			return fail(fmt.Errorf("loop: fixed-buffer table (locked memory): %w", err))
		}
		return fail(fmt.Errorf("loop: fixed-buffer table: %w", err))
	}
	if caps.Has(uring.FeatRegRegRing) {
		u.ring.RegisterRingFd() // best effort: saves an fd lookup per enter
	}
	u.armWake()
	return u, nil
}

// Ring returns the ring (loop only).
func (u *URing) Ring() *uring.Ring { return u.ring }

// Queue returns the queue the driver serves.
func (u *URing) Queue() *Queue { return u.q }

// BigCQE reports whether the ring posts 32-byte completions (URingConfig.CQE32).
func (u *URing) BigCQE() bool { return u.ring.BigCQE() }

// OnClose registers f to run on the loop when the driver closes, after the ring is gone (the
// kernel no longer touches memory registered with it, such as a zcrx area) (loop only).
func (u *URing) OnClose(f func()) { u.closers = append(u.closers, f) }

// Caps returns the capabilities the driver was built with.
func (u *URing) Caps() *uring.Capabilities { return u.caps }

// GetSQE returns a free SQE, submitting first when the SQ is full (loop only).
func (u *URing) GetSQE() *uring.SQE {
	for {
		if sqe := u.ring.GetSQE(); sqe != nil {
			return sqe
		}
		if _, err := u.ring.Submit(); err != nil {
			u.reap()
		}
	}
}

// Submit hands prepared SQEs to the kernel now (loop only): before closing a descriptor that
// prepared SQEs still name.
func (u *URing) Submit() {
	if u.ring.Pending() > 0 {
		u.ring.Submit()
	}
}

func (u *URing) armWake() {
	sqe := u.GetSQE()
	sqe.PrepRead(int32(u.q.WakeFD()), uintptr(unsafe.Pointer(&u.scratch[0])), 8)
	sqe.UserData = UDWake
}

// Wait implements Driver.
func (u *URing) Wait(timeout time.Duration) error {
	var err error
	switch {
	case timeout == 0:
		_, err = u.ring.Submit()
	case timeout < 0:
		_, err = u.ring.SubmitAndWait(1)
	default:
		_, err = u.ring.SubmitAndWaitTimeout(1, timeout)
	}
	if err != nil && !errors.Is(err, unix.ETIME) && !errors.Is(err, unix.EBUSY) &&
		!errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
		return err
	}
	u.reap()
	return nil
}

// reap dispatches every ready completion.
func (u *URing) reap() {
	cqes, cqes32 := u.cqes, u.cqes32
	if u.reaping {
		// A handler's GetSQE found the SQ full and the submit failing, and reaps from inside
		// the dispatch loop: not into the array that loop is still reading.
		if cqes32 != nil {
			cqes32 = make([]uring.CQE32, 64)
		} else {
			cqes = make([]uring.CQE, 64)
		}
	}
	was := u.reaping
	u.reaping = true
	defer func() { u.reaping = was }()
	before := u.ring.Stats().OverflowFlushes
	if cqes32 != nil {
		u.reap32(cqes32)
	} else {
		for {
			n := u.ring.PeekBatch(cqes)
			if n == 0 {
				break
			}
			for i := 0; i < n; i++ {
				c := &cqes[i]
				u.dispatch(Event{UD: c.UserData, Res: c.Res, Flags: c.Flags})
			}
		}
	}
	if after := u.ring.Stats().OverflowFlushes; after != before {
		for i := before; i < after; i++ {
			u.q.NoteOverflow()
		}
	}
}

// reap32 is reap on a CQE32 ring: the second halves go to Event.Big.
func (u *URing) reap32(cqes []uring.CQE32) {
	for {
		n := u.ring.PeekBatch32(cqes)
		if n == 0 {
			return
		}
		for i := 0; i < n; i++ {
			c := &cqes[i]
			u.dispatch(Event{UD: c.UserData, Res: c.Res, Flags: c.Flags, Big: c.Big})
		}
	}
}

func (u *URing) dispatch(ev Event) {
	switch ev.UD {
	case UDWake:
		u.armWake()
	case UDIgnore:
	default:
		u.q.Dispatch(ev)
	}
}

// maxFixed is the largest fixed buffer io_uring accepts (1 GiB); bigger regions take several
// consecutive slots.
const maxFixed = 1 << 30

// fixedSlots returns how many fixed-buffer slots a mapping of n bytes needs.
func fixedSlots(n int) int { return (n + maxFixed - 1) / maxFixed }

// fixedMem is memory installed in the fixed-buffer table.
type fixedMem struct {
	first   uint32 // first slot
	size    int
	release func() // runs once the table no longer refers to the memory
}

// RegisterMem installs mem in free fixed-buffer slots and returns the first (loop only).
// The kernel pins the pages, counted against RLIMIT_MEMLOCK unless the process has
// CAP_IPC_LOCK: a refusal for lack of locked memory wraps unix.ENOMEM. The memory is named
// by its first byte's address from then on; release (if not nil) runs once the table no
// longer refers to it (UnregisterMem or Close), so the caller keeps it mapped until then.
// Memory already registered fails with unix.EBUSY, a full table with unix.ENOSPC.
func (u *URing) RegisterMem(mem []byte, release func()) (uint32, error) {
	if len(mem) == 0 {
		return 0, fmt.Errorf("loop: register empty memory: %w", unix.EINVAL)
	}
	base := uintptr(unsafe.Pointer(&mem[0]))
	if _, ok := u.regs[base]; ok {
		return 0, fmt.Errorf("loop: memory already registered with this ring: %w", unix.EBUSY)
	}
	need := fixedSlots(len(mem))
	for first := 0; first+need <= len(u.fixed); first++ {
		free := true
		for i := first; i < first+need; i++ {
			if u.fixed[i] {
				free = false
				break
			}
		}
		if !free {
			continue
		}
		var iov []uring.Iovec
		for off := 0; off < len(mem); off += maxFixed {
			iov = append(iov, uring.Iovec{Base: uint64(base) + uint64(off), Len: uint64(min(maxFixed, len(mem)-off))})
		}
		if _, err := u.ring.UpdateBuffers(uint32(first), iov, nil); err != nil {
			return 0, fmt.Errorf("loop: register %d bytes at fixed slot %d: %w", len(mem), first, err)
		}
		for i := first; i < first+need; i++ {
			u.fixed[i] = true
		}
		u.regs[base] = fixedMem{first: uint32(first), size: len(mem), release: release}
		return uint32(first), nil
	}
	return 0, fmt.Errorf("loop: no %d free fixed-buffer slots of %d: %w", need, len(u.fixed), unix.ENOSPC)
}

// UnregisterMem removes the memory registered at base from the fixed-buffer table and runs
// its release function (loop only). Sends already submitted keep the pages pinned until
// they complete.
func (u *URing) UnregisterMem(base uintptr) error {
	m, ok := u.regs[base]
	if !ok {
		return fmt.Errorf("loop: memory not registered with this ring: %w", unix.ENOENT)
	}
	n := fixedSlots(m.size)
	if _, err := u.ring.UpdateBuffers(m.first, make([]uring.Iovec, n), nil); err != nil {
		return fmt.Errorf("loop: unregister: %w", err)
	}
	for i := m.first; i < m.first+uint32(n); i++ {
		u.fixed[i] = false
	}
	delete(u.regs, base)
	if m.release != nil {
		m.release()
	}
	return nil
}

// FixedIndex returns the fixed-buffer slot that holds [addr, addr+n) of the memory registered
// at base, or false when nothing is registered there or the range is outside it or crosses
// a slot boundary (loop only).
func (u *URing) FixedIndex(base, addr uintptr, n int) (uint16, bool) {
	m, ok := u.regs[base]
	if !ok || addr < base || n < 0 || addr-base+uintptr(n) > uintptr(m.size) {
		return 0, false
	}
	off := addr - base
	lo, hi := off/maxFixed, (off+uintptr(max(n, 1))-1)/maxFixed
	if lo != hi {
		return 0, false
	}
	return uint16(m.first + uint32(lo)), true
}

// closeWaitMax bounds Close's wait for the kernel's teardown of the ring (it takes
// microseconds to milliseconds; a kernel worker that does not run for this long is a
// machine in trouble, and Close goes on: closeWaitMissed counts it).
const closeWaitMax = time.Second

// closeWaitMissed counts rings whose teardown Close did not see (CloseWaitMissed).
var closeWaitMissed atomic.Int64

// CloseWaitMissed reports how many rings closed without their teardown seen within the bound.
func CloseWaitMissed() int64 { return closeWaitMissed.Load() }

// Close implements Driver: it unregisters the fixed buffers and the provided-buffer ring
// (both synchronous: the kernel unpins them before the call returns), then closes the ring
// and waits, at most closeWaitMax, until the kernel has freed it (uring.Ring.CloseWait: a
// closed ring's memory is freed in a kernel workqueue, and counts against RLIMIT_MEMLOCK
// until then, so a new engine right after this one would be refused memory that nobody
// uses), then runs the OnClose functions.
func (u *URing) Close() {
	if u.ring != nil {
		if len(u.regs) > 0 {
			u.ring.UnregisterBuffers()
		}
		if u.recv != nil {
			u.recv.close()
			u.recv = nil
		}
		if ok, _ := u.ring.CloseWait(closeWaitMax); !ok {
			closeWaitMissed.Add(1)
		}
	}
	for _, m := range u.regs {
		if m.release != nil {
			m.release()
		}
	}
	clear(u.regs)
	for _, f := range u.closers {
		f()
	}
	u.closers = nil
	if u.recv != nil {
		u.recv.close()
	}
	if u.scratch != nil {
		unix.Munmap(u.scratch)
		u.scratch = nil
	}
}

// CancelOp asks the kernel to cancel operation ud (loop only); the cancel's own completion is
// ignored, the operation's arrives with -ECANCELED (or its real result if it won the race).
func (u *URing) CancelOp(ud uint64) {
	sqe := u.GetSQE()
	sqe.PrepCancel(ud, 0)
	sqe.UserData = UDIgnore
}
