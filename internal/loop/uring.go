package loop

import (
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
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
	reaping bool                      // reap is running (a nested one uses its own array)
	scratch []byte                    // mmap'd: the kernel writes the eventfd counter here asynchronously
	fixed   []bool                    // fixed-buffer slots in use
	regs    map[*memreg.Region]uint32 // registered regions -> first slot (the fixed-buffer table)
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
	u := &URing{q: q, caps: caps, fixed: make([]bool, cfg.FixedSlots), regs: map[*memreg.Region]uint32{}}
	var err error
	u.ring, err = uring.New(cfg.Entries, &uring.Options{Flags: flags | uring.SetupCQSize, CQEntries: 4 * cfg.Entries})
	if err != nil {
		if errors.Is(err, unix.ENOMEM) {
			// The ring's own memory counts against RLIMIT_MEMLOCK on older kernels.
			return nil, memreg.NewMemlockError(0, err)
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
			return fail(memreg.NewMemlockError(0, err))
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

// RegisterRegion installs r in free fixed-buffer slots and returns the first (loop only).
// The kernel pins the pages, counted against RLIMIT_MEMLOCK unless the process has
// CAP_IPC_LOCK: a refusal for lack of locked memory is a *memreg.MemlockError. The region
// cannot be closed (memreg.ErrBusy) until UnregisterRegion or Close.
func (u *URing) RegisterRegion(r *memreg.Region) (uint32, error) {
	if _, ok := u.regs[r]; ok {
		return 0, fmt.Errorf("loop: region already registered with this ring: %w", memreg.ErrBusy)
	}
	mem := r.Memory()
	if mem == nil {
		return 0, memreg.ErrClosed
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
		if err := r.HoldForKernel(); err != nil {
			return 0, err
		}
		base := uint64(uintptr(unsafe.Pointer(&mem[0])))
		var iov []uring.Iovec
		for off := 0; off < len(mem); off += maxFixed {
			iov = append(iov, uring.Iovec{Base: base + uint64(off), Len: uint64(min(maxFixed, len(mem)-off))})
		}
		if _, err := u.ring.UpdateBuffers(uint32(first), iov, nil); err != nil {
			r.ReleaseFromKernel()
			if errors.Is(err, unix.ENOMEM) {
				return 0, memreg.NewMemlockError(len(mem), err)
			}
			return 0, fmt.Errorf("loop: register %d bytes at fixed slot %d: %w", len(mem), first, err)
		}
		for i := first; i < first+need; i++ {
			u.fixed[i] = true
		}
		u.regs[r] = uint32(first)
		return uint32(first), nil
	}
	return 0, fmt.Errorf("loop: no %d free fixed-buffer slots of %d: %w", need, len(u.fixed), memreg.ErrExhausted)
}

// UnregisterRegion removes r from the fixed-buffer table (loop only). Sends already
// submitted keep the pages pinned until they complete.
func (u *URing) UnregisterRegion(r *memreg.Region) error {
	first, ok := u.regs[r]
	if !ok {
		return fmt.Errorf("loop: region not registered with this ring: %w", unix.ENOENT)
	}
	n := fixedSlots(len(r.Memory()))
	if _, err := u.ring.UpdateBuffers(first, make([]uring.Iovec, n), nil); err != nil {
		return fmt.Errorf("loop: unregister: %w", err)
	}
	for i := first; i < first+uint32(n); i++ {
		u.fixed[i] = false
	}
	delete(u.regs, r)
	r.ReleaseFromKernel()
	return nil
}

// FixedIndex returns the fixed-buffer slot that holds [addr, addr+n) of region r, or false
// when r is not registered here or the range is outside it or crosses a slot boundary
// (loop only).
func (u *URing) FixedIndex(r *memreg.Region, addr uintptr, n int) (uint16, bool) {
	first, ok := u.regs[r]
	if !ok || !r.Contains(addr, n) {
		return 0, false
	}
	off := addr - r.Base()
	lo, hi := off/maxFixed, (off+uintptr(max(n, 1))-1)/maxFixed
	if lo != hi {
		return 0, false
	}
	return uint16(first + uint32(lo)), true
}

// Close implements Driver: it unregisters the fixed buffers (the kernel unpins them now,
// not when its asynchronous ring teardown gets to it: a new engine right after this one
// finds the locked-memory allowance back), closes the receive ring and the ring, then runs
// the OnClose functions.
func (u *URing) Close() {
	if u.ring != nil {
		if len(u.regs) > 0 {
			u.ring.UnregisterBuffers()
		}
		u.ring.Close()
	}
	for r := range u.regs {
		r.ReleaseFromKernel()
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
