package bpf

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// rawModel is the rules' meaning written from their documentation, independently of
// c/xsk.bpf.c: what a frame offers to match.
type rawModel struct {
	mac                  net.HardwareAddr
	v4, v6, l3, ports    bool
	src, dst             netip.Addr
	proto, dscp          uint8
	flow                 uint32
	sport, dport         uint16
	vni                  uint32
	hasVNI, hasFlowLabel bool
}

func modelParse(f []byte) (m rawModel, ok bool) {
	if len(f) < 14 {
		return m, false
	}
	m.mac = net.HardwareAddr(f[0:6])
	et := binary.BigEndian.Uint16(f[12:])
	l3 := f[14:]
	if et == 0x8100 || et == 0x88a8 {
		if len(l3) < 4 {
			return m, true
		}
		et = binary.BigEndian.Uint16(l3[2:])
		l3 = l3[4:]
	}
	var l4 []byte
	switch et {
	case 0x0800:
		if len(l3) < 20 || l3[0]&15 < 5 {
			return m, true
		}
		m.v4, m.l3 = true, true
		m.src, m.dst = netip.AddrFrom4([4]byte(l3[12:16])), netip.AddrFrom4([4]byte(l3[16:20]))
		m.dscp, m.proto = l3[1]>>2, l3[9]
		if binary.BigEndian.Uint16(l3[6:])&0x1fff != 0 {
			return m, true
		}
		if ihl := int(l3[0]&15) * 4; ihl <= len(l3) {
			l4 = l3[ihl:]
		}
	case 0x86dd:
		if len(l3) < 40 {
			return m, true
		}
		m.v6, m.l3, m.hasFlowLabel = true, true, true
		m.src, m.dst = netip.AddrFrom16([16]byte(l3[8:24])), netip.AddrFrom16([16]byte(l3[24:40]))
		tc := (l3[0]&15)<<4 | l3[1]>>4
		m.dscp, m.proto = tc>>2, l3[6]
		m.flow = binary.BigEndian.Uint32(l3[0:]) & 0xfffff
		l4 = l3[40:]
	default:
		return m, true
	}
	if (m.proto != unix.IPPROTO_UDP && m.proto != unix.IPPROTO_TCP) || len(l4) < 4 {
		return m, true
	}
	m.ports = true
	m.sport, m.dport = binary.BigEndian.Uint16(l4[0:]), binary.BigEndian.Uint16(l4[2:])
	if m.proto == unix.IPPROTO_UDP && m.dport == VXLANPort && len(l4) >= 16 && l4[8]&0x08 != 0 {
		m.hasVNI = true
		m.vni = uint32(l4[12])<<16 | uint32(l4[13])<<8 | uint32(l4[14])
	}
	return m, true
}

// modelMatch says whether rule r takes a frame offering m.
func modelMatch(r RawRule, m rawModel) bool {
	v4 := r.IPv4 || (r.Src.IsValid() && r.Src.Unmap().Is4()) || (r.Dst.IsValid() && r.Dst.Unmap().Is4())
	v6 := r.IPv6 || r.MatchFlowLabel || (r.Src.IsValid() && !r.Src.Unmap().Is4()) || (r.Dst.IsValid() && !r.Dst.Unmap().Is4())
	switch {
	case v4 && !m.v4, v6 && !m.v6:
		return false
	case r.DstMAC != nil && (m.mac == nil || string(r.DstMAC) != string(m.mac)):
		return false
	case r.Src.IsValid() && (!m.l3 || r.Src.As16() != m.src.As16()):
		return false
	case r.Dst.IsValid() && (!m.l3 || r.Dst.As16() != m.dst.As16()):
		return false
	case r.Proto != 0 && (!m.l3 || r.Proto != m.proto):
		return false
	case r.SrcPort != 0 && (!m.ports || r.SrcPort != m.sport):
		return false
	case r.DstPort != 0 && (!m.ports || r.DstPort != m.dport):
		return false
	case r.MatchDSCP && (!m.l3 || r.DSCP != m.dscp):
		return false
	case r.MatchFlowLabel && (!m.hasFlowLabel || r.FlowLabel != m.flow):
		return false
	case r.MatchVNI && (!m.hasVNI || r.VNI != m.vni):
		return false
	}
	return true
}

