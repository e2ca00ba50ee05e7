package tcpglue

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sockaddr converts ap to a unix.Sockaddr for a socket of the given family.
// family 0 picks the address's own family. An IPv4 address on an AF_INET6
// socket becomes the v4-mapped form (::ffff:a.b.c.d); a v4-mapped address on
// an AF_INET socket is unmapped; a real IPv6 address on an AF_INET socket is
// an *AddrError. An IPv6 zone is resolved to an interface index (numeric zones
// are accepted as is).
func Sockaddr(ap netip.AddrPort, family int) (unix.Sockaddr, error) {
	a := ap.Addr()
	if !a.IsValid() {
		return nil, &AddrError{Addr: ap.String(), Reason: "invalid (zero) address"}
	}
	if family == 0 {
		family = unix.AF_INET6
		if a.Unmap().Is4() {
			family = unix.AF_INET
		}
	}
	switch family {
	case unix.AF_INET:
		u := a.Unmap()
		if !u.Is4() {
			return nil, &AddrError{Addr: ap.String(), Reason: "IPv6 address on an IPv4 (AF_INET) socket"}
		}
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: u.As4()}, nil
	case unix.AF_INET6:
		sa := &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
		if z := a.Zone(); z != "" {
			id, err := zoneIndex(z)
			if err != nil {
				return nil, &AddrError{Addr: ap.String(), Reason: "unknown zone: " + err.Error()}
			}
			sa.ZoneId = id
		}
		return sa, nil
	}
	return nil, &ValueError{Name: "family", Value: family, Reason: "want unix.AF_INET or unix.AF_INET6"}
}

func zoneIndex(z string) (uint32, error) {
	if n, err := strconv.ParseUint(z, 10, 32); err == nil {
		return uint32(n), nil
	}
	ifi, err := net.InterfaceByName(z)
	if err != nil {
		return 0, err
	}
	return uint32(ifi.Index), nil
}

func zoneName(id uint32) string {
	if id == 0 {
		return ""
	}
	if ifi, err := net.InterfaceByIndex(int(id)); err == nil {
		return ifi.Name
	}
	return strconv.FormatUint(uint64(id), 10)
}

// AddrFamily returns the socket family to use for ap: unix.AF_INET for IPv4
// and IPv4-mapped IPv6 addresses, unix.AF_INET6 otherwise (0 for the zero
// AddrPort).
func AddrFamily(ap netip.AddrPort) int {
	switch a := ap.Addr(); {
	case !a.IsValid():
		return 0
	case a.Unmap().Is4():
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// AddrPortFromSockaddr converts an AF_INET or AF_INET6 unix.Sockaddr.
// IPv4-mapped IPv6 addresses are returned unmapped (as IPv4).
func AddrPortFromSockaddr(sa unix.Sockaddr) (netip.AddrPort, error) {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)), nil
	case *unix.SockaddrInet6:
		a := netip.AddrFrom16(sa.Addr)
		if a.Is4In6() {
			a = a.Unmap()
		} else if sa.ZoneId != 0 {
			a = a.WithZone(zoneName(sa.ZoneId))
		}
		return netip.AddrPortFrom(a, uint16(sa.Port)), nil
	case nil:
		return netip.AddrPort{}, &AddrError{Addr: "<nil>", Reason: "no address"}
	}
	return netip.AddrPort{}, &AddrError{Addr: "?", Reason: "not an AF_INET/AF_INET6 sockaddr"}
}

// TCPAddrFromSockaddr converts a unix.Sockaddr to a *net.TCPAddr (nil if sa
// is not AF_INET/AF_INET6).
func TCPAddrFromSockaddr(sa unix.Sockaddr) *net.TCPAddr {
	ap, err := AddrPortFromSockaddr(sa)
	if err != nil {
		return nil
	}
	return net.TCPAddrFromAddrPort(ap)
}

