package bpf

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"testing"
)

// TestXSKLayout: the generated structs match the map declarations of c/xsk.bpf.c, and the
// constants mirrored in xsk.go match c/xsk.h.
func TestXSKLayout(t *testing.T) {
	spec, err := loadXsk()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		got  int
		want uint32
	}{
		{"xsk_rule", binary.Size(xskXskRule{}), spec.Maps[xskMapXskRules].ValueSize},
		{"xsk_config", binary.Size(xskXskConfig{}), spec.Maps[xskMapXskSettings].ValueSize},
		{"xsk_rule_stats", binary.Size(xskXskRuleStats{}), spec.Maps[xskMapXskRuleCounters].ValueSize},
		{"xsk_meta", binary.Size(xskXskMeta{}), xskMetaSize},
		{"xsk_rule is 56 bytes", binary.Size(xskXskRule{}), 56},
	} {
		if uint32(c.got) != c.want {
			t.Errorf("%s: Go %d, C %d", c.name, c.got, c.want)
		}
	}
	if got := spec.Maps[xskMapXskRules].MaxEntries; got != MaxRawRules {
		t.Errorf("XSK_MAX_RULES %d, Go %d", got, MaxRawRules)
	}
	if got := spec.Maps[xskMapXskSockets].MaxEntries; got != MaxRawQueues {
		t.Errorf("XSK_MAX_QUEUES %d, Go %d", got, MaxRawQueues)
	}
	if got := spec.Maps[xskMapXskCounters].MaxEntries; got != xskCounters {
		t.Errorf("XSK_COUNTERS %d, Go %d", got, xskCounters)
	}
	h, err := os.ReadFile("c/xsk.h")
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string]uint64{}
	re := regexp.MustCompile(`(?m)^#define (XSK_[A-Z0-9_]+) \(?(0x[0-9a-f]+|[0-9]+)u?(?: << ([0-9]+))?\)?`)
	for _, m := range re.FindAllStringSubmatch(string(h), -1) {
		v, err := strconv.ParseUint(m[2], 0, 64)
		if err != nil {
			t.Fatal(err)
		}
		if m[3] != "" {
			sh, _ := strconv.Atoi(m[3])
			v <<= sh
		}
		defs[m[1]] = v
	}
	for name, v := range map[string]uint64{
		"XSK_M_DST_MAC": xskMDstMAC, "XSK_M_SRC": xskMSrc, "XSK_M_DST": xskMDst, "XSK_M_PROTO": xskMProto,
		"XSK_M_SRC_PORT": xskMSrcPort, "XSK_M_DST_PORT": xskMDstPort, "XSK_M_DSCP": xskMDSCP,
		"XSK_M_FLOW_LABEL": xskMFlowLabel, "XSK_M_VNI": xskMVNI, "XSK_M_IPV4": xskMIPv4, "XSK_M_IPV6": xskMIPv6,
		"XSK_F_META": xskFMeta, "XSK_C_SEEN": xskCSeen, "XSK_C_PASS": xskCPass, "XSK_C_REDIRECT": xskCRedirect,
		"XSK_C_NO_SOCKET": xskCNoSocket, "XSK_C_META_TS": xskCMetaTS, "XSK_C_META_HASH": xskCMetaHash,
		"XSK_META_TIMESTAMP": xskMetaTimestamp, "XSK_META_HASH": xskMetaHash, "XSK_META_MAGIC": xskMetaMagic,
	} {
		got, ok := defs[name]
		if !ok || got != v {
			t.Errorf("%s: c/xsk.h %v (found %v), Go %#x", name, got, ok, v)
		}
	}
}

// TestRawRuleEncode: what a rule becomes in the program's struct, and what is refused
// before any system call.
func TestRawRuleEncode(t *testing.T) {
	g := netip.MustParseAddr("239.1.2.3")
	k, err := RawRule{Dst: g, Proto: 17, DstPort: 5000}.encode()
	if err != nil {
		t.Fatal(err)
	}
	if k.Match != xskMDst|xskMProto|xskMDstPort|xskMIPv4 || k.Dst != g.As16() || k.DstPort != 5000 || k.Proto != 17 {
		t.Fatalf("group rule: %+v", k)
	}
	k, err = RawRule{FlowLabel: 0xabcde, MatchFlowLabel: true}.encode()
	if err != nil || k.Match != xskMFlowLabel|xskMIPv6 || k.FlowLabel != 0xabcde {
		t.Fatalf("flow label rule: %+v %v", k, err)
	}
	k, err = RawRule{DSCP: 0, MatchDSCP: true}.encode()
	if err != nil || k.Match != xskMDSCP {
		t.Fatalf("DSCP 0 rule: %+v %v", k, err)
	}
	k, err = RawRule{DstMAC: net.HardwareAddr{1, 0, 0x5e, 1, 2, 3}}.encode()
	if err != nil || k.Match != xskMDstMAC || k.DstMac != [6]uint8{1, 0, 0x5e, 1, 2, 3} {
		t.Fatalf("MAC rule: %+v %v", k, err)
	}
	if _, err := (RawRule{Dst: netip.MustParseAddr("fe80::1%eth0")}).encode(); err == nil {
		t.Fatal("an address with a zone was accepted")
	}
	var ce *RuleConflictError = &RuleConflictError{Rule: 3}
	if !errors.Is(ce, ErrInvalid) {
		t.Fatal("RuleConflictError does not match ErrInvalid")
	}
}

// TestParseRawMeta: metadata is read only when the program's magic is there.
func TestParseRawMeta(t *testing.T) {
	b := make([]byte, 40)
	if _, ok := ParseRawMeta(b); ok {
		t.Fatal("zeros parsed as metadata")
	}
	m := b[len(b)-xskMetaSize:]
	binary.NativeEndian.PutUint64(m[0:], 12345)
	binary.NativeEndian.PutUint32(m[8:], 0xfeed)
	binary.NativeEndian.PutUint32(m[12:], 7)
	binary.NativeEndian.PutUint32(m[16:], xskMetaTimestamp|xskMetaHash)
	binary.NativeEndian.PutUint32(m[20:], xskMetaMagic)
	got, ok := ParseRawMeta(b)
	if !ok || got != (RawMeta{Timestamp: 12345, Hash: 0xfeed, HashType: 7, HasTimestamp: true, HasHash: true}) {
		t.Fatalf("%+v %v", got, ok)
	}
	if _, ok := ParseRawMeta(b[:10]); ok {
		t.Fatal("short headroom parsed")
	}
}

// FuzzParseRawMeta: any headroom bytes parse without panicking, and only bytes carrying the
// program's magic give metadata.
func FuzzParseRawMeta(f *testing.F) {
	f.Add(make([]byte, 24))
	f.Add([]byte{1, 2, 3})
	good := make([]byte, 30)
	binary.NativeEndian.PutUint32(good[len(good)-4:], xskMetaMagic)
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, ok := ParseRawMeta(b)
		if ok && (len(b) < xskMetaSize || binary.NativeEndian.Uint32(b[len(b)-4:]) != xskMetaMagic) {
			t.Fatalf("metadata parsed from %x", b)
		}
	})
}
