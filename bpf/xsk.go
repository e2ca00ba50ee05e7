package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/internal/netns"
)

// Limits of the raw-queue steering program (XSK_MAX_RULES, XSK_MAX_QUEUES in c/xsk.h).
const (
	MaxRawRules  = 32
	MaxRawQueues = 64
)

// VXLANPort is the UDP destination port on which the program reads a VXLAN VNI.
const VXLANPort = 4789

// RawRule says which frames go to the raw queues of an interface. Every field that is set
// must match; a frame that matches no rule goes to the kernel stack untouched. Fields:
//
//   - DstMAC: the Ethernet destination (a multicast MAC such as 01:00:5e:01:02:03).
//   - Src, Dst: IPv4 or IPv6 addresses (Dst a multicast group, say); the zero Addr is any.
//     Setting either also demands that family.
//   - Proto: the IP protocol (unix.IPPROTO_UDP, IPPROTO_TCP), 0 any. For IPv6 it is the
//     fixed header's next header: extension headers are not walked.
//   - SrcPort, DstPort: UDP or TCP ports, 0 any.
//   - DSCP (with MatchDSCP): the ToS / traffic class >> 2, 0..63.
//   - FlowLabel (with MatchFlowLabel): the IPv6 flow label, 20 bits; implies IPv6.
//   - VNI (with MatchVNI): the VXLAN network identifier of a UDP frame to port 4789 with the
//     I flag set, 24 bits.
//   - IPv4, IPv6: demand the family without naming an address.
//   - Join (with Dst a multicast group): AddRule also joins the group on the interface
//     through a kernel socket (IP_ADD_MEMBERSHIP, IPV6_JOIN_GROUP), so the host sends
//     IGMP/MLD reports and a switch that snoops them forwards the group to this port; the
//     kernel socket receives nothing (the rule takes the group's frames before the stack
//     and the socket has no port). DeleteRule and Close leave the group. A rule alone
//     does not join: on a switched network with IGMP/MLD snooping the group's traffic
//     then never reaches the interface.
type RawRule struct {
	DstMAC           net.HardwareAddr
	Src, Dst         netip.Addr
	Proto            uint8
	SrcPort, DstPort uint16
	DSCP             uint8
	MatchDSCP        bool
	FlowLabel        uint32
	MatchFlowLabel   bool
	VNI              uint32
	MatchVNI         bool
	IPv4, IPv6       bool
	Join             bool
}

// RuleConflictError is the refusal of a rule that matches exactly the frames of a rule
// already in force (adding it could never take a frame). It matches ErrInvalid.
type RuleConflictError struct {
	Rule int // the rule in force
}

func (e *RuleConflictError) Error() string {
	return fmt.Sprintf("the rule matches the same frames as rule %d already in force", e.Rule)
}

// Is makes it match ErrInvalid.
func (e *RuleConflictError) Is(target error) bool { return target == ErrInvalid }

