package tcpglue

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sockName runs getsockname or getpeername (trap) into a stack buffer and converts the
// result without allocating (unix.Getsockname allocates its buffer and the returned
// Sockaddr: two allocations per call, on every accepted connection). IPv4-mapped IPv6
// addresses are returned unmapped, as AddrPortFromSockaddr does.
func sockName(fd int, trap uintptr) (netip.AddrPort, error) {
	var rsa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	if _, _, e := unix.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n))); e != 0 {
		return netip.AddrPort{}, e
	}
	return addrPortFromRaw(&rsa, n)
}

// addrPortFromRaw converts a kernel sockaddr of n bytes.
func addrPortFromRaw(rsa *unix.RawSockaddrAny, n uint32) (netip.AddrPort, error) {
	switch rsa.Addr.Family {
	case unix.AF_INET:
		if n < unix.SizeofSockaddrInet4 {
			break
		}
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), netPort(&sa.Port)), nil
	case unix.AF_INET6:
		if n < unix.SizeofSockaddrInet6 {
			break
		}
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
		a := netip.AddrFrom16(sa.Addr)
		if a.Is4In6() {
			a = a.Unmap()
		} else if sa.Scope_id != 0 {
			a = a.WithZone(zoneName(sa.Scope_id))
		}
		return netip.AddrPortFrom(a, netPort(&sa.Port)), nil
	}
	return netip.AddrPort{}, &AddrError{Addr: "?", Reason: "not an AF_INET/AF_INET6 sockaddr"}
}

// netPort reads a port stored in network byte order.
func netPort(p *uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(p))
	return uint16(b[0])<<8 | uint16(b[1])
}
