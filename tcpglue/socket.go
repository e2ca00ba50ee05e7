package tcpglue

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/eintr"
)

// Socket owns one TCP socket file descriptor (IPPROTO_TCP, never MPTCP).
//
// All methods are safe for concurrent use. Every operation holds a reference
// on the descriptor for its duration, so Close never closes a descriptor a
// system call is still using: Close marks the socket closed, wakes blocked
// calls with shutdown(2) when there are any, and the descriptor is closed as
// soon as the last in-flight call returns. Operations started after Close fail
// with an *OpError whose Err is net.ErrClosed.
type Socket struct {
	mu       sync.Mutex
	fd       int
	refs     int
	closing  bool
	family   int
	nonblock bool
	cleanup  runtime.Cleanup
}

// safetyNetCloses counts descriptors closed by the cleanup of a Socket that
// was dropped without Close (a bug in the caller; tests fail on it).
var safetyNetCloses atomic.Int64

// Socket creation flags: always close-on-exec.
const sockFlags = unix.SOCK_STREAM | unix.SOCK_CLOEXEC

// NewSocket creates an unconnected TCP socket of the given family
// (unix.AF_INET or unix.AF_INET6). With nonblock, the descriptor is in
// non-blocking mode (what io_uring and epoll users want); otherwise
// Accept/Connect/Read/Write block.
func NewSocket(family int, nonblock bool) (*Socket, error) {
	if family != unix.AF_INET && family != unix.AF_INET6 {
		return nil, opErr("socket", -1, nil, &ValueError{Name: "family", Value: family, Reason: "want unix.AF_INET (2) or unix.AF_INET6 (10)"})
	}
	typ := sockFlags
	if nonblock {
		typ |= unix.SOCK_NONBLOCK
	}
	fd, err := unix.Socket(family, typ, unix.IPPROTO_TCP)
	if err != nil {
		if errors.Is(err, unix.EAFNOSUPPORT) {
			err = errors.Join(sysErr("socket", err), ErrNotSupported)
			return nil, opErr("socket", -1, nil, err)
		}
		return nil, opErr("socket", -1, nil, sysErr("socket", err))
	}
	return newSocket(fd, family, nonblock), nil
}

func newSocket(fd, family int, nonblock bool) *Socket {
	s := &Socket{fd: fd, family: family, nonblock: nonblock}
	// Safety net only: a Socket dropped without Close still releases its fd.
	s.cleanup = runtime.AddCleanup(s, func(fd int) {
		safetyNetCloses.Add(1)
		unix.Close(fd)
	}, fd)
	return s
}

// FromFD takes ownership of fd, which must be a TCP socket (SOCK_STREAM,
// IPPROTO_TCP, AF_INET or AF_INET6) — for example one accepted through
// io_uring. On error the caller keeps ownership of fd; on success the
// returned Socket owns it and the caller must not close it.
func FromFD(fd int) (*Socket, error) {
	if fd < 0 {
		return nil, opErr("fromfd", fd, nil, &ValueError{Name: "fd", Value: fd, Reason: "negative"})
	}
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return nil, opErr("fromfd", fd, nil, sysErr("getsockopt SO_DOMAIN", err))
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return nil, opErr("fromfd", fd, nil, sysErr("getsockopt SO_TYPE", err))
	}
	proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		return nil, opErr("fromfd", fd, nil, sysErr("getsockopt SO_PROTOCOL", err))
	}
	if dom != unix.AF_INET && dom != unix.AF_INET6 {
		return nil, opErr("fromfd", fd, nil, &ValueError{Name: "socket family", Value: dom, Reason: "not AF_INET or AF_INET6"})
	}
	if typ != unix.SOCK_STREAM || proto != unix.IPPROTO_TCP {
		return nil, opErr("fromfd", fd, nil, &ValueError{Name: "socket protocol", Value: proto,
			Reason: "not a plain TCP socket (want SOCK_STREAM/IPPROTO_TCP; MPTCP is 262)"})
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return nil, opErr("fromfd", fd, nil, sysErr("fcntl", err))
	}
	return newSocket(fd, dom, fl&unix.O_NONBLOCK != 0), nil
}