// encode turns the rule into the program's struct, or says why it is refused.
func (r RawRule) encode() (xskXskRule, error) {
	var k xskXskRule
	if r.DstMAC != nil {
		if len(r.DstMAC) != 6 {
			return k, fmt.Errorf("DstMAC %v: want 6 bytes", r.DstMAC)
		}
		copy(k.DstMac[:], r.DstMAC)
		k.Match |= xskMDstMAC
	}
	fam4, fam6 := r.IPv4, r.IPv6
	for _, a := range []struct {
		addr netip.Addr
		bit  uint32
		dst  *[16]uint8
	}{{r.Src, xskMSrc, &k.Src}, {r.Dst, xskMDst, &k.Dst}} {
		if !a.addr.IsValid() {
			continue
		}
		if a.addr.Zone() != "" {
			return k, fmt.Errorf("address %v: no zone allowed", a.addr)
		}
		if a.addr.Unmap().Is4() {
			fam4 = true
		} else {
			fam6 = true
		}
		*a.dst = a.addr.As16()
		k.Match |= a.bit
	}
	if r.Proto != 0 {
		k.Proto = r.Proto
		k.Match |= xskMProto
	}
	if r.SrcPort != 0 || r.DstPort != 0 {
		if r.Proto != 0 && r.Proto != unix.IPPROTO_UDP && r.Proto != unix.IPPROTO_TCP {
			return k, fmt.Errorf("ports given with protocol %d: only UDP and TCP have ports", r.Proto)
		}
	}
	if r.SrcPort != 0 {
		k.SrcPort = r.SrcPort
		k.Match |= xskMSrcPort
	}
	if r.DstPort != 0 {
		k.DstPort = r.DstPort
		k.Match |= xskMDstPort
	}
	if r.MatchDSCP {
		if r.DSCP > 63 {
			return k, fmt.Errorf("DSCP %d: want 0..63", r.DSCP)
		}
		k.Dscp = r.DSCP
		k.Match |= xskMDSCP
	}
	if r.MatchFlowLabel {
		if r.FlowLabel > 0xfffff {
			return k, fmt.Errorf("flow label %#x: want 20 bits", r.FlowLabel)
		}
		fam6 = true
		k.FlowLabel = r.FlowLabel
		k.Match |= xskMFlowLabel
	}
	if r.MatchVNI {
		if r.VNI > 0xffffff {
			return k, fmt.Errorf("VNI %d: want 24 bits", r.VNI)
		}
		if r.Proto != 0 && r.Proto != unix.IPPROTO_UDP {
			return k, fmt.Errorf("VNI with protocol %d: VXLAN is UDP", r.Proto)
		}
		if r.DstPort != 0 && r.DstPort != VXLANPort {
			return k, fmt.Errorf("VNI with destination port %d: the program reads VNIs on port %d only", r.DstPort, VXLANPort)
		}
		k.Vni = r.VNI
		k.Match |= xskMVNI
	}
	if fam4 && fam6 {
		return k, errors.New("the rule demands both IPv4 and IPv6 (a flow label or an address of each family)")
	}
	if fam4 {
		k.Match |= xskMIPv4
	}
	if fam6 {
		k.Match |= xskMIPv6
	}
	if k.Match == 0 {
		return k, errors.New("the rule matches nothing in particular: set at least one field")
	}
	if r.Join && (!r.Dst.IsValid() || !r.Dst.IsMulticast()) {
		return k, fmt.Errorf("a rule that joins needs a multicast destination, not %v", r.Dst)
	}
	return k, nil
}

// XSK_M_* of c/xsk.h (checked against the object's BTF-free constants by a test that
// reads the header).
const (
	xskMDstMAC    = 1 << 0
	xskMSrc       = 1 << 1
	xskMDst       = 1 << 2
	xskMProto     = 1 << 3
	xskMSrcPort   = 1 << 4
	xskMDstPort   = 1 << 5
	xskMDSCP      = 1 << 6
	xskMFlowLabel = 1 << 7
	xskMVNI       = 1 << 8
	xskMIPv4      = 1 << 9
	xskMIPv6      = 1 << 10

	xskFMeta = 1

	xskCSeen, xskCPass, xskCRedirect, xskCNoSocket, xskCMetaTS, xskCMetaHash = 0, 1, 2, 3, 4, 5
	xskCounters                                                              = 8

	// XSK_META_* and the size of struct xsk_meta.
	xskMetaTimestamp = 1
	xskMetaHash      = 2
	xskMetaMagic     = 0x7a63786d
	xskMetaSize      = 24
)

// RawAttachMode is how the raw-queue program ended up attached.
type RawAttachMode int

const (
	// RawXDPNative: the driver runs the program (XDP_FLAGS_DRV_MODE).
	RawXDPNative RawAttachMode = iota + 1
	// RawXDPGeneric: the kernel runs it on the skb after the driver (XDP_FLAGS_SKB_MODE):
	// every frame has been turned into an skb first, so it costs more per frame.
	RawXDPGeneric
)

