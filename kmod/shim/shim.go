package shim

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/zcnet/zcnet/internal/eintr"
	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/kmod/internal/abi"
	"golang.org/x/sys/unix"
)

// DevicePath is the shim's misc device.
const DevicePath = "/dev/" + "zcshim"

// Limits of the ABI (kmod/uapi/zcshim.h).
const (
	MaxEntries   = abi.MaxEntries
	MaxRegions   = abi.MaxRegions
	MaxRegionLen = abi.MaxRegionLen
	MaxSocks     = abi.MaxSocks
	RecvMax      = abi.RecvMax
)

// Errors. Match with errors.Is.
var (
	// ErrNotSupported: /dev/zcshim is absent (the module is not loaded, or
	// this kernel cannot load modules: see kmod.Load).
	// It is the one sentinel every zcnet package shares.
	ErrNotSupported = errs.ErrNotSupported
	errNoDevice     = errs.NotSupported("zcshim", DevicePath+" (load zcshim.ko with kmod.Load; needs a kernel with module support)", nil)
	// ErrSQFull: every SQ slot holds a prepared entry; call Submit.
	ErrSQFull = errors.New("zcshim: submission queue full; call Submit")
	// ErrCQFull: the kernel accepted nothing because the completion queue
	// (with the slots reserved for pending notifications) has no room; reap
	// completions first.
	ErrCQFull = errors.New("zcshim: completion queue has no room; reap completions")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errs.ErrClosed
)

// OpError is the error type of this package: the operation and its cause
// (an *os.SyscallError wrapping an errno, or one of the sentinels above).
type OpError struct {
	Op  string
	Err error
}

func (e *OpError) Error() string { return "zcshim " + e.Op + ": " + e.Err.Error() }
func (e *OpError) Unwrap() error { return e.Err }

func opErr(op string, err error) error { return &OpError{Op: op, Err: err} }

// RegionKey names a registered memory region.
type RegionKey uint32

// SockID names an attached socket.
type SockID uint32

// RegionFlags modify RegisterRegion.
type RegionFlags uint32

// RegionReadOnly pins without write access; RECV into the region fails
// with EACCES.
const RegionReadOnly RegionFlags = abi.RegReadonly

// Config sizes a queue. Zero values pick defaults.
type Config struct {
	Entries   uint32 // SQ entries, power of two, default 256
	CQEntries uint32 // CQ entries, power of two >= 2*Entries, default 2*Entries
}

// Completion is one CQE.
type Completion struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// More reports that a notification with the same UserData will follow
// (set on a SEND's completion).
func (c Completion) More() bool { return c.Flags&abi.CqeFMore != 0 }

// Notif reports that this entry is a SEND's notification: the kernel has
// released the pages and the buffer may be reused.
func (c Completion) Notif() bool { return c.Flags&abi.CqeFNotif != 0 }

// Copied reports, on a notification, that the stack copied the payload
// (zero-copy did not happen for at least part of it).
func (c Completion) Copied() bool { return c.Flags&abi.CqeFCopied != 0 }

// Err returns the completion's error (a syscall.Errno), or nil if Res >= 0.
func (c Completion) Err() error {
	if c.Res >= 0 {
		return nil
	}
	return syscall.Errno(-c.Res)
}

func (c Completion) String() string {
	return fmt.Sprintf("cqe{data=%#x res=%d more=%v notif=%v copied=%v}", c.UserData, c.Res, c.More(), c.Notif(), c.Copied())
}

// Stats are the module-wide live object counters (for leak checks).
type Stats struct {
	Contexts, Regions, PinnedPages, Socks, Notifs, Ops uint64
	ZeroCopySends, CopiedSends                         uint64
}

// Queue is one /dev/zcshim context: a submission/completion ring pair with
// its regions and sockets. A Queue is owned by one goroutine: its methods
// must not be called concurrently (Close included).
type Queue struct {
	fd     int
	closed bool
	ring   []byte
	setup  abi.Setup

	sqHead, sqTail, cqHead, cqTail *uint32
	sqes                           []abi.Sqe
	cqes                           []abi.Cqe
	sqMask, cqMask                 uint32
	sqLocal                        uint32 // next SQ tail we will publish
	cqLocal                        uint32 // our CQ head
}

func ioctl(fd int, req uint, arg unsafe.Pointer) (int, error) {
	var r uintptr
	e := eintr.Errno(func() (e unix.Errno) {
		r, _, e = unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
		return e
	})
	if e != 0 {
		return int(r), e
	}
	return int(r), nil
}

// Open opens /dev/zcshim and sets up its rings.
func Open(cfg Config) (*Queue, error) {
	return OpenPath(DevicePath, cfg)
}

