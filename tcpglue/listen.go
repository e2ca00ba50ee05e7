package tcpglue

import (
	"errors"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// ListenOptions configures Listen and ListenGroup. The zero value gives a
// blocking listener with SO_REUSEADDR, without SO_REUSEPORT, and the largest
// backlog the kernel allows.
type ListenOptions struct {
	// Backlog for listen(2); <= 0 means unix.SOMAXCONN.
	Backlog int
	// ReusePort sets SO_REUSEPORT so that several sockets can listen on the
	// same address and port (a reuseport group; the kernel, or an
	// SK_REUSEPORT BPF program, picks one per new connection).
	ReusePort bool
	// NoReuseAddr leaves SO_REUSEADDR off (it is on by default, so a restarted
	// server can bind while old connections are in TIME_WAIT).
	NoReuseAddr bool
	// Nonblock creates the listener (and the sockets it accepts) in
	// non-blocking mode.
	Nonblock bool
	// Control, if set, is called after the socket options above are set and
	// before bind(2), to set more options (TCP_MAXSEG, buffer sizes, ...),
	// which accepted sockets inherit. An error closes the socket.
	Control func(*Socket) error
}

// Listen creates a plain TCP (never MPTCP) listening socket on address for
// network "tcp", "tcp4" or "tcp6" (see Resolve for the address forms). With
// network "tcp" a wildcard IPv6 address (:: or empty host) makes a dual-stack
// socket (IPV6_V6ONLY off); with "tcp6" IPV6_V6ONLY is on.
func Listen(network, address string, opts ListenOptions) (*Socket, error) {
	ap, err := Resolve(network, address)
	if err != nil {
		return nil, opErr("listen", -1, nil, err)
	}
	return listenAddr(network, ap, opts)
}

// ListenAddrPort is Listen with an already resolved address.
func ListenAddrPort(network string, ap netip.AddrPort, opts ListenOptions) (*Socket, error) {
	fam, err := networkFamily(network)
	if err != nil {
		return nil, opErr("listen", -1, nil, err)
	}
	a, err := fitFamily(ap.Addr(), fam)
	if err != nil {
		return nil, opErr("listen", -1, net.TCPAddrFromAddrPort(ap), &AddrError{Addr: ap.String(), Reason: err.Error()})
	}
	return listenAddr(network, netip.AddrPortFrom(a, ap.Port()), opts)
}

func listenAddr(network string, ap netip.AddrPort, opts ListenOptions) (*Socket, error) {
	na := net.TCPAddrFromAddrPort(ap)
	family := unix.AF_INET
	if !ap.Addr().Is4() {
		family = unix.AF_INET6
	}
	s, err := NewSocket(family, opts.Nonblock)
	if err != nil {
		var oe *OpError
		if errors.As(err, &oe) {
			oe.Op, oe.Addr = "listen", na
		}
		return nil, err
	}
	fail := func(err error) (*Socket, error) {
		s.Close()
		return nil, err
	}
	if family == unix.AF_INET6 {
		v6only := 1
		if network == "tcp" && ap.Addr().IsUnspecified() || ap.Addr().Is4In6() {
			v6only = 0
		}
		if err := s.setInt("setsockopt IPV6_V6ONLY", unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, v6only); err != nil {
			return fail(err)
		}
	}
	if !opts.NoReuseAddr {
		if err := s.SetReuseAddr(true); err != nil {
			return fail(err)
		}
	}
	if opts.ReusePort {
		if err := s.SetReusePort(true); err != nil {
			return fail(err)
		}
	}
	if opts.Control != nil {
		if err := opts.Control(s); err != nil {
			return fail(opErr("listen control", s.Fd(), na, err))
		}
	}
	if err := s.Bind(ap); err != nil {
		return fail(err)
	}
	if err := s.Listen(opts.Backlog); err != nil {
		return fail(err)
	}
	return s, nil
}

// ListenGroup creates n listening sockets in one SO_REUSEPORT group on
// address (ReusePort is forced on). If the port is 0, the first socket picks
// a free port and the others join it. Each socket is meant for one queue
// (steering picks the queue per connection). On error no socket is left open.
func ListenGroup(network, address string, n int, opts ListenOptions) ([]*Socket, error) {
	if n < 1 || n > 4096 {
		return nil, opErr("listen group", -1, nil, &ValueError{Name: "group size", Value: n, Reason: "want 1..4096"})
	}
	ap, err := Resolve(network, address)
	if err != nil {
		return nil, opErr("listen group", -1, nil, err)
	}
	opts.ReusePort = true
	group := make([]*Socket, 0, n)
	closeAll := func() {
		for _, s := range group {
			s.Close()
		}
	}
	for i := 0; i < n; i++ {
		s, err := listenAddr(network, ap, opts)
		if err != nil {
			closeAll()
			return nil, err
		}
		group = append(group, s)
		if i == 0 && ap.Port() == 0 {
			la, err := s.LocalAddr()
			if err != nil {
				closeAll()
				return nil, err
			}
			ap = netip.AddrPortFrom(ap.Addr(), la.Port())
		}
	}
	return group, nil
}

// DialOptions configures Dial.
type DialOptions struct {
	// LocalAddr, if valid, is bound before connecting.
	LocalAddr netip.AddrPort
	// Nonblock leaves the connected socket in non-blocking mode (the connect
	// itself always waits for the handshake).
	Nonblock bool
	// Control, if set, is called before bind/connect to set options
	// (TCP_MAXSEG, SO_RCVBUF, TCP_CONGESTION, ...). An error closes the socket.
	Control func(*Socket) error
}

// Dial connects a plain TCP socket to address (the fallback path; zc connects
// through io_uring with NewSocket + RawSockaddr). For a name resolving to
// several addresses the first one of the preferred family is used.
func Dial(network, address string, opts DialOptions) (*Socket, error) {
	ap, err := Resolve(network, address)
	if err != nil {
		return nil, opErr("dial", -1, nil, err)
	}
	if ap.Addr().IsUnspecified() {
		// Like net.Dial: an empty or wildcard host means the local system.
		if ap.Addr().Is4() {
			ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), ap.Port())
		} else {
			ap = netip.AddrPortFrom(netip.IPv6Loopback(), ap.Port())
		}
	}
	return DialAddrPort(ap, opts)
}

// DialAddrPort is Dial with an already resolved address.
func DialAddrPort(ap netip.AddrPort, opts DialOptions) (*Socket, error) {
	family := unix.AF_INET
	if !ap.Addr().Unmap().Is4() {
		family = unix.AF_INET6
	}
	s, err := NewSocket(family, false)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Socket, error) {
		s.Close()
		return nil, err
	}
	if opts.Control != nil {
		if err := opts.Control(s); err != nil {
			return fail(opErr("dial control", s.Fd(), net.TCPAddrFromAddrPort(ap), err))
		}
	}
	if opts.LocalAddr.IsValid() {
		if err := s.Bind(opts.LocalAddr); err != nil {
			return fail(err)
		}
	}
	if err := s.Connect(ap); err != nil {
		return fail(err)
	}
	if opts.Nonblock {
		if err := s.SetNonblocking(true); err != nil {
			return fail(err)
		}
	}
	return s, nil
}