func (m RawAttachMode) String() string {
	switch m {
	case RawXDPNative:
		return "native"
	case RawXDPGeneric:
		return "generic"
	}
	return fmt.Sprintf("RawAttachMode(%d)", int(m))
}

// RawSteeringOptions says how NewRawSteering attaches.
type RawSteeringOptions struct {
	// Mode: XDPAuto picks the mode that keeps the kernel's own traffic at speed: native
	// (driver) mode, except on a device where a native program costs the kernel's traffic
	// (veth: it turns off the peer's TSO/GSO, see NativeXDPCostError), and generic mode
	// where native mode fails; either choice is visible (RawSteering.Fallback; a failed
	// native attach also counts in RawFallbacks). XDPDriver demands native mode (the
	// fallback becomes an error matching ErrNotSupported; on veth the cost is accepted);
	// XDPGeneric asks for generic mode.
	Mode XDPMode
	// Metadata loads the device-bound variant of the program, which reads the device's RX
	// timestamp and RX hash (XDP RX metadata kfuncs, Linux 6.3+) and puts them before each
	// redirected frame. It needs native mode, so it asks for native mode on veth too. Where
	// the device-bound program cannot be loaded or attached, the plain program is used and
	// RawSteering.Metadata says why (an error matching ErrNotSupported).
	Metadata bool
}

// RawSteering is the raw-queue steering program attached to one interface: its XSKMAP
// (RX queue -> raw queue socket), its rules and their counters. Several raw queues of one
// interface share it. Methods are safe for concurrent use; Close detaches the program and
// frees the maps (every raw queue's entry with them), is idempotent, and later calls return
// an error matching ErrClosed.
type RawSteering struct {
	mu      sync.Mutex
	closed  bool
	ifindex int
	maps    xskMaps
	prog    *ebpf.Program
	link    link.Link
	netns   uint64 // inode of the interface's network namespace
	nsFd    int    // the namespace, for the kernel sockets of Join (-1: none)
	// joins: per rule slot, the kernel socket holding the group membership (-1: none).
	joins [MaxRawRules]int
	mode  RawAttachMode
	// fallback: why native mode was not used (nil when it was, or was not asked for).
	fallback error
	metaErr  error
	meta     bool
	active   uint64
	rules    [MaxRawRules]xskXskRule
	sockets  map[int]bool
}

var (
	openRawSteerings  atomic.Int64
	rawXDPFallbacks   atomic.Int64
	rawMetaUnsupports atomic.Int64
)

// OpenRawSteerings is the number of RawSteerings not yet closed (for leak checks).
func OpenRawSteerings() int64 { return openRawSteerings.Load() }

// RawFallbacks counts, process-wide, the RawSteerings attached in generic mode because
// native mode failed, and those that were asked for RX metadata and run without it.
func RawFallbacks() (genericXDP, noMetadata int64) {
	return rawXDPFallbacks.Load(), rawMetaUnsupports.Load()
}

