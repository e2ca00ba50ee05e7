package netinfo

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/tcpglue"
)

// PortOptions tune ReservePort.
type PortOptions struct {
	// Shared sets SO_REUSEADDR on the reserving socket. Linux then lets other TCP sockets
	// that also set SO_REUSEADDR bind the same address and port while none of them
	// listens (and lets the reservation bind over connections in TIME_WAIT). Without it
	// (the default) the reservation is exclusive: every other bind of the port on an
	// overlapping address fails with EADDRINUSE, with or without SO_REUSEADDR, and the
	// kernel's ephemeral port choice for outgoing connections skips it.
	Shared bool
}

// PortInUseError reports a port another socket holds. It matches unix.EADDRINUSE.
type PortInUseError struct {
	Addr netip.AddrPort
	Err  error // the bind error (*tcpglue.OpError wrapping EADDRINUSE)
}

func (e *PortInUseError) Error() string {
	return fmt.Sprintf("port %d on %s is in use", e.Addr.Port(), e.Addr.Addr())
}

// Unwrap returns the bind error.
func (e *PortInUseError) Unwrap() error { return e.Err }

// Port is a reserved TCP port: a socket bound to the address and port, not listening. It
// holds the port until Close, Listen or Take.
type Port struct {
	mu   sync.Mutex
	s    *tcpglue.Socket
	addr netip.AddrPort
}

// ReservePort reserves a TCP port on network "tcp", "tcp4" or "tcp6". addr's port 0 means
// any free port (the kernel picks one from net.ipv4.ip_local_port_range); an unspecified
// address means all addresses: 0.0.0.0 for "tcp4", :: for "tcp6" (IPv6 only), and for
// "tcp" both families (a dual-stack :: socket). A port another socket holds gives an
// *OpError wrapping *PortInUseError (matching unix.EADDRINUSE); an address that is not
// local gives one matching unix.EADDRNOTAVAIL. The socket is created in the Stack's
// namespace.
func (s *Stack) ReservePort(network string, addr netip.AddrPort, opts PortOptions) (*Port, error) {
	const op = "reserve port"
	target := network + " " + addr.String()
	fam := unix.AF_INET6
	switch network {
	case "tcp4":
		fam = unix.AF_INET
	case "tcp6":
	case "tcp":
		if addr.Addr().Unmap().Is4() {
			fam = unix.AF_INET
		}
	default:
		return nil, opErr(op, target, fmt.Errorf(`unknown network %q (want "tcp", "tcp4" or "tcp6")`, network))
	}
	a := addr.Addr()
	switch {
	case !a.IsValid() && fam == unix.AF_INET:
		a = netip.IPv4Unspecified()
	case !a.IsValid():
		a = netip.IPv6Unspecified()
	case fam == unix.AF_INET:
		if !a.Unmap().Is4() {
			return nil, opErr(op, target, errors.New("IPv6 address for network tcp4"))
		}
		a = a.Unmap()
	case a.Is4():
		return nil, opErr(op, target, errors.New("IPv4 address for network tcp6"))
	}
	bindTo := netip.AddrPortFrom(a, addr.Port())
	var sock *tcpglue.Socket
	s.mu.Lock()
	ns, closed := s.ns, s.closed
	if !closed {
		// Created while the Stack (and its namespace descriptor) is certainly open.
		err := netns.Do(ns, func() (err error) {
			sock, err = tcpglue.NewSocket(fam, false)
			return err
		})
		if err != nil {
			s.mu.Unlock()
			return nil, opErr(op, target, err)
		}
	}
	s.mu.Unlock()
	if closed {
		return nil, opErr(op, target, errClosed)
	}
	fail := func(err error) (*Port, error) {
		sock.Close()
		return nil, opErr(op, target, err)
	}
	err := sock.Control(func(fd int) error {
		if fam == unix.AF_INET6 {
			v6only := 1
			if network == "tcp" && a.IsUnspecified() {
				v6only = 0
			}
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, v6only); err != nil {
				return fmt.Errorf("setsockopt IPV6_V6ONLY: %w", err)
			}
		}
		if opts.Shared {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
				return fmt.Errorf("setsockopt SO_REUSEADDR: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if err := sock.Bind(bindTo); err != nil {
		if errors.Is(err, unix.EADDRINUSE) {
			return fail(&PortInUseError{Addr: bindTo, Err: err})
		}
		return fail(err)
	}
	local, err := sock.LocalAddr()
	if err != nil {
		return fail(err)
	}
	return &Port{s: sock, addr: local}, nil
}

// Addr is the reserved address and port (the port the kernel picked for port 0).
func (p *Port) Addr() netip.AddrPort { return p.addr }

func (p *Port) take(op string) (*tcpglue.Socket, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.s == nil {
		return nil, opErr(op, p.addr.String(), errClosed)
	}
	s := p.s
	p.s = nil
	return s, nil
}

// Listen turns the reservation into a listening socket on the reserved port (backlog <= 0:
// SOMAXCONN) and hands it to the caller, who then owns it; the Port is spent. No other
// socket could take the port in between.
func (p *Port) Listen(backlog int) (*tcpglue.Socket, error) {
	s, err := p.take("listen")
	if err != nil {
		return nil, err
	}
	if err := s.Listen(backlog); err != nil {
		s.Close()
		return nil, opErr("listen", p.addr.String(), err)
	}
	return s, nil
}

// Take hands the bound socket to the caller (for example to connect from the reserved
// port: bind-before-connect); the Port is spent.
func (p *Port) Take() (*tcpglue.Socket, error) { return p.take("take") }

// Close releases the port. It is idempotent and does nothing after Listen or Take.
func (p *Port) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	s := p.s
	p.s = nil
	p.mu.Unlock()
	if s == nil {
		return nil
	}
	return s.Close()
}