// FromAcceptedFD takes ownership of fd, a connection accepted (for example
// by io_uring ACCEPT) from a tcpglue listener of the given family, without
// the checking system calls FromFD makes. nonblock must say whether the
// descriptor is in non-blocking mode (SOCK_NONBLOCK in the accept flags).
// On error the caller keeps ownership of fd.
func FromAcceptedFD(fd, family int, nonblock bool) (*Socket, error) {
	if fd < 0 {
		return nil, opErr("fromfd", fd, nil, &ValueError{Name: "fd", Value: fd, Reason: "negative"})
	}
	if family != unix.AF_INET && family != unix.AF_INET6 {
		return nil, opErr("fromfd", fd, nil, &ValueError{Name: "family", Value: family, Reason: "want unix.AF_INET or unix.AF_INET6"})
	}
	return newSocket(fd, family, nonblock), nil
}

// incref takes a reference on the descriptor for one operation.
func (s *Socket) incref(op string) (int, error) {
	if s == nil {
		return -1, opErr(op, -1, nil, net.ErrClosed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return -1, opErr(op, -1, nil, net.ErrClosed)
	}
	s.refs++
	return s.fd, nil
}

// decref drops a reference; the last one after Close closes the descriptor.
func (s *Socket) decref() {
	s.mu.Lock()
	s.refs--
	fd := -1
	if s.closing && s.refs == 0 && s.fd >= 0 {
		fd = s.fd
		s.fd = -1
	}
	s.mu.Unlock()
	if fd >= 0 {
		unix.Close(fd)
	}
}

// isClosing reports whether Close has been called.
func (s *Socket) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// Close closes the socket. It is idempotent and nil-safe: the second and
// later calls return an *OpError wrapping net.ErrClosed (a nil Socket returns
// nil). If other goroutines are blocked in calls on the socket, Close shuts
// the socket down to wake them and the descriptor is closed when the last of
// them returns. EINTR from close(2) is not retried (the descriptor is gone
// either way).
func (s *Socket) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return opErr("close", -1, nil, net.ErrClosed)
	}
	s.closing = true
	s.cleanup.Stop()
	fd := s.fd
	if s.refs > 0 {
		// Wake blocked accept/recv/send; decref closes.
		unix.Shutdown(fd, unix.SHUT_RDWR)
		s.mu.Unlock()
		return nil
	}
	s.fd = -1
	s.mu.Unlock()
	if err := unix.Close(fd); err != nil && !errors.Is(err, unix.EINTR) {
		return opErr("close", fd, nil, sysErr("close", err))
	}
	return nil
}

// Disown gives up ownership: it returns the descriptor, which the caller must
// close, and leaves the Socket closed (later calls return net.ErrClosed). It
// fails with EBUSY while other calls are in flight on the socket.
func (s *Socket) Disown() (int, error) {
	if s == nil {
		return -1, opErr("disown", -1, nil, net.ErrClosed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return -1, opErr("disown", -1, nil, net.ErrClosed)
	}
	if s.refs > 0 {
		return -1, opErr("disown", s.fd, nil, sysErr("disown", unix.EBUSY))
	}
	s.closing = true
	s.cleanup.Stop()
	fd := s.fd
	s.fd = -1
	return fd, nil
}

// Fd returns the descriptor number for use in io_uring SQEs and other raw
// calls, or -1 after Close. The Socket still owns it: do not close it, and
// keep the Socket reachable (and not closed) until the kernel is done with it.
// Prefer Control for synchronous calls, which cannot race Close.
func (s *Socket) Fd() int {
	if s == nil {
		return -1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return -1
	}
	return s.fd
}

// Control calls fn with the descriptor while holding a reference, so a
// concurrent Close cannot close (and the kernel cannot reuse) the descriptor
// during fn. fn must not close it or keep it.
func (s *Socket) Control(fn func(fd int) error) error {
	fd, err := s.incref("control")
	if err != nil {
		return err
	}
	defer s.decref()
	return fn(fd)
}

// Family returns unix.AF_INET or unix.AF_INET6.
func (s *Socket) Family() int {
	if s == nil {
		return 0
	}
	return s.family
}

// Nonblocking reports whether the descriptor is in non-blocking mode.
func (s *Socket) Nonblocking() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nonblock
}

// SetNonblocking switches the descriptor between blocking and non-blocking
// mode. Calls already blocked are not affected.
func (s *Socket) SetNonblocking(nonblock bool) error {
	fd, err := s.incref("set nonblock")
	if err != nil {
		return err
	}
	defer s.decref()
	if err := unix.SetNonblock(fd, nonblock); err != nil {
		return opErr("set nonblock", fd, nil, sysErr("fcntl", err))
	}
	s.mu.Lock()
	s.nonblock = nonblock
	s.mu.Unlock()
	return nil
}