// NewRawSteering loads the raw-queue program and attaches it to the interface (an index in
// the calling thread's network namespace) with no rule in force: until AddRule every frame
// passes to the kernel stack. An interface that already has an XDP program is refused
// (EBUSY, matching ErrInvalid); programs of a killed process are gone with its links, so
// nothing of an earlier run stands in the way.
func NewRawSteering(ifindex int, opts *RawSteeringOptions) (*RawSteering, error) {
	op := fmt.Sprintf("raw steering on ifindex %d", ifindex)
	var o RawSteeringOptions
	if opts != nil {
		o = *opts
	}
	if o.Mode < XDPAuto || o.Mode > XDPGeneric {
		return nil, invalid(op, "unknown XDP mode %d", o.Mode)
	}
	if o.Metadata && o.Mode == XDPGeneric {
		return nil, invalid(op, "RX metadata needs native XDP; generic mode was asked for")
	}
	name, err := ifName(ifindex)
	if err != nil {
		return nil, opErr(op, err)
	}
	nsIno, err := threadNetNS()
	if err != nil {
		return nil, opErr(op, err)
	}
	// veth: a native program costs the kernel's traffic through the pair; XDPAuto runs
	// generic mode there unless RX metadata (native only) was asked for.
	var cost error
	if o.Mode == XDPAuto && !o.Metadata {
		if drv := driverName(name); drv == "veth" {
			cost = &NativeXDPCostError{Driver: drv}
		}
	}
	spec, err := loadXsk()
	if err != nil {
		return nil, opErr(op, err)
	}
	s, err := newRawMaps(spec)
	if err != nil {
		return nil, opErr(op+": load maps", err)
	}
	s.ifindex, s.netns = ifindex, nsIno
	ok := false
	if s.nsFd, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		s.release()
		return nil, opErr(op, fmt.Errorf("network namespace of this thread: %w", err))
	}
	defer func() {
		if !ok {
			s.release()
		}
	}()
	load := func(name string, bound bool) (*ebpf.Program, error) {
		return s.loadProg(spec, name, ifindex, bound)
	}
	attach := func(p *ebpf.Program, flags link.XDPAttachFlags) (link.Link, error) {
		return link.AttachXDP(link.XDPOptions{Program: p, Interface: ifindex, Flags: flags})
	}
	if o.Metadata {
		p, err := load(xskProgZcXskMeta, true)
		if err == nil {
			l, aerr := attach(p, link.XDPDriverMode)
			if aerr == nil {
				s.prog, s.link, s.mode, s.meta = p, l, RawXDPNative, true
			} else {
				p.Close()
				err = aerr
			}
		}
		if err != nil {
			s.metaErr = errs.NotSupported("XDP RX metadata (bpf_xdp_metadata_rx_timestamp/rx_hash)",
				"a driver with xdp_metadata_ops in native XDP mode (Linux 6.3+)", err)
			rawMetaUnsupports.Add(1)
		}
	}
	if s.prog == nil {
		p, err := load(xskProgZcXsk, false)
		if err != nil {
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				err = fmt.Errorf("%w: %w", errOldKernel, err)
			}
			return nil, opErr(op+": load", err)
		}
		s.prog = p
		switch {
		case o.Mode == XDPGeneric:
			s.link, err = attach(p, link.XDPGenericMode)
			s.mode = RawXDPGeneric
		case cost != nil:
			s.link, err = attach(p, link.XDPGenericMode)
			s.mode, s.fallback = RawXDPGeneric, cost
		default:
			s.link, err = attach(p, link.XDPDriverMode)
			s.mode = RawXDPNative
			if err != nil && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EEXIST) {
				native := errs.NotSupported("native XDP", "a driver with XDP support (ndo_bpf)", err)
				if o.Mode == XDPDriver {
					return nil, opErr(op+": attach", native)
				}
				s.fallback = native
				s.link, err = attach(p, link.XDPGenericMode)
				s.mode = RawXDPGeneric
				if err == nil {
					rawXDPFallbacks.Add(1)
				}
			}
		}
		if err != nil {
			if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) {
				err = fmt.Errorf("%w: %w (the interface already has an XDP program: detach it, or share one RawSteering between its raw queues)", ErrInvalid, err)
			}
			return nil, opErr(op+": attach", err)
		}
	}
	if err := s.writeConfig(); err != nil {
		return nil, opErr(op, err)
	}
	ok = true
	openRawSteerings.Add(1)
	return s, nil
}

