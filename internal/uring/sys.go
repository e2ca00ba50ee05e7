package uring

import (
	"errors"
	"fmt"
	"github.com/zcnet/zcnet/internal/errs"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/eintr"
)

// ErrNotSupported is returned (wrapped) when this kernel or this process cannot do what was
// asked. Match it with errors.Is. It is the one sentinel every zcnet package shares.
var ErrNotSupported = errs.ErrNotSupported

// SetupError explains why io_uring_setup failed, with the likely cause and fix.
type SetupError struct {
	Flags uint32
	Err   error // *os.SyscallError
}

func (e *SetupError) Error() string {
	var hint string
	switch {
	case errors.Is(e.Err, unix.ENOSYS):
		hint = "this kernel has no io_uring (CONFIG_IO_URING, Linux 5.1+)"
	case errors.Is(e.Err, unix.EPERM):
		hint = "io_uring is blocked: kernel.io_uring_disabled sysctl, or a seccomp profile (Docker's and containerd's defaults block io_uring_setup)"
	case errors.Is(e.Err, unix.ENOMEM):
		hint = "not enough locked memory for the rings: raise RLIMIT_MEMLOCK (ulimit -l)"
	case errors.Is(e.Err, unix.EINVAL):
		hint = fmt.Sprintf("setup flags %#x not accepted by this kernel", e.Flags)
	}
	if hint == "" {
		return e.Err.Error()
	}
	return e.Err.Error() + " (" + hint + ")"
}

func (e *SetupError) Unwrap() []error {
	if errors.Is(e.Err, unix.ENOSYS) || errors.Is(e.Err, unix.EPERM) || errors.Is(e.Err, unix.EINVAL) {
		return []error{e.Err, ErrNotSupported}
	}
	return []error{e.Err}
}

func setup(entries uint32, p *Params) (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0)
	runtime.KeepAlive(p)
	if errno != 0 {
		return -1, &SetupError{Flags: p.Flags, Err: os.NewSyscallError("io_uring_setup", errno)}
	}
	return int(fd), nil
}

// enter wraps io_uring_enter. EINTR is retried when nothing needs to be submitted (a wait);
// otherwise it is returned (submission may have happened partially: the caller re-checks).
func enter(fd int, toSubmit, minComplete, flags uint32, arg unsafe.Pointer, argSz uintptr) (int, error) {
	var n uintptr
	call := func() (errno unix.Errno) {
		n, _, errno = unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(fd), uintptr(toSubmit),
			uintptr(minComplete), uintptr(flags), uintptr(arg), argSz)
		return errno
	}
	var errno unix.Errno
	if toSubmit == 0 {
		errno = eintr.Errno(call)
	} else {
		errno = call()
	}
	if errno != 0 {
		return int(n), errno
	}
	return int(n), nil
}

// register wraps io_uring_register. EINTR and EAGAIN (busy resource update) are retried.
func register(fd int, op uint32, arg unsafe.Pointer, nr uint32) (int, error) {
	for {
		var n uintptr
		errno := eintr.Errno(func() (errno unix.Errno) {
			n, _, errno = unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(fd), uintptr(op), uintptr(arg), uintptr(nr), 0, 0)
			return errno
		})
		if errno == unix.EAGAIN {
			continue
		}
		if errno != 0 {
			return -1, os.NewSyscallError(registerName(op), errno)
		}
		return int(n), nil
	}
}

func registerName(op uint32) string {
	switch op {
	case RegisterBuffers, RegisterBuffers2:
		return "io_uring_register(buffers)"
	case RegisterBuffersUpdate:
		return "io_uring_register(buffers_update)"
	case UnregisterBuffers:
		return "io_uring_register(unregister_buffers)"
	case RegisterFiles, RegisterFiles2:
		return "io_uring_register(files)"
	case RegisterFilesUpdate, RegisterFilesUpdate2:
		return "io_uring_register(files_update)"
	case UnregisterFiles:
		return "io_uring_register(unregister_files)"
	case RegisterEventfd, RegisterEventfdAsync:
		return "io_uring_register(eventfd)"
	case UnregisterEventfd:
		return "io_uring_register(unregister_eventfd)"
	case RegisterProbe:
		return "io_uring_register(probe)"
	case RegisterPbufRing:
		return "io_uring_register(pbuf_ring)"
	case UnregisterPbufRing:
		return "io_uring_register(unregister_pbuf_ring)"
	case RegisterRingFds:
		return "io_uring_register(ring_fds)"
	case UnregisterRingFds:
		return "io_uring_register(unregister_ring_fds)"
	case RegisterZcrxIfq:
		return "io_uring_register(zcrx_ifq)"
	case RegisterZcrxCtrl:
		return "io_uring_register(zcrx_ctrl)"
	case RegisterQuery:
		return "io_uring_register(query)"
	}
	return fmt.Sprintf("io_uring_register(%d)", op)
}

// escape makes x (a pointer, a slice) escape to the heap. Memory the kernel reaches through
// an address stored in an argument struct (a uint64, not a pointer) must not live on a
// goroutine stack: the compiler does not see the address, and a stack that grows is copied
// elsewhere, so the kernel would read or write the old copy. Heap objects do not move;
// runtime.KeepAlive after the call keeps them from being collected during it. (The
// runtime's own escapes() is the model: the store never runs, but escape analysis cannot
// know that.)
func escape(x any) {
	if escapeSink.never {
		escapeSink.x = x
	}
}

var escapeSink struct {
	never bool
	x     any
}