// closedOr maps an error from a call interrupted by Close to net.ErrClosed.
func (s *Socket) closedOr(err error) error {
	if s.isClosing() {
		return net.ErrClosed
	}
	return err
}

// Bind binds the socket to addr.
func (s *Socket) Bind(addr netip.AddrPort) error {
	fd, err := s.incref("bind")
	if err != nil {
		return err
	}
	defer s.decref()
	sa, err := Sockaddr(addr, s.family)
	if err != nil {
		return opErr("bind", fd, net.TCPAddrFromAddrPort(addr), err)
	}
	if err := unix.Bind(fd, sa); err != nil {
		return opErr("bind", fd, net.TCPAddrFromAddrPort(addr), sysErr("bind", hintErr(err)))
	}
	return nil
}

// Listen puts a bound socket into the listening state. backlog <= 0 means
// unix.SOMAXCONN (the kernel caps it at net.core.somaxconn).
func (s *Socket) Listen(backlog int) error {
	fd, err := s.incref("listen")
	if err != nil {
		return err
	}
	defer s.decref()
	if backlog <= 0 {
		backlog = unix.SOMAXCONN
	}
	if err := unix.Listen(fd, backlog); err != nil {
		return opErr("listen", fd, nil, sysErr("listen", err))
	}
	return nil
}

// Accept takes one connection from a listening socket with accept4(2). The
// new Socket is close-on-exec and non-blocking iff the listener is. On a
// blocking listener it waits (and is woken by Close); on a non-blocking one
// it returns an error matching unix.EAGAIN when no connection is pending.
// ECONNABORTED (a connection reset before it was accepted) is skipped.
func (s *Socket) Accept() (*Socket, netip.AddrPort, error) {
	fd, err := s.incref("accept")
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	defer s.decref()
	flags := unix.SOCK_CLOEXEC
	nb := s.Nonblocking()
	if nb {
		flags |= unix.SOCK_NONBLOCK
	}
	for {
		nfd, sa, err := unix.Accept4(fd, flags)
		if err == nil {
			ap, _ := AddrPortFromSockaddr(sa)
			return newSocket(nfd, s.family, nb), ap, nil
		}
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
			if s.isClosing() {
				return nil, netip.AddrPort{}, opErr("accept", fd, nil, net.ErrClosed)
			}
			continue
		}
		return nil, netip.AddrPort{}, opErr("accept", fd, nil, s.closedOr(sysErr("accept4", err)))
	}
}

// Connect connects the socket to addr (the plain, non-io_uring path). On a
// blocking socket it waits for the handshake (EINTR is handled by waiting for
// the connection to finish). On a non-blocking socket it returns an error
// matching unix.EINPROGRESS; wait for POLLOUT and then call SocketError.
func (s *Socket) Connect(addr netip.AddrPort) error {
	fd, err := s.incref("connect")
	if err != nil {
		return err
	}
	defer s.decref()
	na := net.TCPAddrFromAddrPort(addr)
	sa, err := Sockaddr(addr, s.family)
	if err != nil {
		return opErr("connect", fd, na, err)
	}
	err = unix.Connect(fd, sa)
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EINTR) && !s.Nonblocking() {
		// The handshake continues in the kernel: wait for it.
		if err := waitFd(fd, unix.POLLOUT); err != nil {
			return opErr("connect", fd, na, s.closedOr(err))
		}
		soerr, gerr := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if gerr != nil {
			return opErr("connect", fd, na, sysErr("getsockopt SO_ERROR", gerr))
		}
		if soerr != 0 {
			return opErr("connect", fd, na, sysErr("connect", unix.Errno(soerr)))
		}
		return nil
	}
	return opErr("connect", fd, na, s.closedOr(sysErr("connect", err)))
}

// SocketError reads and clears SO_ERROR: the result of a non-blocking
// connect, or a pending asynchronous error. nil means no error.
func (s *Socket) SocketError() error {
	v, err := s.getInt("getsockopt SO_ERROR", unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return err
	}
	if v != 0 {
		return opErr("socket error", s.Fd(), nil, sysErr("connect", unix.Errno(v)))
	}
	return nil
}

// waitFd polls one descriptor for events, retrying EINTR.
func waitFd(fd int, events int16) error {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: events}}
	if _, err := eintr.Poll(pfd, -1); err != nil {
		return sysErr("poll", err)
	}
	return nil
}