// OpenPath is Open on another device node.
func OpenPath(path string, cfg Config) (*Queue, error) {
	if cfg.Entries == 0 {
		cfg.Entries = 256
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENODEV) {
			return nil, opErr("open", fmt.Errorf("%w: %w", errNoDevice, os.NewSyscallError("open", err)))
		}
		return nil, opErr("open", os.NewSyscallError("open", err))
	}
	q := &Queue{fd: fd}
	q.setup = abi.Setup{Sq_entries: cfg.Entries, Cq_entries: cfg.CQEntries}
	if _, err := ioctl(fd, abi.IocSetup, unsafe.Pointer(&q.setup)); err != nil {
		unix.Close(fd)
		return nil, opErr("setup", os.NewSyscallError("ioctl", err))
	}
	ring, err := unix.Mmap(fd, 0, int(q.setup.Ring_size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		unix.Close(fd)
		return nil, opErr("mmap", os.NewSyscallError("mmap", err))
	}
	q.mapRing(ring)
	return q, nil
}

// mapRing points the queue at ring memory laid out as q.setup says.
func (q *Queue) mapRing(ring []byte) {
	q.ring = ring
	s := &q.setup
	q.sqHead = (*uint32)(unsafe.Pointer(&ring[s.Sq_head_off]))
	q.sqTail = (*uint32)(unsafe.Pointer(&ring[s.Sq_tail_off]))
	q.cqHead = (*uint32)(unsafe.Pointer(&ring[s.Cq_head_off]))
	q.cqTail = (*uint32)(unsafe.Pointer(&ring[s.Cq_tail_off]))
	q.sqes = unsafe.Slice((*abi.Sqe)(unsafe.Pointer(&ring[s.Sqes_off])), s.Sq_entries)
	q.cqes = unsafe.Slice((*abi.Cqe)(unsafe.Pointer(&ring[s.Cqes_off])), s.Cq_entries)
	q.sqMask = s.Sq_entries - 1
	q.cqMask = s.Cq_entries - 1
	q.sqLocal = atomic.LoadUint32(q.sqTail)
	q.cqLocal = atomic.LoadUint32(q.cqHead)
}

// Fd returns the device fd, for poll/epoll: it is readable while
// completions are ready. The Queue keeps ownership.
func (q *Queue) Fd() int { return q.fd }

// Entries returns the SQ and CQ sizes in use.
func (q *Queue) Entries() (sq, cq uint32) { return q.setup.Sq_entries, q.setup.Cq_entries }

// Close releases the queue. Queued operations are cancelled; regions stay
// pinned in the kernel until the stack releases the last page of a send.
// Close is idempotent; later calls and other methods return ErrClosed.
func (q *Queue) Close() error {
	if q == nil || q.closed {
		return opErr("close", ErrClosed)
	}
	q.closed = true
	if q.ring != nil {
		unix.Munmap(q.ring)
		q.ring = nil
	}
	if err := unix.Close(q.fd); err != nil {
		return opErr("close", os.NewSyscallError("close", err))
	}
	return nil
}

// RegisterRegion pins [addr, addr+length) and returns its key. The memory
// must stay mapped for as long as the region is registered or used by a
// send (use Mmap, never Go heap memory, which can move).
func (q *Queue) RegisterRegion(addr uintptr, length int, flags RegionFlags) (RegionKey, error) {
	if q.closed {
		return 0, opErr("register", ErrClosed)
	}
	if length <= 0 {
		return 0, opErr("register", os.NewSyscallError("ioctl", unix.EINVAL))
	}
	r := abi.Region{Addr: uint64(addr), Len: uint64(length), Flags: uint32(flags)}
	if _, err := ioctl(q.fd, abi.IocRegister, unsafe.Pointer(&r)); err != nil {
		if errors.Is(err, unix.ENOMEM) {
			var lim unix.Rlimit
			unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim)
			return 0, opErr("register", fmt.Errorf("%w (RLIMIT_MEMLOCK is %d KiB; raise it with ulimit -l, or run with CAP_IPC_LOCK)", os.NewSyscallError("ioctl", err), lim.Cur>>10))
		}
		return 0, opErr("register", os.NewSyscallError("ioctl", err))
	}
	return RegionKey(r.Key), nil
}

// RegisterBytes registers b, which must come from Mmap (or another mapping
// that outlives the registration).
func (q *Queue) RegisterBytes(b []byte, flags RegionFlags) (RegionKey, error) {
	if len(b) == 0 {
		return 0, opErr("register", os.NewSyscallError("ioctl", unix.EINVAL))
	}
	return q.RegisterRegion(uintptr(unsafe.Pointer(&b[0])), len(b), flags)
}