var (
	modelMACs  = []net.HardwareAddr{{1, 0, 0x5e, 1, 1, 1}, {2, 0, 0, 0, 0, 1}}
	modelAddrs = []netip.Addr{netip.MustParseAddr("239.1.1.1"), netip.MustParseAddr("10.0.0.1"),
		netip.MustParseAddr("ff15::1"), netip.MustParseAddr("fd00::1")}
	modelPorts = []uint16{VXLANPort, 5000, 6000}
)

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

func randomFrame(r *rand.Rand) []byte {
	f := make([]byte, 14, 128)
	copy(f, pick(r, modelMACs))
	v6 := r.IntN(2) == 0
	et := uint16(0x0800)
	if v6 {
		et = 0x86dd
	}
	if r.IntN(8) == 0 {
		et = 0x0806 // ARP: no L3 the rules know
	}
	if r.IntN(5) == 0 {
		binary.BigEndian.PutUint16(f[12:], 0x8100)
		f = append(f, 0, 7, byte(et>>8), byte(et))
	} else {
		binary.BigEndian.PutUint16(f[12:], et)
	}
	proto := pick(r, []uint8{unix.IPPROTO_UDP, unix.IPPROTO_TCP, unix.IPPROTO_ICMP})
	dscp := pick(r, []uint8{0, 46, 10})
	if v6 {
		ip := make([]byte, 40)
		flow := pick(r, []uint32{0, 0x12345, 0xfffff})
		binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(dscp)<<22|uint32(r.IntN(4))<<20|flow)
		ip[6], ip[7] = proto, 64
		a, b := pick(r, modelAddrs).As16(), pick(r, modelAddrs).As16()
		copy(ip[8:], a[:])
		copy(ip[24:], b[:])
		f = append(f, ip...)
	} else {
		ip := make([]byte, 20)
		ip[0], ip[1], ip[8], ip[9] = 0x45, dscp<<2|uint8(r.IntN(4)), 64, proto
		if r.IntN(6) == 0 {
			ip[0] = 0x46 // options: ports 4 bytes further
			ip = append(ip, 1, 1, 1, 0)
		}
		if r.IntN(6) == 0 {
			binary.BigEndian.PutUint16(ip[6:], uint16(1+r.IntN(100))) // a later fragment
		}
		a, b := pick(r, modelAddrs).Unmap(), pick(r, modelAddrs).Unmap()
		if a.Is4() {
			copy(ip[12:16], a.AsSlice())
		}
		if b.Is4() {
			copy(ip[16:20], b.AsSlice())
		}
		f = append(f, ip...)
	}
	l4 := make([]byte, 8)
	binary.BigEndian.PutUint16(l4[0:], pick(r, modelPorts))
	binary.BigEndian.PutUint16(l4[2:], pick(r, modelPorts))
	f = append(f, l4...)
	flags := byte(0x08)
	if r.IntN(4) == 0 {
		flags = 0
	}
	vni := pick(r, []uint32{1, 4242, 0xffffff})
	f = append(f, flags, 0, 0, 0, byte(vni>>16), byte(vni>>8), byte(vni), 0)
	f = append(f, make([]byte, r.IntN(16))...)
	if r.IntN(4) == 0 {
		f = f[:14+r.IntN(len(f)-13)] // truncated anywhere after the Ethernet header
	}
	return f
}

