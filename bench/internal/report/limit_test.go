package report

import (
	"strings"
	"testing"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// echoSrv is an echo row ×64 with one repetition per server CPU per request (µs); the
// rate is the same in every round.
func echoSrv(mode string, size int, srv ...float64) Row {
	r := Row{Variant: harness.Variant{Scenario: harness.Echo, Mode: mode, Size: size, Conns: 64}}
	for i, us := range srv {
		rep := nanRep(i)
		rep.MsgsPerS, rep.P50us, rep.P99us, rep.P999us, rep.CPUusPerMsg, rep.SrvCPUusPerMsg = 1e5, 50, 100, 200, 2*us, us
		r.Reps = append(r.Reps, rep)
	}
	return r
}

// The goal against the limit (issue 30): zc's server CPU per request against c-uring's,
// judged by the report's rules: NOT RUN without figures, MET or MISSED outside the noise,
// UNDECIDED when the rounds straddle 1.05 or the ratio lies in the echo A/A pair's noise.
func TestLimitGoal(t *testing.T) {
	base := func(zc64, zc1k []float64) []Row {
		return []Row{
			echoSrv("net", 64, 14, 14, 14), echoSrv(CUring, 64, 10, 10, 10), echoSrv(CEpoll, 64, 11, 11, 11),
			echoSrv(ZC, 64, zc64...), echoSrv(ZCCopy, 64, 12, 12, 12), echoSrv(ZCCopyAA, 64, 12.12, 11.88, 12),
			echoSrv("net", 1024, 15, 15, 15), echoSrv(CUring, 1024, 10, 10, 10), echoSrv(ZC, 1024, zc1k...),
		}
	}
	one := func(rows []Row) Goal {
		t.Helper()
		gs := LimitGoals(rows, nil)
		if len(gs) != 1 || gs[0].ID != LimitGoalID {
			t.Fatalf("goals %+v", gs)
		}
		return gs[0]
	}

	// Without c-uring: NOT RUN, never MET.
	rows := base([]float64{10, 10, 10}, []float64{10, 10, 10})
	var noC []Row
	for _, r := range rows {
		if r.Mode != CUring {
			noC = append(noC, r)
		}
	}
	if g := one(noC); !strings.HasPrefix(g.Status, StatusNotRun+" (c-uring not measured") {
		t.Errorf("without c-uring: %s", g.Status)
	}
	if g := LimitGoals(nil, map[harness.Scenario]string{harness.Echo: "not asked for"})[0]; g.Status != StatusNotRun+" (not asked for)" {
		t.Errorf("echo skipped: %s", g.Status)
	}

	// At the limit in every round, far outside the ±1% A/A noise: MET.
	g := one(rows)
	if g.Status != StatusMet || len(g.Checks) != 3 || *g.Checks[0].Ratio != 1 || g.Checks[0].Unit != unitSrvMsg {
		t.Errorf("at the limit: %s %+v", g.Status, g.Checks)
	}
	if n := g.Checks[0].Noise; n == nil || *n < 0.0099 || *n > 0.0101 {
		t.Errorf("noise %v, want the echo A/A pair's 1%% in server CPU", n)
	}
	for _, s := range []string{"zc / c-epoll = 0.91×", "net / c-uring = 1.40× [rounds 1.40–1.40]", "c-epoll / c-uring = 1.10×"} {
		if !strings.Contains(g.Note, s) {
			t.Errorf("note lacks %q: %s", s, g.Note)
		}
	}

	// Issue 29's check beside it: zc / net at 64 B (10 vs 14: 0.71×, within 0.85).
	if c := g.Checks[1]; c.What != "echo 64 B ×64: zc / net server CPU per request" || *c.Ratio > 0.72 || *c.Ratio < 0.71 {
		t.Errorf("zc / net check: %+v", c)
	}
	// At the limit of c-uring but 0.91× Go net in every round: MISSED by issue 29's check.
	slowNet := base([]float64{10, 10, 10}, []float64{10, 10, 10})
	slowNet[0] = echoSrv("net", 64, 11, 11, 11)
	if g := one(slowNet); g.Status != StatusMissed || g.Checks[1].Met {
		t.Errorf("0.91× net: %s %+v", g.Status, g.Checks[1])
	}

	// 1.3× in every round at 64 B: MISSED, whatever 1 KiB says.
	if g := one(base([]float64{13, 13, 13}, []float64{10, 10, 10})); g.Status != StatusMissed {
		t.Errorf("1.3×: %s", g.Status)
	}

	// Median 1.04× but the rounds 0.95–1.15 straddle 1.05: UNDECIDED, and it says why.
	g = one(base([]float64{9.5, 10.4, 11.5}, []float64{10, 10, 10}))
	if g.Status != StatusUndecided || !g.Checks[0].InNoise || !strings.Contains(g.Note, "rounds 0.95–1.15 straddle the target") {
		t.Errorf("straddling: %s %q", g.Status, g.Note)
	}

	// 1.055× in every round: missed by less than the A/A noise (1%): UNDECIDED.
	g = one(base([]float64{10.55, 10.55, 10.55}, []float64{10, 10, 10}))
	if g.Status != StatusUndecided || !strings.Contains(g.Note, "within ±1.0%") {
		t.Errorf("within the noise: %s %q", g.Status, g.Note)
	}

	var sb strings.Builder
	PrintLimitGoals(&sb, []Goal{one(base([]float64{13, 13, 13}, []float64{10, 10, 10}))})
	Table(&sb, rows)
	PrintNoise(&sb, rows)
	out := sb.String()
	for _, s := range []string{"GOAL (issue 30, against the limit)", "13. against the limit", ": MISSED",
		"echo 64 B ×64: zc / c-uring server CPU per request = 1.300× [rounds 1.30–1.30] (13 vs 10 srv CPU µs/msg), want ≤ 1.05: missed",
		"srv CPU ×c-uring", "echo 64 B: zc-copy-aa / zc-copy, srv CPU µs/msg", "srv CPU µs/msg ±1.0%"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}

// The multi-core and multi-queue echoes join the goal when c-uring ran them.
func TestLimitGoalMultiQueue(t *testing.T) {
	mq := func(mode string, srv float64) Row {
		r := echoSrv(mode, 64, srv, srv, srv)
		r.Scenario, r.Conns = harness.MultiQueue, MQConns
		return r
	}
	gs := LimitGoals([]Row{mq(CUring, 8), mq(ZC, 12), mq(CEpoll, 9)}, nil)
	if len(gs[0].Checks) != 1 || gs[0].Checks[0].What != "mq ×512 (shared CPUs): zc / c-uring server CPU per request" ||
		*gs[0].Checks[0].Ratio != 1.5 || !strings.Contains(gs[0].Note, "mq ×512 (shared CPUs): zc / c-epoll = 1.33×") {
		t.Errorf("mq: %+v %q", gs[0].Checks, gs[0].Note)
	}
}
