package hwq

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Flow is a TCP flow as seen by the receiving NIC: Local is this host's address and port
// (the packets' destination), Remote the peer's (their source). A zero address or port is a
// wildcard. Local and Remote must be of one family when both addresses are set; IPv4-mapped
// IPv6 addresses count as IPv4.
type Flow struct {
	Local, Remote netip.AddrPort
}

func (f Flow) String() string {
	return fmt.Sprintf("tcp %s <- %s", f.Local, f.Remote)
}

// is6 reports the family and validates the flow.
func (f Flow) is6() (bool, error) {
	l, r := f.Local.Addr().Unmap(), f.Remote.Addr().Unmap()
	switch {
	case l.IsValid() && r.IsValid() && l.Is4() != r.Is4():
		return false, &ValueError{Name: "flow", Value: f, Reason: "local and remote addresses of different families"}
	case l.IsValid():
		return l.Is6(), nil
	case r.IsValid():
		return r.Is6(), nil
	}
	return false, nil // ports only: an IPv4 rule (use FlowRule.IPv6 for IPv6)
}

// FlowRule is an ntuple (ethtool -N) rule steering a TCP flow to an RX queue, or to an RSS
// context (then Queue is an offset inside the context).
type FlowRule struct {
	Flow       Flow
	IPv6       bool   // match IPv6 (implied by the flow's addresses when they are set)
	Queue      uint32 // RX queue (ring_cookie)
	RSSContext uint32 // 0: none (steer to Queue itself)
	Location   uint32 // the rule's slot in the device's table (set by AddFlowRule)
}

// RXRings returns the number of RX rings the ntuple/RSS code of the driver uses
// (ETHTOOL_GRXRINGS).
func (c *Client) RXRings(ifname string) (uint32, error) {
	buf, nfc := rxnfcBuf(0)
	nfc.Cmd = ethtoolGRXRings
	err := c.ethtoolIoctl(ifname, unsafe.Pointer(&buf[0]))
	if err != nil {
		return 0, opErr("rx rings", ifname, refuse(err, featRSS, needRSS))
	}
	return uint32(nfc.Data), nil
}

// FlowRules lists the device's ntuple rules (ETHTOOL_GRXCLSRLCNT, GRXCLSRLALL,
// GRXCLSRULE). Rules of flow types other than TCP are listed with a zero Flow.
func (c *Client) FlowRules(ifname string) ([]FlowRule, error) {
	const op = "ntuple list"
	count, _, err := c.ruleCount(ifname)
	if err != nil {
		return nil, opErr(op, ifname, err)
	}
	locs, err := c.ruleLocations(ifname, count)
	if err != nil {
		return nil, opErr(op, ifname, err)
	}
	out := make([]FlowRule, 0, len(locs))
	for _, loc := range locs {
		buf, nfc := rxnfcBuf(0)
		nfc.Cmd = ethtoolGRXClsRule
		nfc.FS.Location = loc
		if err := c.ethtoolIoctl(ifname, unsafe.Pointer(&buf[0])); err != nil {
			return nil, opErr(op, ifname, refuse(err, featNtuple, needNtuple))
		}
		out = append(out, decodeRule(nfc))
	}
	return out, nil
}

// ruleCount returns the number of rules and the table size (ETHTOOL_GRXCLSRLCNT); special
// reports whether the driver picks locations itself (RX_CLS_LOC_SPECIAL).
func (c *Client) ruleCount(ifname string) (count uint32, special bool, err error) {
	buf, nfc := rxnfcBuf(0)
	nfc.Cmd = ethtoolGRXClsRlCnt
	if err := c.ethtoolIoctl(ifname, unsafe.Pointer(&buf[0])); err != nil {
		return 0, false, refuse(err, featNtuple, needNtuple)
	}
	return nfc.RuleCnt, nfc.Data&rxClsLocSpecial != 0, nil
}