// Unregister drops a region. It does not wait: the pages stay pinned until
// the last notification of a send that used them.
func (q *Queue) Unregister(key RegionKey) error {
	if q.closed {
		return opErr("unregister", ErrClosed)
	}
	id := abi.ID{Id: uint32(key)}
	if _, err := ioctl(q.fd, abi.IocUnregister, unsafe.Pointer(&id)); err != nil {
		return opErr("unregister", os.NewSyscallError("ioctl", err))
	}
	return nil
}

// Attach attaches a connected TCP socket (IPv4 or IPv6, not MPTCP). The
// shim takes its own reference: the caller may close fd afterwards.
func (q *Queue) Attach(fd int) (SockID, error) {
	if q.closed {
		return 0, opErr("attach", ErrClosed)
	}
	a := abi.Attach{Fd: int32(fd)}
	if _, err := ioctl(q.fd, abi.IocAttach, unsafe.Pointer(&a)); err != nil {
		return 0, opErr("attach", os.NewSyscallError("ioctl", err))
	}
	return SockID(a.Id), nil
}

// Detach detaches a socket; its queued operations complete with ECANCELED.
func (q *Queue) Detach(id SockID) error {
	if q.closed {
		return opErr("detach", ErrClosed)
	}
	x := abi.ID{Id: uint32(id)}
	if _, err := ioctl(q.fd, abi.IocDetach, unsafe.Pointer(&x)); err != nil {
		return opErr("detach", os.NewSyscallError("ioctl", err))
	}
	return nil
}

// SQSpace returns how many entries can be prepared before Submit.
func (q *Queue) SQSpace() int {
	return int(q.setup.Sq_entries - (q.sqLocal - atomic.LoadUint32(q.sqHead)))
}

// Prepared returns how many prepared entries Submit has not handed over.
func (q *Queue) Prepared() int {
	return int(q.sqLocal - atomic.LoadUint32(q.sqHead))
}

func (q *Queue) prep(e abi.Sqe) error {
	if q.closed {
		return opErr("prep", ErrClosed)
	}
	if q.SQSpace() <= 0 {
		return opErr("prep", ErrSQFull)
	}
	q.sqes[q.sqLocal&q.sqMask] = e
	q.sqLocal++
	return nil
}

// PrepNop prepares a NOP.
func (q *Queue) PrepNop(userData uint64) error {
	return q.prep(abi.Sqe{Opcode: abi.OpNop, User_data: userData})
}

// PrepSend prepares a zero-copy send of region[off, off+length) on sock.
// Two completions follow: the send's (More() set, Res = bytes or -errno)
// and the notification (Notif() set) once the pages are released.
func (q *Queue) PrepSend(sock SockID, key RegionKey, off uint64, length uint32, userData uint64) error {
	return q.prep(abi.Sqe{Opcode: abi.OpSend, Sock: uint32(sock), Region: uint32(key), Off: off, Len: length, User_data: userData})
}

// PrepRecv prepares a receive into region[off, off+length) (at most
// RecvMax bytes are received per operation; Res = bytes, 0 at EOF).
func (q *Queue) PrepRecv(sock SockID, key RegionKey, off uint64, length uint32, userData uint64) error {
	return q.prep(abi.Sqe{Opcode: abi.OpRecv, Sock: uint32(sock), Region: uint32(key), Off: off, Len: length, User_data: userData})
}

// prepRaw prepares an arbitrary entry (tests and fuzzing).
func (q *Queue) prepRaw(e abi.Sqe) error { return q.prep(e) }

