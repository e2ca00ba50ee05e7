package netinfo

import (
	"errors"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/tcpglue"
)

func mustOpen(t *testing.T) *Stack {
	t.Helper()
	s, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func requireInUse(t *testing.T, err error) {
	t.Helper()
	var pe *PortInUseError
	if !errors.As(err, &pe) || !errors.Is(err, unix.EADDRINUSE) {
		t.Fatalf("want *PortInUseError matching EADDRINUSE, got %v", err)
	}
}

// TestReservePort on loopback: port 0 picks a port that then stays taken (exclusively, or
// shared among SO_REUSEADDR reservations), Listen and Take hand the socket over, Close
// frees the port.
func TestReservePort(t *testing.T) {
	s := mustOpen(t)
	lo := netip.MustParseAddr("127.0.0.1")
	p, err := s.ReservePort("tcp4", netip.AddrPortFrom(lo, 0), PortOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ap := p.Addr()
	if ap.Addr() != lo || ap.Port() == 0 {
		t.Fatalf("reserved %s", ap)
	}
	// Exclusive: another reservation and a listener (SO_REUSEADDR on) both fail.
	_, err = s.ReservePort("tcp4", ap, PortOptions{})
	requireInUse(t, err)
	_, err = s.ReservePort("tcp4", ap, PortOptions{Shared: true})
	requireInUse(t, err)
	if _, err := tcpglue.ListenAddrPort("tcp4", ap, tcpglue.ListenOptions{}); !errors.Is(err, unix.EADDRINUSE) {
		t.Fatalf("listen on a reserved port: %v", err)
	}
	// Listen hands over the socket: connections arrive on the reserved port.
	ln, err := p.Listen(0)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := p.Listen(0); !errors.Is(err, errClosed) {
		t.Fatalf("second Listen: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := tcpglue.DialAddrPort(ap, tcpglue.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	ln.Close()

	// Shared: two SO_REUSEADDR reservations of one port coexist; an exclusive one cannot join.
	sp, err := s.ReservePort("tcp4", netip.AddrPortFrom(lo, 0), PortOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	sp2, err := s.ReservePort("tcp4", sp.Addr(), PortOptions{Shared: true})
	if err != nil {
		t.Fatalf("second shared reservation: %v", err)
	}
	sp2.Close()
	_, err = s.ReservePort("tcp4", sp.Addr(), PortOptions{})
	requireInUse(t, err)

	// All addresses: a dual-stack reservation holds the port on 127.0.0.1 and ::1 too.
	all, err := s.ReservePort("tcp", netip.AddrPort{}, PortOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	port := all.Addr().Port()
	_, err = s.ReservePort("tcp4", netip.AddrPortFrom(lo, port), PortOptions{})
	requireInUse(t, err)
	_, err = s.ReservePort("tcp6", netip.AddrPortFrom(netip.IPv6Loopback(), port), PortOptions{})
	requireInUse(t, err)

	// Take: connect from the reserved port (bind before connect).
	srv, err := tcpglue.Listen("tcp4", "127.0.0.1:0", tcpglue.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srvAddr, _ := srv.LocalAddr()
	tp, err := s.ReservePort("tcp4", netip.AddrPortFrom(lo, 0), PortOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sock, err := tp.Take()
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	if err := sock.Connect(srvAddr); err != nil {
		t.Fatal(err)
	}
	if la, _ := sock.LocalAddr(); la != tp.Addr() {
		t.Fatalf("connected from %s, reserved %s", la, tp.Addr())
	}
	if err := tp.Close(); err != nil {
		t.Fatal(err)
	}

	// Release: the port can be reserved again.
	port = ap.Port()
	again, err := s.ReservePort("tcp4", netip.AddrPortFrom(lo, port), PortOptions{Shared: true})
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	again.Close()

	// Bad input.
	if _, err := s.ReservePort("udp", ap, PortOptions{}); err == nil {
		t.Fatal("udp accepted")
	}
	if _, err := s.ReservePort("tcp4", netip.MustParseAddrPort("[::1]:0"), PortOptions{}); err == nil {
		t.Fatal("IPv6 address for tcp4 accepted")
	}
	if _, err := s.ReservePort("tcp6", netip.MustParseAddrPort("127.0.0.1:0"), PortOptions{}); err == nil {
		t.Fatal("IPv4 address for tcp6 accepted")
	}
	if _, err := s.ReservePort("tcp4", netip.MustParseAddrPort("192.0.2.1:0"), PortOptions{}); !errors.Is(err, unix.EADDRNOTAVAIL) {
		t.Fatalf("non-local address: %v", err)
	}
	var np *Port
	if err := np.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReservePortNamespace: a Stack opened in a namespace reserves there (on an address
// only that namespace has).
func TestReservePortNamespace(t *testing.T) {
	tp := newTopo(t)
	p, err := tp.sa.ReservePort("tcp4", netip.MustParseAddrPort("10.9.1.1:0"), PortOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, err = tp.sa.ReservePort("tcp", netip.AddrPortFrom(netip.IPv6Unspecified(), p.Addr().Port()), PortOptions{})
	requireInUse(t, err)
	// The caller's namespace does not have 10.9.1.1.
	if _, err := mustOpen(t).ReservePort("tcp4", netip.MustParseAddrPort("10.9.1.1:0"), PortOptions{}); !errors.Is(err, unix.EADDRNOTAVAIL) {
		t.Fatalf("reservation outside the namespace: %v", err)
	}
}