func (c *Client) ruleLocations(ifname string, count uint32) ([]uint32, error) {
	if count == 0 {
		return nil, nil
	}
	if count > 1<<16 {
		return nil, fmt.Errorf("driver reports %d ntuple rules", count)
	}
	buf, nfc := rxnfcBuf(int(count))
	nfc.Cmd = ethtoolGRXClsRlAll
	nfc.RuleCnt = count
	if err := c.ethtoolIoctl(ifname, unsafe.Pointer(&buf[0])); err != nil {
		return nil, refuse(err, featNtuple, needNtuple)
	}
	n := min(nfc.RuleCnt, count)
	return append([]uint32(nil), ruleLocs(buf, int(n))...), nil
}

// tableSize returns the rule table size (GRXCLSRLCNT's data without the special flag).
func (c *Client) tableSize(ifname string) (uint32, error) {
	buf, nfc := rxnfcBuf(0)
	nfc.Cmd = ethtoolGRXClsRlCnt
	if err := c.ethtoolIoctl(ifname, unsafe.Pointer(&buf[0])); err != nil {
		return 0, refuse(err, featNtuple, needNtuple)
	}
	return uint32(nfc.Data) &^ rxClsLocSpecial, nil
}

// AddFlowRule inserts an ntuple rule (ETHTOOL_SRXCLSRLINS, the ethtool -N equivalent) and
// returns it with its Location. Drivers that choose locations themselves get
// RX_CLS_LOC_ANY; for the others the last free slot of the table is used, as ethtool(8)
// does. A device without ntuple filters is refused with an error matching ErrNotSupported
// that names "ntuple filters".
func (c *Client) AddFlowRule(ifname string, r FlowRule) (FlowRule, error) {
	const op = "ntuple insert"
	fs, err := encodeRule(r)
	if err != nil {
		return r, opErr(op, ifname, err)
	}
	count, special, err := c.ruleCount(ifname)
	if err != nil {
		return r, opErr(op, ifname, err)
	}
	loc := uint32(rxClsLocAny)
	if !special {
		size, err := c.tableSize(ifname)
		if err != nil {
			return r, opErr(op, ifname, err)
		}
		used, err := c.ruleLocations(ifname, count)
		if err != nil {
			return r, opErr(op, ifname, err)
		}
		if loc, err = freeSlot(size, used); err != nil {
			return r, opErr(op, ifname, err)
		}
	}
	buf, nfc := rxnfcBuf(0)
	nfc.Cmd = ethtoolSRXClsRlIns
	nfc.FS = fs
	nfc.FS.Location = loc
	if r.RSSContext != 0 {
		nfc.RuleCnt = r.RSSContext // the rss_context member of the union
	}
	if err := c.ethtoolIoctl(ifname, unsafe.Pointer(&buf[0])); err != nil {
		return r, opErr(op, ifname, refuse(err, featNtuple, needNtuple))
	}
	r.Location = nfc.FS.Location
	return r, nil
}

// freeSlot picks the highest free location below size.
func freeSlot(size uint32, used []uint32) (uint32, error) {
	taken := make(map[uint32]bool, len(used))
	for _, u := range used {
		taken[u] = true
	}
	for loc := int64(size) - 1; loc >= 0; loc-- {
		if !taken[uint32(loc)] {
			return uint32(loc), nil
		}
	}
	return 0, fmt.Errorf("ntuple rule table full (%d slots): %w", size, unix.ENOSPC)
}

// DeleteFlowRule removes the ntuple rule at loc (ETHTOOL_SRXCLSRLDEL).
func (c *Client) DeleteFlowRule(ifname string, loc uint32) error {
	buf, nfc := rxnfcBuf(0)
	nfc.Cmd = ethtoolSRXClsRlDel
	nfc.FS.Location = loc
	err := c.ethtoolIoctl(ifname, unsafe.Pointer(&buf[0]))
	return opErr("ntuple delete", ifname, refuse(err, featNtuple, needNtuple))
}