// Submit publishes prepared entries and rings the doorbell for up to n of
// them (n < 0: all), then, if waitFor > 0, waits until at least waitFor
// completions are ready or timeout passes (timeout 0: no limit). It
// returns the number of entries the kernel consumed. A wait that times out
// with nothing consumed returns os.ErrDeadlineExceeded; ErrCQFull means
// nothing could be consumed until completions are reaped.
func (q *Queue) Submit(n, waitFor int, timeout time.Duration) (int, error) {
	if q.closed {
		return 0, opErr("submit", ErrClosed)
	}
	atomic.StoreUint32(q.sqTail, q.sqLocal)
	pending := q.Prepared()
	if n < 0 || n > pending {
		n = pending
	}
	if waitFor > int(q.setup.Cq_entries) {
		return 0, opErr("submit", os.NewSyscallError("ioctl", unix.EINVAL))
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	total := 0
	for {
		e := abi.Enter{To_submit: uint32(n)}
		if waitFor > 0 {
			e.Flags = abi.EnterGetevents
			e.Min_complete = uint32(waitFor)
			if timeout > 0 {
				left := time.Until(deadline)
				if left <= 0 {
					left = 1
				}
				e.Timeout_ns = uint64(left)
			}
		}
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(q.fd), uintptr(abi.IocEnter), uintptr(unsafe.Pointer(&e)))
		if errno == 0 {
			total += int(r)
			if waitFor == 0 || q.Ready() >= waitFor {
				return total, nil
			}
			// Entries were consumed but the wait was cut short (signal).
			if timeout > 0 && !time.Now().Before(deadline) {
				return total, opErr("submit", os.ErrDeadlineExceeded)
			}
			n = q.Prepared()
			continue
		}
		switch errno {
		case unix.EINTR:
			n = 0 // nothing was consumed by the interrupted call; keep waiting
			if pending := q.Prepared(); pending > 0 {
				n = pending
			}
			continue
		case unix.ETIME:
			return total, opErr("submit", fmt.Errorf("%w: %w", os.ErrDeadlineExceeded, os.NewSyscallError("ioctl", errno)))
		case unix.EBUSY:
			return total, opErr("submit", fmt.Errorf("%w: %w", ErrCQFull, os.NewSyscallError("ioctl", errno)))
		}
		return total, opErr("submit", os.NewSyscallError("ioctl", errno))
	}
}

// Ready returns how many completions can be read now.
func (q *Queue) Ready() int {
	if q.closed {
		return 0
	}
	return int(atomic.LoadUint32(q.cqTail) - q.cqLocal)
}

// Completions copies ready completions into dst, consumes them, and
// returns how many it copied. It never blocks.
func (q *Queue) Completions(dst []Completion) int {
	if q.closed {
		return 0
	}
	tail := atomic.LoadUint32(q.cqTail)
	n := 0
	for q.cqLocal != tail && n < len(dst) {
		c := &q.cqes[q.cqLocal&q.cqMask]
		dst[n] = Completion{UserData: c.Data, Res: c.Res, Flags: c.Flags}
		q.cqLocal++
		n++
	}
	if n > 0 {
		atomic.StoreUint32(q.cqHead, q.cqLocal)
	}
	return n
}

// Stats returns the module-wide counters.
func (q *Queue) Stats() (Stats, error) {
	if q.closed {
		return Stats{}, opErr("stats", ErrClosed)
	}
	return statsFd(q.fd)
}

// ReadStats opens the device just to read the module-wide counters (the
// opened context itself counts as one live context).
func ReadStats() (Stats, error) {
	fd, err := unix.Open(DevicePath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return Stats{}, opErr("stats", errNoDevice)
		}
		return Stats{}, opErr("stats", os.NewSyscallError("open", err))
	}
	defer unix.Close(fd)
	return statsFd(fd)
}

func statsFd(fd int) (Stats, error) {
	var s abi.Stats
	if _, err := ioctl(fd, abi.IocStats, unsafe.Pointer(&s)); err != nil {
		return Stats{}, opErr("stats", os.NewSyscallError("ioctl", err))
	}
	return Stats{
		Contexts: s.Contexts, Regions: s.Regions, PinnedPages: s.Pinned_pages,
		Socks: s.Socks, Notifs: s.Notifs, Ops: s.Ops,
		ZeroCopySends: s.Zc_sends, CopiedSends: s.Copied_sends,
	}, nil
}

// Mmap allocates page-aligned anonymous memory suitable for a region.
func Mmap(size int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, opErr("mmap", os.NewSyscallError("mmap", err))
	}
	return b, nil
}

// Munmap releases memory from Mmap. Unregister its region and wait for the
// notifications of sends using it first: the kernel keeps its own page
// references, but the memory's contents are what is being sent.
func Munmap(b []byte) error {
	if err := unix.Munmap(b); err != nil {
		return opErr("munmap", os.NewSyscallError("munmap", err))
	}
	return nil
}

// ErrABIMismatch: the loaded module speaks another ABI version than this
// package was generated for: rebuild and reload the module from this tree.
var ErrABIMismatch = errors.New("zcshim: module ABI version differs from this client's")

// Probe reports whether the shim is usable here: nil, or an error matching
// ErrNotSupported (no device: module not loaded or not loadable) or
// ErrABIMismatch. It opens and closes a one-entry queue.
func Probe() error {
	q, err := Open(Config{Entries: 1})
	if err != nil {
		return err
	}
	defer q.Close()
	if q.setup.Abi_version != abi.ABIVersion {
		return opErr("probe", fmt.Errorf("%w: module %d, client %d", ErrABIMismatch, q.setup.Abi_version, abi.ABIVersion))
	}
	return nil
}
