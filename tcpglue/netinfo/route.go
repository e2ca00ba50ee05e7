package netinfo

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"

	"github.com/jsimonetti/rtnetlink/v2"
	"golang.org/x/sys/unix"
)

// Route is the kernel's answer to "how do I reach this destination" (RTM_GETROUTE, what
// ip route get prints).
type Route struct {
	Dst     netip.Addr
	Gateway netip.Addr // invalid when the destination is on-link
	NextHop netip.Addr // Gateway, or Dst itself when on-link: whose MAC the frames carry
	Ifindex int
	Ifname  string
	Src     netip.Addr // the source address the kernel would choose (RTA_PREFSRC)
	Table   uint32
	Type    uint8 // RTN_UNICAST, RTN_LOCAL, ...
	// MTU is the path MTU towards Dst: the route's mtu metric or a learned PMTU exception
	// when there is one, the outgoing device's MTU otherwise. RouteMTU says which.
	MTU      uint32
	RouteMTU bool
}

// Local reports whether the destination is an address of this host (RTN_LOCAL).
func (r Route) Local() bool { return r.Type == unix.RTN_LOCAL }

func ipOf(a netip.Addr) net.IP { return net.IP(a.Unmap().AsSlice()) }

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func family(a netip.Addr) uint8 {
	if a.Unmap().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// RouteTo asks the kernel how it would send to dst. An unreachable destination is an error
// matching unix.ENETUNREACH (or EHOSTUNREACH, EACCES for prohibited routes).
func (s *Stack) RouteTo(dst netip.Addr) (Route, error) {
	var r Route
	err := s.use("route get", dst.String(), func() (err error) {
		r, err = s.routeTo(dst)
		return err
	})
	return r, err
}

func (s *Stack) routeTo(dst netip.Addr) (Route, error) {
	if !dst.IsValid() {
		return Route{}, fmt.Errorf("invalid destination address")
	}
	dst = dst.Unmap()
	req := &rtnetlink.RouteMessage{
		Family:     family(dst),
		DstLength:  uint8(dst.BitLen()),
		Attributes: rtnetlink.RouteAttributes{Dst: ipOf(dst)},
	}
	if dst.Zone() != "" {
		if ifi, err := net.InterfaceByName(dst.Zone()); err == nil {
			req.Attributes.OutIface = uint32(ifi.Index)
		}
	}
	msgs, err := s.rt.Route.Get(req)
	if err != nil {
		return Route{}, err
	}
	if len(msgs) == 0 {
		return Route{}, errNoReply
	}
	m := msgs[0]
	r := Route{
		Dst:     dst,
		Gateway: addrOf(m.Attributes.Gateway),
		Ifindex: int(m.Attributes.OutIface),
		Src:     addrOf(m.Attributes.Src),
		Table:   m.Attributes.Table,
		Type:    m.Type,
	}
	if r.Table == 0 {
		r.Table = uint32(m.Table)
	}
	r.NextHop = r.Gateway
	if !r.NextHop.IsValid() {
		r.NextHop = dst.WithZone("")
	}
	if m.Attributes.Metrics != nil && m.Attributes.Metrics.MTU != 0 {
		r.MTU, r.RouteMTU = m.Attributes.Metrics.MTU, true
	}
	if r.Ifindex > 0 {
		l, err := s.rt.Link.Get(uint32(r.Ifindex))
		if err == nil && l.Attributes != nil {
			r.Ifname = l.Attributes.Name
			if r.MTU == 0 {
				r.MTU = l.Attributes.MTU
			}
		}
	}
	return r, nil
}

// SourceAddr is one local address usable as the source towards a destination.
type SourceAddr struct {
	Addr    netip.Prefix // the address with its prefix length
	Ifindex int
	Ifname  string
	Why     string // which selection rule put it at its rank
}

// Address flags (IFA_F_*, include/uapi/linux/if_addr.h via golang.org/x/sys/unix).
const (
	ifaFSecondary  = unix.IFA_F_SECONDARY
	ifaFOptimistic = unix.IFA_F_OPTIMISTIC
	ifaFDADFailed  = unix.IFA_F_DADFAILED
	ifaFDeprecated = unix.IFA_F_DEPRECATED
	ifaFTentative  = unix.IFA_F_TENTATIVE
	ifaFTemporary  = unix.IFA_F_TEMPORARY
)

type localAddr struct {
	addr    netip.Prefix
	ifindex int
	scope   uint8
	flags   uint32
	order   int // position in the kernel's dump
}

// SourceAddrs lists the local addresses usable as the source address of a connection to
// dst, the kernel's own choice first (RTA_PREFSRC of RTM_GETROUTE, which is what connect
// without bind uses), then the others in the order the kernel's selection rules rank them:
//
// IPv4 (inet_select_addr, fib_select_default): addresses of the outgoing device before
// those of other devices; on the outgoing device primary addresses in the next hop's
// subnet, then its other primary addresses, then its secondary addresses (never chosen by
// the kernel, usable with bind); on other devices, primary addresses before secondary
// ones; each group in the kernel's address-list order. Addresses of a scope narrower than
// the route's (127.0.0.0/8 on lo for a remote destination, link-scope addresses behind a
// gateway) are left out.
//
// IPv6 (RFC 6724 section 5 as ipv6_dev_get_saddr implements it, default policy table):
// the destination itself; the smallest scope at least the destination's (narrower scopes
// are left out); not deprecated;
// on the outgoing interface; same policy label; public before temporary; longest common
// prefix (capped at the address's prefix length); then the kernel's list order.
// Tentative and DAD-failed addresses are left out.
//
// Linux is a weak-host stack: every listed address can be bound and used whatever device
// the packets leave by (unless a firewall or the peer's rp_filter objects).
func (s *Stack) SourceAddrs(dst netip.Addr) ([]SourceAddr, error) {
	var out []SourceAddr
	err := s.use("source addrs", dst.String(), func() error {
		r, err := s.routeTo(dst)
		if err != nil {
			return err
		}
		addrs, names, err := s.localAddrs(family(dst))
		if err != nil {
			return err
		}
		if dst.Unmap().Is4() {
			out = rankIPv4(r, addrs)
		} else {
			out = rankIPv6(dst, r, addrs)
		}
		for i := range out {
			out[i].Ifname = names[out[i].Ifindex]
		}
		return nil
	})
	return out, err
}

func (s *Stack) localAddrs(fam uint8) ([]localAddr, map[int]string, error) {
	msgs, err := s.rt.Address.List()
	if err != nil {
		return nil, nil, err
	}
	links, err := s.rt.Link.List()
	if err != nil {
		return nil, nil, err
	}
	names := map[int]string{}
	for _, l := range links {
		if l.Attributes != nil {
			names[int(l.Index)] = l.Attributes.Name
		}
	}
	var out []localAddr
	for i, m := range msgs {
		if m.Family != fam || m.Attributes == nil {
			continue
		}
		ip := m.Attributes.Local
		if ip == nil {
			ip = m.Attributes.Address
		}
		a := addrOf(ip)
		if !a.IsValid() {
			continue
		}
		flags := uint32(m.Flags)
		if m.Attributes.Flags != 0 {
			flags = m.Attributes.Flags
		}
		out = append(out, localAddr{addr: netip.PrefixFrom(a, int(m.PrefixLength)), ifindex: int(m.Index),
			scope: m.Scope, flags: flags, order: i})
	}
	return out, names, nil
}

// routeScope is the scope an IPv4 source must not exceed for this route: host for local
// destinations, link for on-link ones, universe behind a gateway.
func routeScope(r Route) uint8 {
	switch {
	case r.Local():
		return unix.RT_SCOPE_HOST
	case !r.Gateway.IsValid():
		return unix.RT_SCOPE_LINK
	}
	return unix.RT_SCOPE_UNIVERSE
}

func rankIPv4(r Route, addrs []localAddr) []SourceAddr {
	scope := routeScope(r)
	type ranked struct {
		a    localAddr
		rank int
		why  string
	}
	var rs []ranked
	for _, a := range addrs {
		if a.scope > scope {
			continue
		}
		var rank int
		var why string
		secondary := a.flags&ifaFSecondary != 0
		switch {
		case a.addr.Addr() == r.Src:
			rank, why = 0, "kernel's choice (route get prefsrc)"
		case a.ifindex == r.Ifindex && !secondary && a.addr.Contains(r.NextHop):
			rank, why = 1, "primary on the outgoing device, next hop's subnet"
		case a.ifindex == r.Ifindex && !secondary:
			rank, why = 2, "primary on the outgoing device"
		case a.ifindex == r.Ifindex:
			rank, why = 3, "secondary on the outgoing device (only with bind)"
		case !secondary:
			rank, why = 4, "primary on another device"
		default:
			rank, why = 5, "secondary on another device (only with bind)"
		}
		rs = append(rs, ranked{a, rank, why})
	}
	sort.SliceStable(rs, func(i, j int) bool {
		if rs[i].rank != rs[j].rank {
			return rs[i].rank < rs[j].rank
		}
		// The kernel walks other devices in ifindex order, each device's list in order.
		if rs[i].a.ifindex != rs[j].a.ifindex {
			return rs[i].a.ifindex < rs[j].a.ifindex
		}
		return rs[i].a.order < rs[j].a.order
	})
	out := make([]SourceAddr, len(rs))
	for i, x := range rs {
		out[i] = SourceAddr{Addr: x.a.addr, Ifindex: x.a.ifindex, Why: x.why}
	}
	return out
}

// IPv6 scopes (RFC 4291 section 2.7 values, as the kernel's ipv6_addr_src_scope uses).
const (
	scopeLinkLocal = 0x2
	scopeSiteLocal = 0x5
	scopeGlobal    = 0xe
	scopeNode      = 0x1
)

func v6Scope(a netip.Addr) int {
	switch {
	case a.IsLoopback():
		return scopeNode
	case a.IsLinkLocalUnicast():
		return scopeLinkLocal
	case a.IsMulticast():
		return int(a.As16()[1] & 0x0f)
	case a.As16()[0] == 0xfe && a.As16()[1]&0xc0 == 0xc0:
		return scopeSiteLocal
	}
	return scopeGlobal
}

// v6Policy is the RFC 6724 default policy table as the kernel installs it
// (net/ipv6/addrlabel.c), longest prefixes first.
var v6Policy = []struct {
	p     netip.Prefix
	label int
}{
	{netip.MustParsePrefix("::1/128"), 0},
	{netip.MustParsePrefix("::ffff:0:0/96"), 4},
	{netip.MustParsePrefix("::/96"), 3},
	{netip.MustParsePrefix("2001::/32"), 6},
	{netip.MustParsePrefix("2001:10::/28"), 7},
	{netip.MustParsePrefix("3ffe::/16"), 12},
	{netip.MustParsePrefix("2002::/16"), 2},
	{netip.MustParsePrefix("fec0::/10"), 11},
	{netip.MustParsePrefix("fc00::/7"), 5},
}

// v6Label is an address's label in the default policy table (::/0 has label 1).
func v6Label(a netip.Addr) int {
	best, label := -1, 1
	for _, e := range v6Policy {
		if e.p.Contains(a) && e.p.Bits() > best {
			best, label = e.p.Bits(), e.label
		}
	}
	return label
}

func commonPrefix(a, b netip.Addr) int {
	x, y := a.As16(), b.As16()
	n := 0
	for i := range x {
		d := x[i] ^ y[i]
		if d == 0 {
			n += 8
			continue
		}
		for d&0x80 == 0 {
			n++
			d <<= 1
		}
		break
	}
	return n
}

func rankIPv6(dst netip.Addr, r Route, addrs []localAddr) []SourceAddr {
	dst = dst.WithZone("")
	dscope := v6Scope(dst)
	var cands []localAddr
	for _, a := range addrs {
		if a.flags&(ifaFTentative|ifaFDADFailed) != 0 && a.flags&ifaFOptimistic == 0 {
			continue
		}
		// A source of a narrower scope than the destination's cannot reach it (a
		// link-local source for a global destination), and a link-local source only
		// works on its own link.
		sc := v6Scope(a.addr.Addr())
		if sc < dscope || (sc == scopeLinkLocal && a.ifindex != r.Ifindex) {
			continue
		}
		cands = append(cands, a)
	}
	// better reports whether x is preferred over y, and the rule that decided.
	// With kernel, the kernel's own choice beats every rule.
	better := func(x, y localAddr, kernel bool) (bool, string, bool) {
		xa, ya := x.addr.Addr(), y.addr.Addr()
		if kernel && r.Src.IsValid() && (xa == r.Src) != (ya == r.Src) {
			return xa == r.Src, "kernel's choice (route get prefsrc)", true
		}
		if (xa == dst) != (ya == dst) {
			return xa == dst, "rule 1: the destination itself", true
		}
		xs, ys := v6Scope(xa), v6Scope(ya)
		if xs != ys {
			if xs < ys {
				return xs >= dscope, "rule 2: scope", true
			}
			return ys < dscope, "rule 2: scope", true
		}
		xd, yd := x.flags&ifaFDeprecated != 0, y.flags&ifaFDeprecated != 0
		if xd != yd {
			return !xd, "rule 3: not deprecated", true
		}
		xo, yo := x.ifindex == r.Ifindex, y.ifindex == r.Ifindex
		if xo != yo {
			return xo, "rule 5: on the outgoing interface", true
		}
		dl := v6Label(dst)
		xl, yl := v6Label(xa) == dl, v6Label(ya) == dl
		if xl != yl {
			return xl, "rule 6: same policy label", true
		}
		xt, yt := x.flags&ifaFTemporary != 0, y.flags&ifaFTemporary != 0
		if xt != yt {
			return !xt, "rule 7: public before temporary", true
		}
		xp, yp := min(commonPrefix(xa, dst), x.addr.Bits()), min(commonPrefix(ya, dst), y.addr.Bits())
		if xp != yp {
			return xp > yp, "rule 8: longest matching prefix", true
		}
		return false, "", false
	}
	idx := make([]int, len(cands))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool {
		b, _, decided := better(cands[idx[i]], cands[idx[j]], true)
		if !decided {
			return cands[idx[i]].order < cands[idx[j]].order
		}
		return b
	})
	out := make([]SourceAddr, 0, len(idx))
	for k, i := range idx {
		w := "kernel's list order"
		switch {
		case k == 0 && r.Src.IsValid() && cands[i].addr.Addr() == r.Src:
			w = "kernel's choice (route get prefsrc)"
		case k > 0:
			// Name the rule that ranks it below its predecessor.
			if _, rule, decided := better(cands[idx[k-1]], cands[i], false); decided {
				w = "below the previous by " + rule
			}
		case len(idx) > 1:
			if _, rule, decided := better(cands[i], cands[idx[1]], false); decided {
				w = rule
			}
		}
		out = append(out, SourceAddr{Addr: cands[i].addr, Ifindex: cands[i].ifindex, Why: w})
	}
	return slices.Clip(out)
}