// Offsets inside union ethtool_flow_union for the TCP specs.
const (
	ip4SrcOff, ip4DstOff, ip4PSrcOff, ip4PDstOff = 0, 4, 8, 10   // struct ethtool_tcpip4_spec
	ip6SrcOff, ip6DstOff, ip6PSrcOff, ip6PDstOff = 0, 16, 32, 34 // struct ethtool_tcpip6_spec
)

func encodeRule(r FlowRule) (ethtoolRxFlowSpec, error) {
	var fs ethtoolRxFlowSpec
	is6, err := r.Flow.is6()
	if err != nil {
		return fs, err
	}
	is6 = is6 || r.IPv6
	if r.Flow.Local.Port() == 0 && r.Flow.Remote.Port() == 0 && !r.Flow.Local.Addr().IsValid() && !r.Flow.Remote.Addr().IsValid() {
		return fs, &ValueError{Name: "flow", Value: r.Flow, Reason: "matches every TCP packet; set at least one address or port"}
	}
	fs.RingCookie = uint64(r.Queue)
	putAddr := func(off int, a netip.Addr) {
		if !a.IsValid() {
			return
		}
		a = a.Unmap()
		b := a.AsSlice()
		copy(fs.H[off:], b)
		for i := range b {
			fs.M[off+i] = 0xff
		}
	}
	putPort := func(off int, p uint16) {
		if p == 0 {
			return
		}
		binary.BigEndian.PutUint16(fs.H[off:], p)
		binary.BigEndian.PutUint16(fs.M[off:], 0xffff)
	}
	// The NIC sees the peer as the source and this host as the destination.
	if is6 {
		fs.FlowType = tcpV6Flow
		putAddr(ip6SrcOff, r.Flow.Remote.Addr())
		putAddr(ip6DstOff, r.Flow.Local.Addr())
		putPort(ip6PSrcOff, r.Flow.Remote.Port())
		putPort(ip6PDstOff, r.Flow.Local.Port())
	} else {
		fs.FlowType = tcpV4Flow
		putAddr(ip4SrcOff, r.Flow.Remote.Addr())
		putAddr(ip4DstOff, r.Flow.Local.Addr())
		putPort(ip4PSrcOff, r.Flow.Remote.Port())
		putPort(ip4PDstOff, r.Flow.Local.Port())
	}
	if r.RSSContext != 0 {
		fs.FlowType |= flowRSS
	}
	return fs, nil
}

func decodeRule(nfc *ethtoolRxnfc) FlowRule {
	fs := &nfc.FS
	r := FlowRule{Queue: uint32(fs.RingCookie), Location: fs.Location}
	if fs.FlowType&flowRSS != 0 {
		r.RSSContext = nfc.RuleCnt
	}
	addr := func(off, n int) netip.Addr {
		for _, m := range fs.M[off : off+n] {
			if m != 0 {
				a, _ := netip.AddrFromSlice(fs.H[off : off+n])
				return a
			}
		}
		return netip.Addr{}
	}
	port := func(off int) uint16 {
		if binary.BigEndian.Uint16(fs.M[off:]) == 0 {
			return 0
		}
		return binary.BigEndian.Uint16(fs.H[off:])
	}
	switch fs.FlowType &^ (flowExt | flowMacExt | flowRSS) {
	case tcpV4Flow:
		r.Flow.Remote = netip.AddrPortFrom(addr(ip4SrcOff, 4), port(ip4PSrcOff))
		r.Flow.Local = netip.AddrPortFrom(addr(ip4DstOff, 4), port(ip4PDstOff))
	case tcpV6Flow:
		r.IPv6 = true
		r.Flow.Remote = netip.AddrPortFrom(addr(ip6SrcOff, 16), port(ip6PSrcOff))
		r.Flow.Local = netip.AddrPortFrom(addr(ip6DstOff, 16), port(ip6PDstOff))
	}
	return r
}

var errNoRSS = errors.New("device has no RSS indirection table")
