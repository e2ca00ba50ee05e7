package hwq

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/zcnet/zcnet/internal/errs"
)

// requireRefusal fails unless err is an *OpError refusing with ErrNotSupported and naming
// the feature what.
func requireRefusal(t *testing.T, err error, what string) {
	t.Helper()
	var oe *OpError
	if !errors.As(err, &oe) {
		t.Fatalf("want *OpError refusing %q, got %T %v", what, err, err)
	}
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("want ErrNotSupported for %q, got %v", what, err)
	}
	if !namesFeature(err, what) {
		t.Fatalf("refusal %v does not name %q", err, what)
	}
}

// namesFeature reports whether some *errs.NotSupportedError in err's tree is about what.
func namesFeature(err error, what string) bool {
	var nse *errs.NotSupportedError
	if errors.As(err, &nse) && nse.What == what {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if namesFeature(e, what) {
				return true
			}
		}
	case interface{ Unwrap() error }:
		return namesFeature(u.Unwrap(), what)
	}
	return false
}

var testFlow = Flow{
	Local:  netip.MustParseAddrPort("10.99.0.1:9000"),
	Remote: netip.MustParseAddrPort("10.99.0.2:40000"),
}

// TestVethRefusals: veth has no ring parameters (so no header split), no ntuple filters
// and no RSS table; each request is refused with the typed reason naming the feature.
func TestVethRefusals(t *testing.T) {
	e := newVeth(t, 4)
	_, err := e.c.Rings(e.a)
	requireRefusal(t, err, featRings)
	on := DataSplitEnabled
	requireRefusal(t, e.c.SetRings(e.a, RingsUpdate{TCPDataSplit: &on}), featHeaderSplit)
	zero := uint32(0)
	requireRefusal(t, e.c.SetRings(e.a, RingsUpdate{HDSThresh: &zero}), featHDSThresh)
	_, err = e.c.AddFlowRule(e.a, FlowRule{Flow: testFlow, Queue: 3})
	requireRefusal(t, err, featNtuple)
	_, err = e.c.FlowRules(e.a)
	requireRefusal(t, err, featNtuple)
	requireRefusal(t, e.c.DeleteFlowRule(e.a, 0), featNtuple)
	_, _, err = e.c.RuleFor(e.a, testFlow)
	requireRefusal(t, err, featNtuple)
	_, err = e.c.RSS(e.a, 0)
	requireRefusal(t, err, featRSS)
	requireRefusal(t, e.c.SetRSSIndir(e.a, 0, EqualIndir(128, []uint32{0, 1, 2})), featRSS)
	_, err = e.c.CreateRSSContext(e.a, EqualIndir(128, []uint32{3}))
	requireRefusal(t, err, featRSSContext)
	requireRefusal(t, e.c.DeleteRSSContext(e.a, 1), featRSSContext)
	err = e.c.SetFeatures(e.a, map[string]bool{FeatureNtuple: true})
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), FeatureNtuple) {
		t.Fatalf("turning on %s: %v", FeatureNtuple, err)
	}
	// Arguments rejected before any system call.
	bad := DataSplit(7)
	var ve *ValueError
	if err := e.c.SetRings(e.a, RingsUpdate{TCPDataSplit: &bad}); !errors.As(err, &ve) {
		t.Fatalf("tcp-data-split 7: %v", err)
	}
	if _, err := e.c.AddFlowRule(e.a, FlowRule{}); !errors.As(err, &ve) {
		t.Fatalf("match-everything rule: %v", err)
	}
	if err := e.c.DeleteRSSContext(e.a, 0); !errors.As(err, &ve) {
		t.Fatalf("delete context 0: %v", err)
	}
}

// deviceState is everything Bind could change, read back for comparison.
type deviceState struct {
	channels Channels
	active   []string
	rx, tx   int
	napis    int
}

func readState(t *testing.T, e *vethEnv, name string) deviceState {
	t.Helper()
	var s deviceState
	var err error
	if s.channels, err = e.c.Channels(name); err != nil {
		t.Fatal(err)
	}
	f, err := e.c.Features(name)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range f.Active {
		if v {
			s.active = append(s.active, k)
		}
	}
	slices.Sort(s.active)
	idx := mustIfindex(t, e.c, name)
	qs, err := e.c.Queues(idx)
	if err != nil {
		t.Fatal(err)
	}
	s.rx, s.tx = queuesByType(t, qs, idx)
	n, err := e.c.NAPIs(idx)
	if err != nil {
		t.Fatal(err)
	}
	s.napis = len(n)
	return s
}

func sameState(a, b deviceState) bool {
	return a.channels == b.channels && slices.Equal(a.active, b.active) && a.rx == b.rx && a.tx == b.tx && a.napis == b.napis
}

// TestBindRefusesOnVeth: Bind checks every requirement before changing anything; on veth
// it refuses naming header split, ntuple filters and the RSS table, and the device is
// exactly as before.
func TestBindRefusesOnVeth(t *testing.T) {
	e := newVeth(t, 4)
	// GRO on, so the comparison covers NAPIs too.
	if err := e.c.SetFeatures(e.a, map[string]bool{FeatureGRO: true}); err != nil {
		t.Fatal(err)
	}
	before := readState(t, e, e.a)
	b, err := e.c.Bind(e.a, testFlow, BindOptions{Queue: -1})
	if b != nil {
		b.Close()
		t.Fatal("Bind on veth succeeded")
	}
	var oe *OpError
	if !errors.As(err, &oe) || oe.Op != "bind" || oe.Iface != e.a {
		t.Fatalf("bind: %v", err)
	}
	for _, what := range []string{featHeaderSplit, featNtuple, featRSS} {
		if !namesFeature(err, what) {
			t.Errorf("refusal does not name %q: %v", what, err)
		}
	}
	if namesFeature(err, "a second RX queue") {
		t.Errorf("4-queue veth refused for its queue count: %v", err)
	}
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("not ErrNotSupported: %v", err)
	}
	if after := readState(t, e, e.a); !sameState(before, after) {
		t.Fatalf("refused Bind changed the device:\nbefore %+v\nafter  %+v", before, after)
	}
	// One queue: the queue count is named too.
	e1 := newVeth(t, 1)
	_, err = e1.c.Bind(e1.a, testFlow, BindOptions{Queue: -1})
	if !namesFeature(err, "a second RX queue") || !errors.Is(err, ErrNotSupported) {
		t.Fatalf("1-queue veth: %v", err)
	}
	// Bad flows and queues fail before any probing.
	var ve *ValueError
	if _, err := e.c.Bind(e.a, Flow{}, BindOptions{Queue: -1}); !errors.As(err, &ve) {
		t.Fatalf("empty flow: %v", err)
	}
	mixed := Flow{Local: netip.MustParseAddrPort("10.0.0.1:1"), Remote: netip.MustParseAddrPort("[fd00::1]:2")}
	if _, err := e.c.Bind(e.a, mixed, BindOptions{Queue: -1}); !errors.As(err, &ve) {
		t.Fatalf("mixed families: %v", err)
	}
	if _, err := e.c.Bind("nosuchdev0", testFlow, BindOptions{Queue: -1}); err == nil || errors.Is(err, ErrNotSupported) {
		t.Fatalf("missing device: %v", err)
	}
}