// newRawMaps creates the program's maps (no program, nothing attached).
func newRawMaps(spec *ebpf.CollectionSpec) (*RawSteering, error) {
	s := &RawSteering{sockets: map[int]bool{}, nsFd: -1}
	for i := range s.joins {
		s.joins[i] = -1
	}
	mapSpecs := &ebpf.CollectionSpec{Maps: spec.Maps, Programs: map[string]*ebpf.ProgramSpec{}, Types: spec.Types}
	if err := mapSpecs.LoadAndAssign(&s.maps, nil); err != nil {
		return nil, err
	}
	return s, nil
}

// loadProg loads program name on s's maps; bound makes it device-bound to ifindex (for the
// RX metadata kfuncs).
func (s *RawSteering) loadProg(spec *ebpf.CollectionSpec, name string, ifindex int, bound bool) (*ebpf.Program, error) {
	ps := spec.Programs[name].Copy()
	if bound {
		ps.Flags |= unix.BPF_F_XDP_DEV_BOUND_ONLY
		ps.Ifindex = uint32(ifindex)
	}
	coll, err := ebpf.NewCollectionWithOptions(&ebpf.CollectionSpec{
		Maps: spec.Maps, Programs: map[string]*ebpf.ProgramSpec{name: ps}, Types: spec.Types,
	}, ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		xskMapXskCounters: s.maps.XskCounters, xskMapXskRuleCounters: s.maps.XskRuleCounters,
		xskMapXskRules: s.maps.XskRules, xskMapXskSettings: s.maps.XskSettings,
		xskMapXskSockets: s.maps.XskSockets,
	}})
	if err != nil {
		return nil, err
	}
	p := coll.DetachProgram(name)
	coll.Close()
	return p, nil
}

func (s *RawSteering) writeConfig() error {
	cfg := xskXskConfig{Active: s.active}
	if s.meta {
		cfg.Flags = xskFMeta
	}
	return s.maps.XskSettings.Update(uint32(0), &cfg, ebpf.UpdateAny)
}

func (s *RawSteering) release() error {
	var errl []error
	for i, fd := range s.joins {
		if fd >= 0 {
			unix.Close(fd) // leaves the group
			s.joins[i] = -1
		}
	}
	if s.nsFd >= 0 {
		unix.Close(s.nsFd)
		s.nsFd = -1
	}
	if s.link != nil {
		if err := s.link.Close(); err != nil {
			errl = append(errl, fmt.Errorf("detach xdp: %w", err))
		}
		s.link = nil
	}
	if s.prog != nil {
		s.prog.Close()
		s.prog = nil
	}
	if err := s.maps.Close(); err != nil {
		errl = append(errl, err)
	}
	s.maps = xskMaps{}
	return errors.Join(errl...)
}

// Close detaches the program and frees its maps. Raw queues whose sockets were in the
// XSKMAP receive nothing more. Idempotent.
func (s *RawSteering) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	openRawSteerings.Add(-1)
	if err := s.release(); err != nil {
		return &OpError{Op: "close raw steering", Err: err}
	}
	return nil
}

func (s *RawSteering) lock(op string) error {
	if s == nil {
		return &OpError{Op: op, Err: ErrClosed}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return &OpError{Op: op, Err: ErrClosed}
	}
	return nil
}

// Ifindex is the interface the program is attached to.
func (s *RawSteering) Ifindex() int { return s.ifindex }

// Mode says how the program is attached.
func (s *RawSteering) Mode() RawAttachMode { return s.mode }

// Fallback says why XDPAuto did not attach in native mode: an error matching
// ErrNotSupported when the native attach failed, a *NativeXDPCostError when native mode
// would have slowed the kernel's own traffic on the device (veth). It is nil when native
// mode is used or generic mode was asked for: it describes a choice made, not a failure of
// NewRawSteering.
func (s *RawSteering) Fallback() error { return s.fallback }

// NetNS is the inode number of the network namespace of the interface the program is
// attached to (the number in "net:[N]" of /proc/PID/ns/net): an ifindex names an interface
// only within its namespace.
func (s *RawSteering) NetNS() uint64 { return s.netns }

