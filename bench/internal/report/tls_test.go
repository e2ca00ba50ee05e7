package report

import (
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// tlsFiles is a files-tls row: one repetition per (server CPU s/GB, Gbit/s) pair.
func tlsFiles(mode string, conns int, sgbGbps ...[2]float64) Row {
	return tlsGB(harness.FilesTLS, mode, conns, sgbGbps...)
}

func tlsGB(s harness.Scenario, mode string, conns int, sgbGbps ...[2]float64) Row {
	r := Row{Variant: harness.Variant{Scenario: s, Mode: mode, Size: ServiceFrame, Conns: conns}}
	for i, p := range sgbGbps {
		rep := nanRep(i)
		rep.SrvCPUPerGB, rep.Gbps, rep.MsgsPerS, rep.SrvCPUusPerMsg = p[0], p[1], p[1]*1e9/8/float64(ServiceFrame), 1
		r.Reps = append(r.Reps, rep)
	}
	return r
}

// same repeats one pair n times.
func same(n int, sgb, gbps float64) [][2]float64 {
	var ps [][2]float64
	for range n {
		ps = append(ps, [2]float64{sgb, gbps})
	}
	return ps
}

// The rows of a run with kernel TLS: net-tls 1 s/GB at 10 Gbit/s, its A/A copy within ±2%
// (files-tls) and ±2% (https), ztls-user as net-tls; ztls as given (relay-tls: ztlsRelay s/GB
// at 10 Gbit/s).
func tlsRows(ztlsFiles [][2]float64, ztlsSmall []float64, ztlsRelay ...float64) []Row {
	var relay [][2]float64
	for _, x := range ztlsRelay {
		relay = append(relay, [2]float64{x, 10})
	}
	return []Row{
		tlsGB(harness.RelayTLS, NetTLS, TLSRelayConns, same(3, 1, 10)...),
		tlsGB(harness.RelayTLS, ZTLSUser, TLSRelayConns, same(3, 1, 10)...),
		tlsGB(harness.RelayTLS, ZTLS, TLSRelayConns, relay...),
		tlsFiles(NetTLS, 1, same(3, 1, 10)...),
		tlsFiles(NetTLSAA, 1, [2]float64{1.02, 10.2}, [2]float64{0.98, 9.8}, [2]float64{1, 10}),
		tlsFiles(ZTLSUser, 1, same(3, 1, 10)...),
		tlsFiles(ZTLS, 1, ztlsFiles...),
		tlsFiles(NetTLS, 8, same(3, 1, 10)...),
		tlsFiles(ZTLS, 8, ztlsFiles...),
		svc(harness.HTTPSWrk, NetTLS, 64, HTTPSConns, 10, 10, 10),
		svc(harness.HTTPSWrk, NetTLSAA, 64, HTTPSConns, 10.2, 9.8, 10),
		svc(harness.HTTPSWrk, ZTLSUser, 64, HTTPSConns, 13, 13, 13),
		svc(harness.HTTPSWrk, ZTLS, 64, HTTPSConns, ztlsSmall...),
		svc(harness.HTTPSWrk, NetTLS, 64<<10, HTTPSConns, 50, 50, 50),
		svc(harness.HTTPSWrk, ZTLS, 64<<10, HTTPSConns, 40, 40, 40),
	}
}

// Issue 28's goals: NOT RUN with the probe's reason where the kernel has no TLS (never
// MET), or with a skipped scenario's reason; where it has, MET or MISSED outside the TLS
// A/A noise and UNDECIDED when a check's rounds straddle its target or it lies within the
// noise. The fallback's cost is in the notes, ≈1.0 or not.
func TestTLSGoals(t *testing.T) {
	noKTLS := errors.New("not available here: kernel TLS (CONFIG_TLS not set): setsockopt TCP_ULP: ENOENT")
	byID := func(gs []Goal, id int) Goal {
		t.Helper()
		for _, g := range gs {
			if g.ID == id {
				return g
			}
		}
		t.Fatalf("no goal %d in %+v", id, gs)
		return Goal{}
	}

	// No kernel TLS: ztls did not run, net-tls and ztls-user did. NOT RUN with the reason.
	var rows []Row
	for _, r := range tlsRows(nil, nil) {
		if r.Mode != ZTLS {
			rows = append(rows, r)
		}
	}
	gs := TLSGoals(rows, nil, noKTLS)
	if len(gs) != 3 {
		t.Fatalf("goals %+v", gs)
	}
	for _, id := range []int{TLSFileGoalID, TLSSmallGoalID, TLSRelayGoalID} {
		g := byID(gs, id)
		if g.Status != StatusNotRun+" (ztls: "+noKTLS.Error()+")" {
			t.Errorf("goal %d without kernel TLS: %s", id, g.Status)
		}
	}
	// ...and the fallback's cost is still given: files as net-tls (≈1.0), https 1.3× in
	// every round, outside the ±2% noise.
	if n := byID(gs, TLSFileGoalID).Note; !strings.Contains(n, "files-tls ×1: ztls-user / net-tls server CPU 1.00× [rounds 1.00–1.00] (1 vs 1) ≈1.0") {
		t.Errorf("goal 14's note: %s", n)
	}
	if n := byID(gs, TLSSmallGoalID).Note; !strings.Contains(n, "https 64 B ×32: ztls-user / net-tls server CPU 1.30× [rounds 1.30–1.30] (13 vs 10) NOT ≈1.0 (every round on one side, outside the A/A noise ±2.0%)") {
		t.Errorf("goal 15's note: %s", n)
	}
	if n := byID(gs, TLSRelayGoalID).Note; !strings.Contains(n, "relay-tls ×8: ztls-user / net-tls server CPU 1.00×") {
		t.Errorf("goal 16's note: %s", n)
	}
	// A skipped scenario's reason wins (wrk not installed).
	gs = TLSGoals(nil, map[harness.Scenario]string{harness.HTTPSWrk: "wrk not installed"}, nil)
	if g := byID(gs, TLSSmallGoalID); g.Status != StatusNotRun+" (wrk not installed)" {
		t.Errorf("https skipped: %s", g.Status)
	}
	if g := byID(gs, TLSFileGoalID); g.Status != StatusNotRun+" (files-tls ×1 of ztls and net-tls not measured)" {
		t.Errorf("nothing measured: %s", g.Status)
	}

	for _, tc := range []struct {
		name               string
		files              [][2]float64
		small, relay       []float64
		file, small_, rlay string
	}{
		// 0.5 s/GB at 11 Gbit/s, 9 µs per request, relay 0.5×: every check met outside the noise.
		{"met", same(3, 0.5, 11), []float64{9, 9, 9}, []float64{0.5, 0.5, 0.5}, StatusMet, StatusMet, StatusMet},
		// CPU per GB 0.8×: a clear miss; 12 µs: a clear miss.
		{"missed", same(3, 0.8, 11), []float64{12, 12, 12}, []float64{0.8, 0.8, 0.8}, StatusMissed, StatusMissed, StatusMissed},
		// CPU 0.5× but the throughput's rounds straddle 1.0 (0.9–1.2); 1.01× within ±2%;
		// the relay at 0.59×, within ±2% of 0.6.
		{"undecided", [][2]float64{{0.5, 9}, {0.5, 12}, {0.5, 11}}, []float64{10.1, 10.1, 10.1}, []float64{0.59, 0.59, 0.59},
			StatusUndecided, StatusUndecided, StatusUndecided},
		// rounds straddling the target though the median meets it (small 0.9–1.1, relay 0.5–0.7).
		{"straddle", same(3, 0.5, 11), []float64{9, 11, 9}, []float64{0.5, 0.7, 0.5}, StatusMet, StatusUndecided, StatusUndecided},
	} {
		gs := TLSGoals(tlsRows(tc.files, tc.small, tc.relay...), nil, nil)
		if g := byID(gs, TLSRelayGoalID); g.Status != tc.rlay || len(g.Checks) != 1 || g.Checks[0].Unit != unitTLSSrvSGB {
			t.Errorf("%s: goal 16 %s, want %s (%+v; %s)", tc.name, g.Status, tc.rlay, g.Checks, g.Note)
		}
		if g := byID(gs, TLSFileGoalID); g.Status != tc.file || len(g.Checks) != 4 {
			t.Errorf("%s: goal 14 %s, want %s (%+v; %s)", tc.name, g.Status, tc.file, g.Checks, g.Note)
		}
		g := byID(gs, TLSSmallGoalID)
		if g.Status != tc.small_ || len(g.Checks) != 1 || g.Checks[0].Unit != unitTLSSrvUs {
			t.Errorf("%s: goal 15 %s, want %s (%+v; %s)", tc.name, g.Status, tc.small_, g.Checks, g.Note)
		}
		if !strings.Contains(g.Note, "the kernel against the fallback") || !strings.Contains(g.Note, "https 64 B ×32: ztls / ztls-user server CPU = ") {
			t.Errorf("%s: goal 15's note lacks ztls / ztls-user: %s", tc.name, g.Note)
		}
		if !strings.Contains(g.Note, "https 64 KiB: ztls / net-tls server CPU per request = 0.80×") {
			t.Errorf("%s: goal 15's note lacks the 64 KiB ratio: %s", tc.name, g.Note)
		}
	}

	// Without the A/A pair a check cannot be decided (no noise to read it against).
	var noAA []Row
	for _, r := range tlsRows(same(3, 0.5, 11), []float64{9, 9, 9}, 0.5, 0.5, 0.5) {
		if r.Mode != NetTLSAA {
			noAA = append(noAA, r)
		}
	}
	for _, g := range TLSGoals(noAA, nil, nil) {
		if g.Status != StatusUndecided || !strings.Contains(g.Note, "no A/A measure of tls") {
			t.Errorf("goal %d without the A/A pair: %s (%s)", g.ID, g.Status, g.Note)
		}
	}
}

// The TLS tables: both scenarios, ratios against net-tls, the negotiated suite and
// ztls's handshake counts.
func TestTLSTable(t *testing.T) {
	rows := tlsRows(same(3, 0.5, 11), []float64{9, 9, 9}, 0.5, 0.5, 0.5)
	for i := range rows {
		for j := range rows[i].Reps {
			rows[i].Reps[j].Server.Notes = map[string]string{"tls": "TLS 1.3 TLS_AES_128_GCM_SHA256"}
			if rows[i].Mode == ZTLS {
				rows[i].Reps[j].Server.Notes["ztls_handshakes"] = "kernel 32, user 0, refused 0"
			}
		}
	}
	var b strings.Builder
	Table(&b, rows)
	out := b.String()
	for _, s := range []string{"HTTPS UNDER WRK", "FILE STREAMING OVER TLS", "TLS-TERMINATING RELAY", "TLS 1.3 TLS_AES_128_GCM_SHA256 (ztls handshakes: kernel 32, user 0, refused 0)"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
	if err := WritePNG(filepath.Join(t.TempDir(), "tls.png"), rows, "TLS only"); err != nil {
		t.Errorf("a run of the TLS scenarios alone has its panels: %v", err)
	}
	// ztls with one client: 1.10× net-tls's Gbit/s, 0.50× its CPU per GB
	if !regexp.MustCompile(`ztls +1 +11\.00 \[11\.00–11\.00\] +1\.10 +0\.500 \[0\.500–0\.500\] +0\.50 `).MatchString(out) {
		t.Errorf("no ratios against net-tls:\n%s", out)
	}
}
