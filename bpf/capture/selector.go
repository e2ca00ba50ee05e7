package capture

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/zcnet/zcnet/bpf"
)

// Selector names flows a capture records. Make one with Flow, Listener or
// Steered. Flows are TCP flows seen from this host, with the bpf package's
// conventions: Remote is the peer, Local this host, whichever way a packet
// travels; IPv4 addresses may be plain or IPv4-mapped.
type Selector struct {
	kind     selKind
	key      bpf.FlowKey
	steering *bpf.Steering
}

type selKind uint8

const (
	selNone selKind = iota
	selFlow
	selListener
	selSteered
)

// Flow selects one TCP flow by its addresses and ports (the 5-tuple; the
// protocol is TCP). The flow need not exist yet: capture can start before
// the connection, and then records its handshake. A Remote port of 0
// selects every flow between that peer and Local (like a peer-wide
// flow-table entry of the steering programs).
func Flow(k bpf.FlowKey) Selector { return Selector{kind: selFlow, key: k} }

// Listener selects every flow of a listening socket: every TCP flow whose
// local address and port are addr. An unspecified address (0.0.0.0 or ::)
// selects every flow of the port, on any local address and of both
// families. A TCP socket must be listening on addr (or on the wildcard
// address with its port) in the capture's network namespace when the
// selector is added; otherwise the error matches ErrNotFound.
func Listener(addr netip.AddrPort) Selector {
	return Selector{kind: selListener, key: bpf.FlowKey{Local: addr}}
}

// Steered selects the flows of an entry of a Steering's flow table (an
// exact 4-tuple or a peer-wide entry with Remote port 0) or of a
// connection it learned. When the Steering knows no such flow, adding the
// selector fails with an error matching ErrNotFound.
func Steered(s *bpf.Steering, k bpf.FlowKey) Selector {
	return Selector{kind: selSteered, key: k, steering: s}
}

func (s Selector) String() string {
	switch s.kind {
	case selFlow:
		return "flow " + s.key.String()
	case selListener:
		return "listener " + s.key.Local.String()
	case selSteered:
		return "steered flow " + s.key.String()
	}
	return "empty selector"
}

// entry is one cap_flows key with its kind (CAP_K_*).
type entry struct {
	key  captureFlowKey
	kind uint32
}

// Kinds of cap_flows entries (capture.h CAP_K_*).
const (
	kindExact = 1
	kindPeer  = 2
	kindLocal = 4
	kindPort  = 8
)

const ipProtoTCP = 6

// entry converts the selector to its table key. Listener existence and
// Steering lookups are checked by the caller (they need the namespace).
func (s Selector) entry() (entry, error) {
	var e entry
	switch s.kind {
	case selFlow, selSteered:
		k := s.key
		ra, la := k.Remote.Addr(), k.Local.Addr()
		switch {
		case !ra.IsValid() || !la.IsValid():
			return e, fmt.Errorf("%w: %v: address missing", ErrInvalid, s)
		case ra.Zone() != "" || la.Zone() != "":
			return e, fmt.Errorf("%w: %v: zoned addresses are not supported", ErrInvalid, s)
		case ra.Unmap().Is4() != la.Unmap().Is4():
			return e, fmt.Errorf("%w: %v: mixed address families", ErrInvalid, s)
		case ra.Unmap().IsUnspecified() || la.Unmap().IsUnspecified():
			return e, fmt.Errorf("%w: %v: unspecified address (use Listener for every flow of a port)", ErrInvalid, s)
		case k.Local.Port() == 0:
			return e, fmt.Errorf("%w: %v: local port 0", ErrInvalid, s)
		}
		e.key.Remote = mapped(ra)
		e.key.Local = mapped(la)
		e.key.RemotePort = k.Remote.Port()
		e.key.LocalPort = k.Local.Port()
		e.kind = kindExact
		if k.Remote.Port() == 0 {
			e.kind = kindPeer
		}
	case selListener:
		la := s.key.Local.Addr()
		switch {
		case !la.IsValid():
			return e, fmt.Errorf("%w: %v: address missing", ErrInvalid, s)
		case la.Zone() != "":
			return e, fmt.Errorf("%w: %v: zoned addresses are not supported", ErrInvalid, s)
		case s.key.Local.Port() == 0:
			return e, fmt.Errorf("%w: %v: port 0", ErrInvalid, s)
		}
		e.key.LocalPort = s.key.Local.Port()
		e.kind = kindPort
		if !la.Unmap().IsUnspecified() {
			e.key.Local = mapped(la)
			e.kind = kindLocal
		}
	default:
		return e, fmt.Errorf("%w: empty selector (use Flow, Listener or Steered)", ErrInvalid)
	}
	e.key.Proto = ipProtoTCP
	return e, nil
}