// NativeXDPCostError is why XDPAuto attached the raw-queue program in generic (skb) mode on
// a device where a native program costs the kernel's own traffic. On veth, attaching a
// native XDP program turns off TSO/GSO on the peer (the kernel must hand XDP single-page
// frames), so kernel TCP sent into the interface is segmented in software: on the
// machine this was measured on it ran at 0.24–0.30× its speed with a native program and
// at 0.85–0.9× with a generic one. Ask for native mode with XDPDriver to accept the cost.
type NativeXDPCostError struct {
	Driver string
}

func (e *NativeXDPCostError) Error() string {
	return e.Driver + ": native XDP would turn off the peer's TSO/GSO and slow the kernel's own TCP through the pair (to about 0.25-0.3x); generic mode chosen (XDPDriver asks for native)"
}

// threadNetNS is the inode of the calling thread's network namespace.
func threadNetNS() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0, fmt.Errorf("network namespace of this thread: %w", err)
	}
	return st.Ino, nil
}

// driverName is the driver of interface name in the calling thread's namespace
// (ETHTOOL_GDRVINFO), "" when it cannot be read.
func driverName(name string) string {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	info, err := unix.IoctlGetEthtoolDrvinfo(fd, name)
	if err != nil {
		return ""
	}
	return unix.ByteSliceToString(info.Driver[:])
}

// Metadata reports whether the device-bound program runs (RX timestamp and hash are asked
// of the device for every redirected frame); when it was asked for and does not, the error
// says why and matches ErrNotSupported.
func (s *RawSteering) Metadata() (bool, error) { return s.meta, s.metaErr }

// SetSocket puts an AF_XDP socket bound to RX queue `queue` of the interface into the
// XSKMAP: frames matching a rule that arrive on that queue go to it. A descriptor that is
// not an open AF_XDP socket gives an error matching ErrInvalid. The kernel does not check
// that the socket is bound to this interface's queue `queue` (hwq.OpenRawQueue binds it
// first): frames redirected to a socket bound elsewhere are dropped.
func (s *RawSteering) SetSocket(queue, fd int) error {
	op := fmt.Sprintf("set raw queue %d", queue)
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if queue < 0 || queue >= MaxRawQueues {
		return invalid(op, "queue %d out of range 0..%d", queue, MaxRawQueues-1)
	}
	if fd < 0 {
		return invalid(op, "descriptor %d", fd)
	}
	if err := s.maps.XskSockets.Update(uint32(queue), uint32(fd), ebpf.UpdateAny); err != nil {
		// xsk_map_update_elem: EBADF (no such descriptor), ENOTSOCK, EOPNOTSUPP (not an
		// AF_XDP socket).
		if errors.Is(err, unix.EBADF) || errors.Is(err, unix.ENOTSOCK) || errors.Is(err, unix.EOPNOTSUPP) {
			return invalid(op, "descriptor %d is not an AF_XDP socket (%v)", fd, err)
		}
		return opErr(op, err)
	}
	s.sockets[queue] = true
	return nil
}

// DeleteSocket removes queue's entry from the XSKMAP: matching frames arriving on that
// queue pass to the kernel stack (counted as no_socket). Removing an absent entry is not an
// error.
func (s *RawSteering) DeleteSocket(queue int) error {
	op := fmt.Sprintf("delete raw queue %d", queue)
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if queue < 0 || queue >= MaxRawQueues {
		return invalid(op, "queue %d out of range 0..%d", queue, MaxRawQueues-1)
	}
	if err := s.maps.XskSockets.Delete(uint32(queue)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return opErr(op, err)
	}
	delete(s.sockets, queue)
	return nil
}

