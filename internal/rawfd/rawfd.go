// Package rawfd holds the system calls the module makes on descriptors that no
// tcpglue.Socket owns: pipes for splice, files for sendfile, a socket's duplicate that a
// watcher or an os.File owns, a descriptor accepted and not yet wrapped. zc makes no raw
// system call of its own outside its backends (zc/structure_test.go checks): socket calls go
// through tcpglue, these through here. EINTR is retried (internal/eintr) except by Close.
package rawfd

import (
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/eintr"
)

// Close closes fd. EINTR is not retried: the descriptor is gone either way.
func Close(fd int) error { return unix.Close(fd) }

// Dup duplicates fd (close-on-exec).
func Dup(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// Pipe makes a non-blocking, close-on-exec pipe and asks for size bytes of room
// (F_SETPIPE_SZ); sized is false when the kernel refused the size (above
// /proc/sys/fs/pipe-max-size, or the user's pipe pages used up): the default still works.
func Pipe(size int) (r, w int, sized bool, err error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return -1, -1, false, err
	}
	_, serr := unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, size)
	return fds[0], fds[1], serr == nil, nil
}

// Splice moves up to n bytes from in to out, one of them a pipe (splice(2), SPLICE_F_MOVE,
// SPLICE_F_NONBLOCK): an error matching unix.EAGAIN when in has nothing or out no room.
func Splice(in, out, n int) (int, error) {
	k, err := eintr.Retry1(func() (int64, error) {
		return unix.Splice(in, nil, out, nil, n, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
	})
	return int(k), err
}

// Read is read(2); k is 0 when err is not nil.
func Read(fd int, p []byte) (int, error) {
	k, err := eintr.Retry1(func() (int, error) { return unix.Read(fd, p) })
	if err != nil {
		k = 0
	}
	return k, err
}

// InQueue returns the bytes waiting in a socket's receive queue (SIOCINQ).
func InQueue(fd int) (int, error) { return unix.IoctlGetInt(fd, unix.SIOCINQ) }

// ShutdownWrite shuts a socket's write side (SHUT_WR).
func ShutdownWrite(fd int) error { return unix.Shutdown(fd, unix.SHUT_WR) }

// Shutdown shuts fd's socket down both ways (after a fatal TLS alert: the peer must see the end).
func Shutdown(fd int) error { return unix.Shutdown(fd, unix.SHUT_RDWR) }

// FileInfo returns what sendfile(2) needs to know of a file before it is queued: its type
// bits (unix.S_IFMT of st_mode), size and open flags (F_GETFL).
func FileInfo(fd int) (mode uint32, size int64, flags int, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, 0, 0, err
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return 0, 0, 0, err
	}
	return st.Mode & unix.S_IFMT, st.Size, fl, nil
}
