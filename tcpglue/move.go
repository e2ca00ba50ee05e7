package tcpglue

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/eintr"
)

// Calls that move bytes between a socket and other descriptors without waiting, and the
// socket's descriptor for a watcher of its own: what an event loop that owns the socket
// (zc's) does between its readiness events; and WaitWritable, a wait for room for a sender
// with no poller of its own. EINTR is retried; a socket that cannot take or give more
// returns an error matching unix.EAGAIN (TryWrite: 0 and nil).

// TryWrite is one write(2). On a non-blocking socket it does not wait: it returns how many
// bytes of p the socket took, and 0 with a nil error when its send buffer is full. (On a
// blocking socket it waits for room as write(2) does, and may return a short count.)
func (s *Socket) TryWrite(p []byte) (int, error) {
	fd, err := s.incref("write")
	if err != nil {
		return 0, err
	}
	defer s.decref()
	n, err := eintr.Retry1(func() (int, error) { return unix.Write(fd, p) })
	switch err {
	case nil:
		return n, nil
	case unix.EAGAIN:
		return 0, nil
	}
	return 0, opErr("write", fd, nil, s.closedOr(sysErr("write", err)))
}

// SendFile sends up to n bytes (n > 0) of the file open on descriptor file, from *off, with
// sendfile(2), and advances *off by what it sent (off nil: from the file's own offset). 0
// bytes and a nil error is the end of the file.
func (s *Socket) SendFile(file int, off *int64, n int) (int, error) {
	if n <= 0 {
		return 0, invalid("sendfile", "n", n, "want > 0 (0 bytes sent reads as the end of the file)")
	}
	fd, err := s.incref("sendfile")
	if err != nil {
		return 0, err
	}
	defer s.decref()
	k, err := eintr.Retry1(func() (int, error) { return unix.Sendfile(fd, file, off, n) })
	if err != nil {
		return 0, opErr("sendfile", fd, nil, s.closedOr(sysErr("sendfile", err)))
	}
	return k, nil
}

// SpliceFrom moves up to n bytes (n > 0) from the read end of a pipe into the socket
// (splice(2), SPLICE_F_MOVE, SPLICE_F_NONBLOCK): an error matching unix.EAGAIN when the pipe
// is empty or the socket full, 0 and nil when the pipe's write end is closed and it is empty.
func (s *Socket) SpliceFrom(pipe int, n int) (int, error) {
	if n <= 0 {
		return 0, invalid("splice", "n", n, "want > 0 (0 bytes moved reads as the pipe's end)")
	}
	fd, err := s.incref("splice")
	if err != nil {
		return 0, err
	}
	defer s.decref()
	k, err := eintr.Retry1(func() (int64, error) {
		return unix.Splice(pipe, nil, fd, nil, n, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
	})
	if err != nil {
		return 0, opErr("splice", fd, nil, s.closedOr(sysErr("splice", err)))
	}
	return int(k), nil
}

// WaitWritable waits, at most timeout (negative: without a bound), until the socket can take
// more bytes: true when it can, false and a nil error when the time ran out. A connection
// that failed or was shut down (POLLERR, POLLHUP) gives an error matching unix.EPIPE; a
// Close during the wait wakes it (net.ErrClosed). For a sender that found the socket full
// (EAGAIN from SendFile, SpliceFrom, Write) and has no poller of its own. An unconnected
// socket gives the EPIPE error at once; a listening one never has room (only the timeout
// or a Close ends the wait).
func (s *Socket) WaitWritable(timeout time.Duration) (bool, error) {
	fd, err := s.incref("poll")
	if err != nil {
		return false, err
	}
	defer s.decref()
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	n, err := eintr.Poll(pfd, timeout)
	switch {
	case err != nil:
		return false, opErr("poll", fd, nil, s.closedOr(sysErr("poll", err)))
	case pfd[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0:
		return false, opErr("poll", fd, nil, s.closedOr(sysErr("poll", unix.EPIPE)))
	}
	return n > 0 && pfd[0].Revents&unix.POLLOUT != 0, nil
}

// Dup returns a duplicate of the socket's descriptor (close-on-exec), the caller's to close:
// for a watcher (an epoll, a poll) that must not register the socket's own descriptor.
func (s *Socket) Dup() (int, error) {
	fd, err := s.incref("dup")
	if err != nil {
		return -1, err
	}
	defer s.decref()
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, opErr("dup", fd, nil, sysErr("fcntl", err))
	}
	return d, nil
}