// AddRule puts a rule in force and returns its id (its slot: among rules that match the
// same frame, the lowest id wins). It can be called while traffic flows: the slot is
// written before the program sees it. A rule identical to one in force is refused with a
// *RuleConflictError; an unusable rule with an error matching ErrInvalid.
func (s *RawSteering) AddRule(r RawRule) (int, error) {
	const op = "add raw rule"
	k, err := r.encode()
	if err != nil {
		return -1, &OpError{Op: op, Err: fmt.Errorf("%w: %w", ErrInvalid, err)}
	}
	if err := s.lock(op); err != nil {
		return -1, err
	}
	defer s.mu.Unlock()
	slot := -1
	for i := range MaxRawRules {
		if s.active&(1<<i) != 0 {
			if s.rules[i] == k {
				return -1, &OpError{Op: op, Err: &RuleConflictError{Rule: i}}
			}
		} else if slot < 0 {
			slot = i
		}
	}
	if slot < 0 {
		return -1, invalid(op, "all %d rules are in force", MaxRawRules)
	}
	if r.Join {
		fd, err := s.join(r.Dst)
		if err != nil {
			return -1, opErr(op, err)
		}
		s.joins[slot] = fd
		defer func() {
			if s.active&(1<<slot) == 0 { // the rule did not go into force
				unix.Close(s.joins[slot])
				s.joins[slot] = -1
			}
		}()
	}
	if err := s.maps.XskRules.Update(uint32(slot), &k, ebpf.UpdateAny); err != nil {
		return -1, opErr(op, err)
	}
	// Fresh counters for the slot.
	if err := s.zeroRuleStats(slot); err != nil {
		return -1, opErr(op, err)
	}
	s.active |= 1 << slot
	if err := s.writeConfig(); err != nil {
		s.active &^= 1 << slot
		return -1, opErr(op, err)
	}
	s.rules[slot] = k
	return slot, nil
}

func (s *RawSteering) zeroRuleStats(slot int) error {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return err
	}
	return s.maps.XskRuleCounters.Update(uint32(slot), make([]xskXskRuleStats, n), ebpf.UpdateAny)
}

// DeleteRule takes rule id out of force (frames it matched now pass to the kernel stack,
// or to the next matching rule). An id not in force gives an error matching ErrNotFound.
func (s *RawSteering) DeleteRule(id int) error {
	op := fmt.Sprintf("delete raw rule %d", id)
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if id < 0 || id >= MaxRawRules || s.active&(1<<id) == 0 {
		return &OpError{Op: op, Err: ErrNotFound}
	}
	s.active &^= 1 << id
	if err := s.writeConfig(); err != nil {
		s.active |= 1 << id
		return opErr(op, err)
	}
	s.rules[id] = xskXskRule{}
	if fd := s.joins[id]; fd >= 0 {
		unix.Close(fd) // leaves the group
		s.joins[id] = -1
	}
	return nil
}

// join opens a datagram socket in the interface's namespace that is a member of group on
// the interface. The socket is bound to no port: it receives nothing.
func (s *RawSteering) join(group netip.Addr) (int, error) {
	fd := -1
	err := netns.Do(s.nsFd, func() error {
		fam := unix.AF_INET6
		if group.Is4() {
			fam = unix.AF_INET
		}
		var err error
		if fd, err = unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return os.NewSyscallError("socket", err)
		}
		if group.Is4() {
			err = unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, &unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(s.ifindex)})
			return os.NewSyscallError("setsockopt IP_ADD_MEMBERSHIP", err)
		}
		err = unix.SetsockoptIPv6Mreq(fd, unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, &unix.IPv6Mreq{Multiaddr: group.As16(), Interface: uint32(s.ifindex)})
		return os.NewSyscallError("setsockopt IPV6_JOIN_GROUP", err)
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("join %v: %w", group, err)
	}
	return fd, nil
}

// Joined reports whether rule id holds a group membership (RawRule.Join).
func (s *RawSteering) Joined(id int) bool {
	if s.lock("raw rule joined") != nil {
		return false
	}
	defer s.mu.Unlock()
	return id >= 0 && id < MaxRawRules && s.active&(1<<id) != 0 && s.joins[id] >= 0
}