func randomRule(r *rand.Rand) RawRule {
	var x RawRule
	for x.encodeOK() == false {
		x = RawRule{}
		if r.IntN(4) == 0 {
			x.DstMAC = pick(r, modelMACs)
		}
		if r.IntN(3) == 0 {
			x.Dst = pick(r, modelAddrs)
		}
		if r.IntN(4) == 0 {
			x.Src = pick(r, modelAddrs)
		}
		if r.IntN(3) == 0 {
			x.Proto = pick(r, []uint8{unix.IPPROTO_UDP, unix.IPPROTO_TCP, unix.IPPROTO_ICMP})
		}
		if r.IntN(3) == 0 {
			x.DstPort = pick(r, modelPorts)
		}
		if r.IntN(4) == 0 {
			x.SrcPort = pick(r, modelPorts)
		}
		if r.IntN(4) == 0 {
			x.DSCP, x.MatchDSCP = pick(r, []uint8{0, 46, 10}), true
		}
		if r.IntN(5) == 0 {
			x.FlowLabel, x.MatchFlowLabel = pick(r, []uint32{0, 0x12345}), true
		}
		if r.IntN(4) == 0 {
			x.VNI, x.MatchVNI = pick(r, []uint32{1, 4242}), true
		}
		if r.IntN(8) == 0 {
			x.IPv4 = true
		}
		if r.IntN(8) == 0 {
			x.IPv6 = true
		}
	}
	return x
}

func (x RawRule) encodeOK() bool { _, err := x.encode(); return err == nil }

// TestRawRulesModel runs random frames (VLAN tags, IPv4 options and fragments, IPv6, ARP,
// truncation anywhere) through zc_xsk with BPF_PROG_TEST_RUN under random rule sets, and
// checks that the rule the program picks (its counters: with no raw queue in the XSKMAP a
// match is counted as no_socket) is the one the Go model of the rules picks.
func TestRawRulesModel(t *testing.T) {
	requireRoot(t)
	spec, err := loadXsk()
	if err != nil {
		t.Fatal(err)
	}
	s, err := newRawMaps(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer s.release()
	p, err := s.loadProg(spec, xskProgZcXsk, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	s.prog = p
	s.writeConfig()
	rng := rand.New(rand.NewPCG(19, 2026))
	matched, checked := 0, 0
	for set := range 40 {
		for id := range MaxRawRules {
			if s.active&(1<<id) != 0 {
				if err := s.DeleteRule(id); err != nil {
					t.Fatal(err)
				}
			}
		}
		var rules []RawRule
		ids := map[int]RawRule{}
		for range 1 + rng.IntN(6) {
			x := randomRule(rng)
			id, err := s.AddRule(x)
			if err != nil {
				continue // a duplicate: refused as a conflict
			}
			rules = append(rules, x)
			ids[id] = x
		}
		for range 60 {
			f := randomFrame(rng)
			before := map[int]uint64{}
			for id := range ids {
				st, err := s.RuleStats(id)
				if err != nil {
					t.Fatal(err)
				}
				before[id] = st.NoSocket
			}
			ret, err := p.Run(&ebpf.RunOptions{Data: f})
			if err != nil {
				t.Fatalf("test run of %d bytes: %v", len(f), err)
			}
			if ret != 2 { // XDP_PASS: no raw queue is in the XSKMAP
				t.Fatalf("verdict %d", ret)
			}
			got := -1
			for id := range ids {
				st, _ := s.RuleStats(id)
				if st.NoSocket != before[id] {
					if got >= 0 {
						t.Fatalf("two rules counted one frame")
					}
					got = id
				}
			}
			want := -1
			if m, ok := modelParse(f); ok {
				for id := range MaxRawRules {
					if x, in := ids[id]; in && modelMatch(x, m) {
						want = id
						break
					}
				}
			}
			if got != want {
				t.Fatalf("set %d: frame %x: program took rule %d, model %d (rules %+v)", set, f, got, want, ids)
			}
			checked++
			if got >= 0 {
				matched++
			}
		}
		_ = rules
	}
	t.Logf("%d frames checked, %d matched a rule", checked, matched)
	if matched < checked/10 || matched == checked {
		t.Fatalf("the random frames and rules exercise too little: %d of %d matched", matched, checked)
	}
}
