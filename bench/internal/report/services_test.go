package report

import (
	"strings"
	"testing"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// kvMix is the key-value mix's Case.Size (services.KVMixMax).
const kvMix = 100 << 10

// svc is a services row with one repetition per server CPU µs/unit figure (round =
// position); its throughput and CPU per GB follow from it.
func svc(s harness.Scenario, mode string, size, conns int, srvUs ...float64) Row {
	r := Row{Variant: harness.Variant{Scenario: s, Mode: mode, Size: size, Conns: conns}}
	for i, u := range srvUs {
		rep := nanRep(i)
		rep.SrvCPUusPerMsg, rep.MsgsPerS, rep.SrvCPUPerGB, rep.Gbps = u, 1e6/u, u/10, 10/u
		r.Reps = append(r.Reps, rep)
	}
	return r
}

// Nothing measured: every services goal is NOT RUN, with the reason a skipped scenario
// gives (wrk not installed).
func TestServiceGoalsNotRun(t *testing.T) {
	gs := ServiceGoals(nil, map[harness.Scenario]string{harness.HTTPWrk: "wrk not installed"})
	if len(gs) != 6 || gs[0].ID != 7 || gs[5].ID != 12 {
		t.Fatalf("goals %+v", gs)
	}
	for _, g := range gs {
		if !strings.HasPrefix(g.Status, StatusNotRun) {
			t.Errorf("goal %d: %s", g.ID, g.Status)
		}
	}
	if g := goalByID(t, gs, 12); !strings.Contains(g.Status, "wrk not installed") {
		t.Errorf("goal 12: %s", g.Status)
	}
	if g := goalByID(t, gs, 10); !strings.Contains(g.Status, "key-value 16–64 B of zc and net not measured") {
		t.Errorf("goal 10: %s", g.Status)
	}
}

// Key-value judged against the net-aa pair's noise: a clear miss is MISSED, a clear
// win MET, one within the noise UNDECIDED; relay needs the half-close runs too, and a
// variant that lost a repetition fails "every repetition completed".
func TestServiceGoalsJudged(t *testing.T) {
	base := []Row{
		svc(harness.KV, "net", 64, KVConns, 1, 1, 1),
		svc(harness.KV, NetAA, 64, KVConns, 1.02, 0.98, 1), // noise ±2%
		svc(harness.Relay, "net", ServiceFrame, 8, 1, 1, 1),
		svc(harness.Relay, NetAA, ServiceFrame, 8, 1, 1, 1),
		svc(harness.Relay, "zc", ServiceFrame, 8, 0.5, 0.5, 0.5),
		svc(harness.Relay, "net", ServiceFrame, 64, 1, 1, 1),
		svc(harness.Relay, "zc", ServiceFrame, 64, 0.5, 0.5, 0.5),
		svc(harness.RelayHalfClose, "net", ServiceFrame, 8, 1, 1, 1),
	}
	for _, tc := range []struct {
		zcSmall, zcMix float64
		want           string
	}{{2, 2, StatusMissed}, {0.5, 0.5, StatusMet}, {0.5, 0.79, StatusUndecided}, {0.5, 0.85, StatusMissed}, {0.69, 0.5, StatusUndecided}} {
		rows := append(append([]Row(nil), base...),
			svc(harness.KV, "zc", 64, KVConns, tc.zcSmall, tc.zcSmall, tc.zcSmall),
			svc(harness.KV, ZCStraight, 64, KVConns, tc.zcSmall, tc.zcSmall, tc.zcSmall),
			svc(harness.KV, "net", kvMix, KVConns, 1, 1, 1),
			svc(harness.KV, "zc", kvMix, KVConns, tc.zcMix, tc.zcMix, tc.zcMix),
			svc(harness.KV, ZCStraight, kvMix, KVConns, tc.zcMix, tc.zcMix, tc.zcMix))
		if g := goalByID(t, ServiceGoals(rows, nil), 10); g.Status != tc.want {
			t.Errorf("kv zc %v/%v: %s, want %s (%+v)", tc.zcSmall, tc.zcMix, g.Status, tc.want, g.Checks)
		}
	}
	// relay: CPU per GB 0.5× and Gbit/s 2× net at both counts; the half-close run of zc
	// is missing (not measured) and then short of a repetition.
	if g := goalByID(t, ServiceGoals(base, nil), 7); !strings.Contains(g.Status, "relay-hc of zc not measured") {
		t.Errorf("relay without zc's half-close runs: %s", g.Status)
	}
	rows := append(base, svc(harness.RelayHalfClose, "zc", ServiceFrame, 8, 0.5, 0.5))
	g := goalByID(t, ServiceGoals(rows, nil), 7)
	if g.Status != StatusMissed || !strings.Contains(fmtCheck(g.Checks[len(g.Checks)-1]), "2 of 3 repetitions completed") {
		t.Errorf("relay with a lost half-close repetition: %s %+v", g.Status, g.Checks)
	}
	rows = append(base, svc(harness.RelayHalfClose, "zc", ServiceFrame, 8, 0.5, 0.5, 0.5))
	if g := goalByID(t, ServiceGoals(rows, nil), 7); g.Status != StatusMet {
		t.Errorf("relay: %s %+v", g.Status, g.Checks)
	}
}

// The services get panels of their own in the PNG (the goals' measures: server CPU per GB,
// throughput, server CPU per unit), each with the cases measured and no others.
func TestServicePanels(t *testing.T) {
	rows := []Row{
		svc(harness.Relay, "net", ServiceFrame, 8, 2, 3), svc(harness.Relay, ZC, ServiceFrame, 8, 1, 2),
		svc(harness.FileStream, "net", ServiceFrame, 32, 4), svc(harness.FileStream, ZC, ServiceFrame, 32, 3),
		svc(harness.KV, "net", 64, KVConns, 0.5, 0.6), svc(harness.KV, ZC, kvMix, KVConns, 0.4),
		svc(harness.MultiQueue, Netpoll, 64, MQConns, 3), svc(harness.HTTPWrk, ZCNet, 64<<10, 512, 20),
	}
	ps, err := panels(rows, newStyle(rows))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"Services: server CPU per GB (goals 7, 9)":                       {"relay ×8", "files ×32"},
		"Services: relay and file throughput (goals 7, 9)":               {"relay ×8", "files ×32"},
		"Services: key-value and multi-queue, server CPU (goals 10, 11)": {"kv 16–64 B", "kv mix", "mq ×512"},
		"Services: HTTP under wrk, server CPU per request (goal 12)":     {"64 KiB ×512"},
	}
	for _, p := range ps {
		names, ok := want[p.Title.Text]
		if !ok {
			continue
		}
		delete(want, p.Title.Text)
		var got []string
		for _, tk := range p.X.Tick.Marker.Ticks(p.X.Min, p.X.Max) {
			if tk.Label != "" {
				got = append(got, tk.Label)
			}
		}
		if strings.Join(got, ",") != strings.Join(names, ",") {
			t.Errorf("%s: categories %q, want %q", p.Title.Text, got, names)
		}
	}
	for title := range want {
		t.Errorf("no panel %q", title)
	}
}