// RawRuleStats are one rule's counters since it was added.
type RawRuleStats struct {
	Packets, Bytes uint64 // frames redirected to a raw queue, with their bytes
	// NoSocket: frames that matched but arrived on an RX queue with no raw queue, and went
	// to the kernel stack.
	NoSocket uint64
}

// RuleStats reads rule id's counters.
func (s *RawSteering) RuleStats(id int) (RawRuleStats, error) {
	op := fmt.Sprintf("raw rule %d stats", id)
	if err := s.lock(op); err != nil {
		return RawRuleStats{}, err
	}
	defer s.mu.Unlock()
	if id < 0 || id >= MaxRawRules || s.active&(1<<id) == 0 {
		return RawRuleStats{}, &OpError{Op: op, Err: ErrNotFound}
	}
	var per []xskXskRuleStats
	if err := s.maps.XskRuleCounters.Lookup(uint32(id), &per); err != nil {
		return RawRuleStats{}, opErr(op, err)
	}
	var st RawRuleStats
	for _, v := range per {
		st.Packets += v.Packets
		st.Bytes += v.Bytes
		st.NoSocket += v.NoSocket
	}
	return st, nil
}

// RawSteeringStats are the program's counters.
type RawSteeringStats struct {
	Seen     uint64 // frames the program ran on
	Pass     uint64 // matched no rule: to the kernel stack
	Redirect uint64 // to a raw queue
	NoSocket uint64 // matched a rule on an RX queue with no raw queue: to the kernel stack
	// MetaTimestamp, MetaHash: frames for which the device gave an RX timestamp / hash.
	MetaTimestamp, MetaHash uint64
}

// Stats reads the program's counters.
func (s *RawSteering) Stats() (RawSteeringStats, error) {
	const op = "raw steering stats"
	if err := s.lock(op); err != nil {
		return RawSteeringStats{}, err
	}
	defer s.mu.Unlock()
	var c [xskCounters]uint64
	for i := range c {
		var per []uint64
		if err := s.maps.XskCounters.Lookup(uint32(i), &per); err != nil {
			return RawSteeringStats{}, opErr(op, err)
		}
		for _, v := range per {
			c[i] += v
		}
	}
	return RawSteeringStats{Seen: c[xskCSeen], Pass: c[xskCPass], Redirect: c[xskCRedirect],
		NoSocket: c[xskCNoSocket], MetaTimestamp: c[xskCMetaTS], MetaHash: c[xskCMetaHash]}, nil
}

// RawMeta is the RX metadata the device-bound program put before a frame.
type RawMeta struct {
	Timestamp    uint64 // device RX timestamp in ns, when HasTimestamp
	Hash         uint32 // RX hash, when HasHash
	HashType     uint32 // enum xdp_rss_hash_type
	HasTimestamp bool
	HasHash      bool
}

// ParseRawMeta reads the metadata the program wrote in the bytes just before a received
// frame (a raw queue passes the frame's headroom). ok is false when none is there.
func ParseRawMeta(before []byte) (m RawMeta, ok bool) {
	if len(before) < xskMetaSize {
		return m, false
	}
	b := before[len(before)-xskMetaSize:]
	ne := binary.NativeEndian
	x := xskXskMeta{RxTimestamp: ne.Uint64(b[0:]), RxHash: ne.Uint32(b[8:]), RxHashType: ne.Uint32(b[12:]),
		Flags: ne.Uint32(b[16:]), Magic: ne.Uint32(b[20:])}
	if x.Magic != xskMetaMagic {
		return m, false
	}
	m = RawMeta{Timestamp: x.RxTimestamp, Hash: x.RxHash, HashType: x.RxHashType,
		HasTimestamp: x.Flags&xskMetaTimestamp != 0, HasHash: x.Flags&xskMetaHash != 0}
	return m, true
}

// RawMetaSize is the size of the metadata ParseRawMeta reads.
const RawMetaSize = xskMetaSize
