package modes

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// Syscall is the C-style baseline inside Go: blocking sockets used straight through
// read(2)/write(2) (send/recv with no flags) on raw file descriptors, one goroutine
// (and so one OS thread) per connection, no netpoller. TCP_NODELAY is on as in every
// mode.
//
// With Buf > 0 ("syscall-buf", bulk and stream only) the sender collects frames in a
// buffer of Buf bytes and writes it with one write(2) when full, as a C program with its
// own output buffer does (UserBatch).
type Syscall struct{ Buf int }

// Name implements harness.Mode.
func (s Syscall) Name() string {
	if s.Buf > 0 {
		return "syscall-buf"
	}
	return "syscall"
}

// Available implements harness.Mode.
func (Syscall) Available() error { return nil }

// Server implements harness.Mode.
func (Syscall) Server(_ context.Context, c harness.Case, m *harness.Meter, ready func(string)) error {
	ap, err := netip.ParseAddrPort(c.Addr)
	if err != nil {
		return err
	}
	fd, err := socketFor(ap)
	if err != nil {
		return err
	}
	ln := &fdListener{fd: fd}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		ln.Close()
		return fmt.Errorf("SO_REUSEADDR: %w", err)
	}
	if err := unix.Bind(fd, sockaddr(ap)); err != nil {
		ln.Close()
		return fmt.Errorf("bind %s: %w", ap, err)
	}
	if err := unix.Listen(fd, 1024); err != nil {
		ln.Close()
		return fmt.Errorf("listen: %w", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		ln.Close()
		return fmt.Errorf("getsockname: %w", err)
	}
	ln.addr = addrPort(sa).String()
	return serve(c, m, ln, ready)
}

// Client implements harness.Mode.
func (sc Syscall) Client(_ context.Context, c harness.Case, m *harness.Meter) error {
	ap, err := netip.ParseAddrPort(c.Addr)
	if err != nil {
		return err
	}
	return drive(c, m, sc.Buf, func() (stream, error) {
		fd, err := socketFor(ap)
		if err != nil {
			return nil, err
		}
		if err := ignoringEINTR(func() error { return unix.Connect(fd, sockaddr(ap)) }); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("connect: %w", err)
		}
		return newFDConn(fd)
	})
}

func socketFor(ap netip.AddrPort) (int, error) {
	family := unix.AF_INET
	if ap.Addr().Is6() && !ap.Addr().Is4In6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	return fd, nil
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	a := ap.Addr().Unmap()
	if a.Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
}

func addrPort(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

func ignoringEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

type fdListener struct {
	fd   int
	addr string
	once sync.Once
}

func (l *fdListener) Accept() (stream, error) {
	for {
		nfd, _, err := unix.Accept4(l.fd, unix.SOCK_CLOEXEC)
		if err == unix.EINTR || err == unix.ECONNABORTED {
			continue
		}
		if err != nil {
			return nil, err
		}
		return newFDConn(nfd)
	}
}

func (l *fdListener) Addr() string { return l.addr }

func (l *fdListener) Close() error {
	var err error
	l.once.Do(func() { err = unix.Close(l.fd) })
	return err
}

// fdConn is a blocking connected socket. It belongs to one goroutine.
type fdConn struct {
	fd     int
	closed bool
}

func newFDConn(fd int) (*fdConn, error) {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TCP_NODELAY: %w", err)
	}
	return &fdConn{fd: fd}, nil
}

func (c *fdConn) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(c.fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 && len(p) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

func (c *fdConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Write(c.fd, p[done:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

func (c *fdConn) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	return unix.Close(c.fd) // never retried on EINTR
}

// Supports implements harness.ScenarioSupporter: a thread per connection is the C-style
// baseline for one stream and 64 echo connections, not for thousands of connections, a
// file send or HTTP.
func (sc Syscall) Supports(s harness.Scenario) bool {
	if sc.Buf > 0 {
		return s == harness.Bulk || s == harness.Stream
	}
	switch s {
	case harness.Bulk, harness.Stream, harness.Echo, harness.PingPong:
		return true
	}
	return false
}