// AddrPortFromNetAddr converts a *net.TCPAddr (or any net.Addr whose String is
// host:port with a literal IP) to a netip.AddrPort.
func AddrPortFromNetAddr(a net.Addr) (netip.AddrPort, error) {
	switch a := a.(type) {
	case *net.TCPAddr:
		if a == nil {
			return netip.AddrPort{}, &AddrError{Addr: "<nil>", Reason: "nil address"}
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			if len(a.IP) == 0 {
				ip = netip.IPv6Unspecified()
			} else {
				return netip.AddrPort{}, &AddrError{Addr: a.String(), Reason: "bad IP length"}
			}
		}
		if a.Zone != "" {
			ip = ip.WithZone(a.Zone)
		}
		return netip.AddrPortFrom(ip.Unmap(), uint16(a.Port)), nil
	case nil:
		return netip.AddrPort{}, &AddrError{Addr: "<nil>", Reason: "nil address"}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.AddrPort{}, &AddrError{Addr: a.String(), Reason: err.Error()}
	}
	return ap, nil
}

// networkFamily returns the family a network name asks for (0 = either).
func networkFamily(network string) (int, error) {
	switch network {
	case "tcp":
		return 0, nil
	case "tcp4":
		return unix.AF_INET, nil
	case "tcp6":
		return unix.AF_INET6, nil
	}
	return 0, &AddrError{Addr: network, Reason: `unknown network (want "tcp", "tcp4" or "tcp6")`}
}

// Resolve turns a "host:port" string into one address for network "tcp",
// "tcp4" or "tcp6". host may be an IP literal (with an optional %zone), a name
// (resolved with the system resolver; for "tcp" IPv4 results are preferred),
// or empty for the wildcard address (0.0.0.0 for tcp4, :: otherwise). port may
// be a number or a service name. An address of the wrong family for the
// network is an *AddrError.
func Resolve(network, address string) (netip.AddrPort, error) {
	fam, err := networkFamily(network)
	if err != nil {
		return netip.AddrPort{}, err
	}
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, &AddrError{Addr: address, Reason: err.Error()}
	}
	port, err := parsePort(network, portStr)
	if err != nil {
		return netip.AddrPort{}, &AddrError{Addr: address, Reason: err.Error()}
	}
	if host == "" {
		if fam == unix.AF_INET {
			return netip.AddrPortFrom(netip.IPv4Unspecified(), port), nil
		}
		return netip.AddrPortFrom(netip.IPv6Unspecified(), port), nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		a, err = fitFamily(a, fam)
		if err != nil {
			return netip.AddrPort{}, &AddrError{Addr: address, Reason: err.Error()}
		}
		return netip.AddrPortFrom(a, port), nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", host)
	if err != nil {
		return netip.AddrPort{}, &AddrError{Addr: address, Reason: err.Error()}
	}
	var pick netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if fam == unix.AF_INET && !a.Is4() || fam == unix.AF_INET6 && a.Is4() {
			continue
		}
		if !pick.IsValid() || (fam == 0 && a.Is4() && !pick.Is4()) {
			pick = a
		}
	}
	if !pick.IsValid() {
		return netip.AddrPort{}, &AddrError{Addr: address, Reason: "no address of the family " + network + " asks for"}
	}
	return netip.AddrPortFrom(pick, port), nil
}

type familyErr string

func (e familyErr) Error() string { return string(e) }

func fitFamily(a netip.Addr, fam int) (netip.Addr, error) {
	switch fam {
	case unix.AF_INET:
		if u := a.Unmap(); u.Is4() {
			return u, nil
		}
		return a, familyErr("IPv6 address for network tcp4")
	case unix.AF_INET6:
		if a.Is4() {
			return a, familyErr("IPv4 address for network tcp6 (write it as [::ffff:a.b.c.d] for a v4-mapped address)")
		}
		return a, nil
	}
	return a.Unmap(), nil
}

func parsePort(network, s string) (uint16, error) {
	if s == "" {
		return 0, nil
	}
	if n, err := strconv.ParseUint(s, 10, 16); err == nil {
		return uint16(n), nil
	}
	p, err := net.LookupPort(network, s)
	if err != nil {
		return 0, err
	}
	return uint16(p), nil
}

// RawSockaddr holds a socket address in the kernel's layout (struct
// sockaddr_in or sockaddr_in6, in a sockaddr_storage-sized buffer) for calls
// that take a pointer and a length, such as io_uring CONNECT and ACCEPT.
// The kernel reads or writes it through the pointer: keep the RawSockaddr
// reachable (runtime.KeepAlive or a field of a live object) until the
// operation has completed. Allocate it with new(RawSockaddr) or NewRawSockaddr.
type RawSockaddr struct {
	buf unix.RawSockaddrAny
	len uint32
}