// mapped is the kernel key encoding of an address: IPv6, IPv4 as
// IPv4-mapped.
func mapped(a netip.Addr) [16]byte {
	a = a.Unmap()
	if a.Is4() {
		return netip.AddrFrom16(a.As16()).As16()
	}
	return a.As16()
}

// check verifies that the selected flows exist where that can be known:
// a Steering entry, a listening socket (read from tcpFiles, the calling
// thread's /proc/thread-self/net/tcp{,6}).
func (s Selector) check() error {
	switch s.kind {
	case selSteered:
		if s.steering == nil {
			return fmt.Errorf("%w: %v: nil Steering", ErrInvalid, s)
		}
		if _, _, err := s.steering.Lookup(s.key); err != nil {
			if errors.Is(err, bpf.ErrNotFound) {
				return fmt.Errorf("%w: %v: the Steering has no such flow-table entry or learned connection", ErrNotFound, s)
			}
			return err
		}
	case selListener:
		ok, err := listening(s.key.Local)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: %v: no TCP socket listens on it in this network namespace", ErrNotFound, s)
		}
	}
	return nil
}

// listening reports whether a TCP socket listens on addr (or on the
// wildcard address with addr's port; any address when addr's address is
// unspecified) in the calling thread's network namespace.
func listening(addr netip.AddrPort) (bool, error) {
	want := addr.Addr().Unmap()
	for _, f := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
		fh, err := os.Open(f)
		if errors.Is(err, os.ErrNotExist) {
			continue // no IPv6
		}
		if err != nil {
			return false, err
		}
		socks, err := parseTCPTable(fh)
		fh.Close()
		if err != nil {
			return false, fmt.Errorf("%s: %w", f, err)
		}
		for _, s := range socks {
			if !s.listen || s.local.Port() != addr.Port() {
				continue
			}
			got := s.local.Addr().Unmap()
			if want.IsUnspecified() || got.IsUnspecified() || got == want {
				return true, nil
			}
		}
	}
	return false, nil
}

type tcpSock struct {
	local  netip.AddrPort
	listen bool
}

// parseTCPTable reads /proc/net/tcp or tcp6: "sl local_address
// rem_address st ...", addresses as hex words in host byte order, the port
// as a hex number, st 0A = TCP_LISTEN.
func parseTCPTable(f *os.File) ([]tcpSock, error) {
	var out []tcpSock
	sc := bufio.NewScanner(f)
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		fl := strings.Fields(sc.Text())
		if len(fl) < 4 {
			continue
		}
		ap, err := parseProcAddr(fl[1])
		if err != nil {
			return nil, err
		}
		out = append(out, tcpSock{local: ap, listen: fl[3] == "0A"})
	}
	return out, sc.Err()
}

// parseProcAddr parses "0100007F:1F90" (IPv4) or 32 hex digits + port
// (IPv6): each 32-bit word is printed as a host-order number.
func parseProcAddr(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("bad address %q", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bad port in %q", s)
	}
	raw, err := hex.DecodeString(a)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("bad address %q", s)
	}
	var b [16]byte
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	if len(raw) == 4 {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[:4])), uint16(port)), nil
	}
	return netip.AddrPortFrom(netip.AddrFrom16(b), uint16(port)), nil
}