// Read reads into p with read(2). It returns io.EOF (bare) at end of stream.
// On a non-blocking socket with nothing to read it returns an error matching
// unix.EAGAIN.
func (s *Socket) Read(p []byte) (int, error) {
	return s.Recv(p, 0)
}

// Recv is recv(2) with flags (unix.MSG_*). It returns io.EOF (bare) when the
// peer has finished sending and len(p) > 0.
func (s *Socket) Recv(p []byte, flags int) (int, error) {
	fd, err := s.incref("read")
	if err != nil {
		return 0, err
	}
	defer s.decref()
	n, err := recvFlags(fd, p, flags)
	if err != nil {
		return 0, opErr("read", fd, nil, s.closedOr(sysErr("recvfrom", err)))
	}
	if n == 0 && len(p) > 0 {
		if s.isClosing() {
			// Woken by Close's shutdown, not by the peer.
			return 0, opErr("read", fd, nil, net.ErrClosed)
		}
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p with write(2) on a blocking socket; on a non-blocking
// socket it writes what fits and returns an error matching unix.EAGAIN with
// the count written so far.
func (s *Socket) Write(p []byte) (int, error) {
	total := 0
	for total < len(p) {
		n, err := s.Send(p[total:], 0)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// Send is one send(2) call with flags (MSG_NOSIGNAL is always added; use
// unix.MSG_ZEROCOPY after SetZeroCopy(true) for zero-copy sends, whose
// completions arrive on the error queue). It may write less than len(p).
func (s *Socket) Send(p []byte, flags int) (int, error) {
	fd, err := s.incref("write")
	if err != nil {
		return 0, err
	}
	defer s.decref()
	n, err := eintr.Retry1(func() (int, error) { return unix.SendmsgN(fd, p, nil, nil, flags|unix.MSG_NOSIGNAL) })
	if err != nil {
		return 0, opErr("write", fd, nil, s.closedOr(sysErr("sendmsg", err)))
	}
	return n, nil
}

// Shutdown shuts down the read side, the write side or both
// (unix.SHUT_RD, unix.SHUT_WR, unix.SHUT_RDWR).
func (s *Socket) Shutdown(how int) error {
	fd, err := s.incref("shutdown")
	if err != nil {
		return err
	}
	defer s.decref()
	if how != unix.SHUT_RD && how != unix.SHUT_WR && how != unix.SHUT_RDWR {
		return opErr("shutdown", fd, nil, &ValueError{Name: "how", Value: how, Reason: "want SHUT_RD, SHUT_WR or SHUT_RDWR"})
	}
	if err := unix.Shutdown(fd, how); err != nil {
		return opErr("shutdown", fd, nil, sysErr("shutdown", err))
	}
	return nil
}

// LocalAddr returns the address the socket is bound to (getsockname). It does not
// allocate (an IPv6 zone name lookup aside).
func (s *Socket) LocalAddr() (netip.AddrPort, error) {
	fd, err := s.incref("getsockname")
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer s.decref()
	ap, err := sockName(fd, unix.SYS_GETSOCKNAME)
	if err != nil {
		if e, ok := err.(unix.Errno); ok {
			err = sysErr("getsockname", e)
		}
		return netip.AddrPort{}, opErr("getsockname", fd, nil, err)
	}
	return ap, nil
}

// RemoteAddr returns the peer's address (getpeername), without allocating.
func (s *Socket) RemoteAddr() (netip.AddrPort, error) {
	fd, err := s.incref("getpeername")
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer s.decref()
	ap, err := sockName(fd, unix.SYS_GETPEERNAME)
	if err != nil {
		if e, ok := err.(unix.Errno); ok {
			err = sysErr("getpeername", e)
		}
		return netip.AddrPort{}, opErr("getpeername", fd, nil, err)
	}
	return ap, nil
}

// hintErr adds likely fixes to common errnos without hiding them.
func hintErr(err error) error {
	switch {
	case errors.Is(err, unix.EADDRINUSE):
		return &hinted{err, "address in use (another listener without SO_REUSEPORT, or a socket in TIME_WAIT without SO_REUSEADDR)"}
	case errors.Is(err, unix.EADDRNOTAVAIL):
		return &hinted{err, "address not available on this host"}
	}
	return err
}

type hinted struct {
	err  error
	hint string
}

func (h *hinted) Error() string { return h.err.Error() + " (" + h.hint + ")" }
func (h *hinted) Unwrap() error { return h.err }