// NewRawSockaddr encodes ap for a socket of the given family (0: the
// address's own), with the same rules as Sockaddr.
func NewRawSockaddr(ap netip.AddrPort, family int) (*RawSockaddr, error) {
	r := new(RawSockaddr)
	if err := r.Set(ap, family); err != nil {
		return nil, err
	}
	return r, nil
}

// Set encodes ap into r (see NewRawSockaddr).
func (r *RawSockaddr) Set(ap netip.AddrPort, family int) error {
	sa, err := Sockaddr(ap, family)
	if err != nil {
		return err
	}
	r.buf = unix.RawSockaddrAny{}
	b := (*[unix.SizeofSockaddrAny]byte)(unsafe.Pointer(&r.buf))
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		binary.NativeEndian.PutUint16(b[0:], unix.AF_INET)
		binary.BigEndian.PutUint16(b[2:], uint16(sa.Port))
		copy(b[4:8], sa.Addr[:])
		r.len = unix.SizeofSockaddrInet4
	case *unix.SockaddrInet6:
		binary.NativeEndian.PutUint16(b[0:], unix.AF_INET6)
		binary.BigEndian.PutUint16(b[2:], uint16(sa.Port))
		// b[4:8] flowinfo = 0
		copy(b[8:24], sa.Addr[:])
		binary.NativeEndian.PutUint32(b[24:], sa.ZoneId)
		r.len = unix.SizeofSockaddrInet6
	}
	return nil
}

// PrepareAccept clears r and sets its length to the full buffer, ready to be
// passed (Pointer, LenPointer) to accept(2) or io_uring ACCEPT.
func (r *RawSockaddr) PrepareAccept() {
	r.buf = unix.RawSockaddrAny{}
	r.len = unix.SizeofSockaddrAny
}

// Pointer returns the address of the kernel-layout sockaddr.
func (r *RawSockaddr) Pointer() unsafe.Pointer { return unsafe.Pointer(&r.buf) }

// Len returns the length of the encoded sockaddr (socklen_t).
func (r *RawSockaddr) Len() uint32 { return r.len }

// LenPointer returns a pointer to the length, for calls that write it back
// (accept's addrlen).
func (r *RawSockaddr) LenPointer() *uint32 { return &r.len }

// Bytes returns the encoded sockaddr (aliasing r).
func (r *RawSockaddr) Bytes() []byte {
	n := min(int(r.len), unix.SizeofSockaddrAny)
	return (*[unix.SizeofSockaddrAny]byte)(unsafe.Pointer(&r.buf))[:n:n]
}

// AddrPort decodes r (for example after an accept filled it in).
func (r *RawSockaddr) AddrPort() (netip.AddrPort, error) {
	b := (*[unix.SizeofSockaddrAny]byte)(unsafe.Pointer(&r.buf))
	fam := binary.NativeEndian.Uint16(b[0:])
	port := binary.BigEndian.Uint16(b[2:])
	switch {
	case fam == unix.AF_INET && r.len >= unix.SizeofSockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port), nil
	case fam == unix.AF_INET6 && r.len >= unix.SizeofSockaddrInet6:
		a := netip.AddrFrom16([16]byte(b[8:24]))
		if a.Is4In6() {
			a = a.Unmap()
		} else if z := binary.NativeEndian.Uint32(b[24:]); z != 0 {
			a = a.WithZone(zoneName(z))
		}
		return netip.AddrPortFrom(a, port), nil
	}
	return netip.AddrPort{}, &AddrError{Addr: "raw sockaddr", Reason: "family " + strconv.Itoa(int(fam)) + " length " + strconv.Itoa(int(r.len)) + " is not AF_INET/AF_INET6"}
}

// Sockaddr decodes r into a unix.Sockaddr.
func (r *RawSockaddr) Sockaddr() (unix.Sockaddr, error) {
	ap, err := r.AddrPort()
	if err != nil {
		return nil, err
	}
	b := (*[unix.SizeofSockaddrAny]byte)(unsafe.Pointer(&r.buf))
	return Sockaddr(ap, int(binary.NativeEndian.Uint16(b[0:])))
}
