package report

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// The C reference servers (bench/internal/cref), as their modes are named.
const (
	CUring = "c-uring"
	CEpoll = "c-epoll"
)

// unitSrvMsg is the server's CPU per request of the echo scenarios, the unit of the
// goal against the limit; the echo A/A pair (zc-copy-aa / zc-copy) measures its noise.
const unitSrvMsg = "srv CPU µs/msg"

// LimitTarget is issue 30's goal: zc's server CPU per request at most this many times a
// C io_uring server's.
const LimitTarget = 1.05

// NetTarget is issue 29's echo goal beside it: zc's server CPU per request at most this many
// times Go net's, echo 64 B.
const NetTarget = 0.85

// LimitGoalID numbers the goal against the limit after issue 10's (1–6) and issue 20's
// (7–12).
const LimitGoalID = 13

// limitCases are the variants the goal judges: echo 64 B and 1 KiB over 64 connections
// (one server CPU), the multi-core echo where the machine runs it, and the services'
// multi-queue echo (two server threads on CPUs shared with the load).
func limitCases(rows []Row) []harness.Variant {
	vs := []harness.Variant{
		{Scenario: harness.Echo, Size: 64, Conns: 64},
		{Scenario: harness.Echo, Size: 1 << 10, Conns: 64},
	}
	for _, r := range rows {
		if (r.Scenario == harness.MultiCore || r.Scenario == harness.MultiQueue) && r.Mode == CUring && len(r.Reps) > 0 {
			vs = append(vs, harness.Variant{Scenario: r.Scenario, Size: r.Size, Conns: r.Conns})
		}
	}
	return vs
}

func limitLabel(v harness.Variant) string {
	switch v.Scenario {
	case harness.MultiCore:
		return fmt.Sprintf("multicore ×%d", v.Conns)
	case harness.MultiQueue:
		return fmt.Sprintf("mq ×%d (shared CPUs)", v.Conns)
	}
	return fmt.Sprintf("echo %s ×%d", SizeString(v.Size), v.Conns)
}

// LimitGoals judges issue 30's goal against the limit: in every echo case where both ran,
// zc's server CPU per request ≤ 1.05× c-uring's (ratio of medians, its rounds, read against
// the echo A/A pair's noise in that figure as every goal is: UNDECIDED when its rounds
// straddle the target or it lies within the noise). The note gives zc / c-epoll, net /
// c-uring and c-epoll / c-uring the same way (not judged). Without c-uring or zc figures
// the goal is NOT RUN, never MET.
func LimitGoals(rows []Row, skipped map[harness.Scenario]string) []Goal {
	name := fmt.Sprintf("against the limit: zc's server CPU per request ≤ %.2f× a C io_uring server's (c-uring), echo; and ≤ %.2f× Go net's at 64 B (issue 29)", LimitTarget, NetTarget)
	var checks []Check
	var info []string
	for _, v := range limitCases(rows) {
		cu := Find(rows, v.Scenario, CUring, v.Size, v.Conns)
		if cu == nil {
			continue
		}
		label := limitLabel(v)
		if z := Find(rows, v.Scenario, ZC, v.Size, v.Conns); z != nil {
			c := compare(label+": zc / c-uring server CPU per request", z, cu, SrvCPUPerMsg, unitSrvMsg, LimitTarget, false)
			c.Target = fmt.Sprintf("≤ %.2f", LimitTarget) // compare's %.2g would print 1.1
			checks = append(checks, c)
			if nt := Find(rows, v.Scenario, "net", v.Size, v.Conns); nt != nil && v.Scenario == harness.Echo && v.Size == 64 {
				checks = append(checks, compare(label+": zc / net server CPU per request", z, nt, SrvCPUPerMsg, unitSrvMsg, NetTarget, false))
			}
		}
		for _, p := range [][2]string{{ZC, CEpoll}, {"net", CUring}, {CEpoll, CUring}} {
			a, b := Find(rows, v.Scenario, p[0], v.Size, v.Conns), Find(rows, v.Scenario, p[1], v.Size, v.Conns)
			if a != nil && b != nil {
				info = append(info, label+": "+ratioText(p[0]+" / "+p[1], a, b, SrvCPUPerMsg))
			}
		}
	}
	if len(checks) == 0 {
		why := "echo of zc and c-uring not measured"
		if w, ok := skipped[harness.Echo]; ok {
			why = w
		} else if !hasMode(rows, CUring) {
			why = "c-uring not measured (the notes at the top say why when it is not available)"
		}
		return []Goal{notRun(LimitGoalID, name, why)}
	}
	g := verdict(LimitGoalID, name, checks, "")
	gs := []Goal{g}
	applyNoise(gs, rows)
	if len(info) > 0 {
		gs[0].Note = strings.TrimPrefix(gs[0].Note+"; ", "; ") + "server CPU per request, not judged: " + strings.Join(info, ", ")
	}
	return gs
}

// ratioText is "what = X× [rounds lo–hi] (a vs b)" for f(a)/f(b), ratio of medians.
func ratioText(what string, a, b *Row, f Figure) string {
	ma, mb := a.Sum(f).Median, b.Sum(f).Median
	s := fmt.Sprintf("%s = %.2f×", what, ma/mb)
	if lo, hi, ok := roundRatios(a, b, f); ok {
		s += fmt.Sprintf(" [rounds %.2f–%.2f]", lo, hi)
	}
	if !math.IsNaN(ma) && !math.IsNaN(mb) {
		s += fmt.Sprintf(" (%s vs %s µs)", fmtNum(ma), fmtNum(mb))
	}
	return s
}

func hasMode(rows []Row, mode string) bool {
	for _, r := range rows {
		if r.Mode == mode && len(r.Reps) > 0 {
			return true
		}
	}
	return false
}

// PrintLimitGoals writes the verdict against the limit.
func PrintLimitGoals(w io.Writer, gs []Goal) {
	fmt.Fprintln(w, "GOAL (issue 30, against the limit): server CPU per request (the server process's own CPU over its measured window / requests the client verified), ratios of medians side by side in this run")
	printGoals(w, gs)
}
