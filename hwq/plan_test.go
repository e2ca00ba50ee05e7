package hwq

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"unsafe"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
)

func genetlinkMsg(b []byte) genetlink.Message { return genetlink.Message{Data: b} }

// TestPlanRollback: steps are undone last first; a failing undo does not stop the others
// and is reported; a failing apply records nothing; rollback twice undoes once.
func TestPlanRollback(t *testing.T) {
	var p plan
	var log []string
	step := func(name string, applyErr, undoErr error) error {
		return p.apply(name, "old", "new",
			func() error { log = append(log, "do "+name); return applyErr },
			func() error { log = append(log, "undo "+name); return undoErr })
	}
	if err := step("a", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := step("b", nil, errors.New("b stuck")); err != nil {
		t.Fatal(err)
	}
	if err := step("c", nil, nil); err != nil {
		t.Fatal(err)
	}
	err := step("d", errors.New("d refused"), nil)
	if err == nil || !strings.Contains(err.Error(), "d (old -> new): d refused") {
		t.Fatalf("apply error %v", err)
	}
	if len(p.steps) != 3 {
		t.Fatalf("%d steps recorded, want 3 (the failed one is not)", len(p.steps))
	}
	rerr := p.rollback()
	if rerr == nil || !strings.Contains(rerr.Error(), "undo b (back to old): b stuck") {
		t.Fatalf("rollback error %v", rerr)
	}
	want := "do a,do b,do c,do d,undo c,undo b,undo a"
	if got := strings.Join(log, ","); got != want {
		t.Fatalf("order %s, want %s", got, want)
	}
	if err := p.rollback(); err != nil || len(log) != 7 {
		t.Fatalf("second rollback: %v, log %v", err, log)
	}
}

// TestBindingClose: Close undoes the recorded steps once, is idempotent and nil-safe, and
// Steps reports what was changed.
func TestBindingClose(t *testing.T) {
	undone := 0
	b := &Binding{Ifname: "x"}
	b.plan.apply("header split", "tcp-data-split off", "tcp-data-split on", func() error { return nil },
		func() error { undone++; return nil })
	b.steps = b.plan.steps
	if s := b.Steps(); len(s) != 1 || s[0].String() != "header split: tcp-data-split off -> tcp-data-split on" {
		t.Fatalf("steps %v", s)
	}
	if err := b.Close(); err != nil || undone != 1 {
		t.Fatalf("close: %v, undone %d", err, undone)
	}
	if err := b.Close(); err != nil || undone != 1 {
		t.Fatalf("second close: %v, undone %d", err, undone)
	}
	var nb *Binding
	if err := nb.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestRuleEncoding(t *testing.T) {
	for _, r := range []FlowRule{
		{Flow: testFlow, Queue: 3},
		{Flow: Flow{Local: netip.MustParseAddrPort("[fd00::1]:443"), Remote: netip.MustParseAddrPort("[fd00::2]:5555")}, Queue: 1, RSSContext: 2},
		{Flow: Flow{Local: netip.AddrPortFrom(netip.Addr{}, 9000)}, Queue: 7},
		{Flow: Flow{Local: netip.AddrPortFrom(netip.Addr{}, 9000)}, IPv6: true, Queue: 7},
		{Flow: Flow{Remote: netip.MustParseAddrPort("[::ffff:10.1.2.3]:80")}, Queue: 0},
	} {
		fs, err := encodeRule(r)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		var nfc ethtoolRxnfc
		nfc.FS = fs
		nfc.FS.Location = 5
		nfc.RuleCnt = r.RSSContext
		got := decodeRule(&nfc)
		want := r
		want.Location = 5
		want.Flow.Remote = netip.AddrPortFrom(r.Flow.Remote.Addr().Unmap(), r.Flow.Remote.Port())
		if is6, _ := r.Flow.is6(); is6 {
			want.IPv6 = true
		}
		if got != want {
			t.Errorf("round trip %+v -> %+v", want, got)
		}
	}
	// The NIC matches the peer as source and this host as destination (tcp_ip4_spec).
	fs, _ := encodeRule(FlowRule{Flow: testFlow})
	if fs.FlowType != tcpV4Flow || fs.H[0] != 10 || fs.H[3] != 2 || fs.H[7] != 1 || fs.H[10] != 0x23 || fs.H[11] != 0x28 {
		t.Fatalf("ip4 spec bytes % x", fs.H[:12])
	}
	if _, err := encodeRule(FlowRule{}); err == nil {
		t.Fatal("empty rule accepted")
	}
}

func TestFreeSlot(t *testing.T) {
	if loc, err := freeSlot(4, []uint32{3, 1}); err != nil || loc != 2 {
		t.Fatalf("got %d, %v", loc, err)
	}
	if _, err := freeSlot(2, []uint32{0, 1}); err == nil {
		t.Fatal("full table")
	}
	if _, err := freeSlot(0, nil); err == nil {
		t.Fatal("empty table")
	}
}

func TestIndirHelpers(t *testing.T) {
	if got := EqualIndir(6, []uint32{0, 2}); len(got) != 6 || got[1] != 2 || got[4] != 0 {
		t.Fatalf("EqualIndir %v", got)
	}
	if got := (RSS{Indir: []uint32{3, 1, 3, 0}}).Queues(); len(got) != 3 || got[0] != 0 || got[2] != 3 {
		t.Fatalf("Queues %v", got)
	}
	if DefaultIndir(4, 0) != nil || EqualIndir(4, nil) != nil {
		t.Fatal("empty")
	}
}

func TestBitsets(t *testing.T) {
	ae := netlink.NewAttributeEncoder()
	ae.Nested(ethtoolABitsetBits, func(bs *netlink.AttributeEncoder) error {
		for _, b := range []struct {
			name string
			on   bool
		}{{"rx-gro", true}, {"rx-ntuple-filter", false}, {"highdma", true}} {
			bs.Nested(ethtoolABitsetBitsBit, func(bit *netlink.AttributeEncoder) error {
				bit.Uint32(ethtoolABitsetBitIndex, 1)
				bit.String(ethtoolABitsetBitName, b.name)
				if b.on {
					bit.Flag(ethtoolABitsetBitValue, true)
				}
				return nil
			})
		}
		return nil
	})
	b, _ := ae.Encode()
	ad, _ := netlink.NewAttributeDecoder(b)
	m, err := parseNamedBitset(ad)
	if err != nil || !m["rx-gro"] || !m["highdma"] || m["rx-ntuple-filter"] {
		t.Fatalf("%v %v", m, err)
	}
	ae = netlink.NewAttributeEncoder()
	ae.Flag(ethtoolABitsetNomask, true)
	ae.Uint32(ethtoolABitsetSize, 40)
	ae.Bytes(ethtoolABitsetValue, []byte{0x1a, 0, 0, 0, 0x01, 0, 0, 0})
	b, _ = ae.Encode()
	ad, _ = netlink.NewAttributeDecoder(b)
	v, err := parseCompactBitset(ad)
	if err != nil || v != 0x1_0000_001a {
		t.Fatalf("compact %#x %v", v, err)
	}
}

// FuzzParsers feeds arbitrary bytes to every parser of kernel replies: none may panic.
func FuzzParsers(f *testing.F) {
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(netdevAQueueID, 1)
	ae.Uint32(netdevAQueueType, 1)
	ae.Uint64(netdevANapiGROFlushTimeout, 5)
	seed, _ := ae.Encode()
	f.Add(seed)
	f.Add([]byte{4, 0, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		parseDevice(b)
		parseNAPI(b)
		parseQueue(genetlinkMsg(b))
		if ad, err := netlink.NewAttributeDecoder(b); err == nil {
			parseNamedBitset(ad)
		}
		if ad, err := netlink.NewAttributeDecoder(b); err == nil {
			parseCompactBitset(ad)
		}
		var nfc ethtoolRxnfc
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&nfc)), unsafe.Sizeof(nfc)), b)
		decodeRule(&nfc)
	})
}
