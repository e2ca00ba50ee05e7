package bpf

import (
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// FlowKey names one TCP flow as seen from this host: Remote is the peer,
// Local is this host's address and port, whichever way a packet travels.
// IPv4 and IPv6 both work; IPv4 addresses may be given plain or
// IPv4-mapped. A Remote port of 0 in a flow-table entry matches every port
// of that peer (an exact entry wins over it).
type FlowKey struct {
	Remote netip.AddrPort
	Local  netip.AddrPort
}

func (k FlowKey) String() string { return k.Remote.String() + "->" + k.Local.String() }

// ipProtoTCP is IPPROTO_TCP.
const ipProtoTCP = 6

// raw converts k to the kernel's struct flow_key.
func (k FlowKey) raw() (steerFlowKey, error) {
	var r steerFlowKey
	ra, la := k.Remote.Addr(), k.Local.Addr()
	if !ra.IsValid() || !la.IsValid() {
		return r, fmt.Errorf("%w: flow key %v: address missing", ErrInvalid, k)
	}
	if ra.Zone() != "" || la.Zone() != "" {
		return r, fmt.Errorf("%w: flow key %v: zoned addresses are not supported", ErrInvalid, k)
	}
	if ra.Unmap().Is4() != la.Unmap().Is4() {
		return r, fmt.Errorf("%w: flow key %v: mixed address families", ErrInvalid, k)
	}
	if k.Local.Port() == 0 {
		return r, fmt.Errorf("%w: flow key %v: local port 0", ErrInvalid, k)
	}
	if ra.IsUnspecified() || la.IsUnspecified() {
		return r, fmt.Errorf("%w: flow key %v: unspecified address (a flow key matches one connection exactly: no wildcards)", ErrInvalid, k)
	}
	if ra.IsMulticast() || ra.Unmap() == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return r, fmt.Errorf("%w: flow key %v: a TCP peer cannot be a multicast or broadcast address", ErrInvalid, k)
	}
	r.Remote = ra.As16()
	r.Local = la.As16()
	r.RemotePort = k.Remote.Port()
	r.LocalPort = k.Local.Port()
	r.Proto = ipProtoTCP
	return r, nil
}

// keyFromRaw converts the kernel's struct flow_key back; IPv4-mapped
// addresses come back as plain IPv4.
func keyFromRaw(r steerFlowKey) FlowKey {
	ra := netip.AddrFrom16(r.Remote).Unmap()
	la := netip.AddrFrom16(r.Local).Unmap()
	return FlowKey{
		Remote: netip.AddrPortFrom(ra, r.RemotePort),
		Local:  netip.AddrPortFrom(la, r.LocalPort),
	}
}

// FlowKeyFromFD returns the flow key of a connected TCP socket (for
// instance one just accepted from a queue's listener): its peer is Remote,
// its own address Local.
func FlowKeyFromFD(fd int) (FlowKey, error) {
	const op = "flow key from fd"
	peer, err := unix.Getpeername(fd)
	if err != nil {
		return FlowKey{}, opErr(op, fmt.Errorf("%w: %w", ErrInvalid, os.NewSyscallError("getpeername", err)))
	}
	self, err := unix.Getsockname(fd)
	if err != nil {
		return FlowKey{}, opErr(op, fmt.Errorf("%w: %w", ErrInvalid, os.NewSyscallError("getsockname", err)))
	}
	r, ok1 := addrPort(peer)
	l, ok2 := addrPort(self)
	if !ok1 || !ok2 {
		return FlowKey{}, invalid(op, "fd %d is not an IPv4/IPv6 socket", fd)
	}
	return FlowKey{Remote: r, Local: l}, nil
}

func addrPort(sa unix.Sockaddr) (netip.AddrPort, bool) {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), true
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port)), true
	}
	return netip.AddrPort{}, false
}
