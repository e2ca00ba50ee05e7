package report

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// The TLS modes (issue 28; bench/internal/services/tls.go makes them).
const (
	NetTLS = "net-tls" // Go net + crypto/tls
	// NetTLSAA is net-tls run again as a variant of its own: the TLS scenarios' A/A pair
	// (https 64 B, files-tls with one client).
	NetTLSAA = "net-tls-aa"
	ZTLS     = "ztls"      // zc/ztls, records in the kernel, no fallback
	ZTLSUser = "ztls-user" // zc/ztls with its user-space path forced
)

// The TLS scenarios' geometry the goals judge (zcbench plans the same).
var (
	HTTPSConns    = 32
	TLSFileConns  = []int{1, 8}
	TLSRelayConns = 8
)

// Units of the TLS goals, each measured by the TLS A/A pair (net-tls-aa / net-tls).
const (
	unitTLSSrvUs  = "tls srv µs/req"
	unitTLSSrvSGB = "tls srv s/GB"
	unitTLSGbps   = "tls Gbit/s"
	unitTLSReqs   = "tls req/s"
)

// The goals of issue 28 (after issue 30's 13).
const (
	TLSFileGoalID  = 14
	TLSSmallGoalID = 15
	TLSRelayGoalID = 16
)

// tlsTable prints the TLS scenarios: server CPU per unit and throughput against net-tls,
// and the protocol and suite each server negotiated.
func tlsTable(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, sc := range harness.TLSScenarios {
		var rs []Row
		for _, r := range rows {
			if r.Scenario == sc && len(r.Reps) > 0 {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		switch sc {
		case harness.HTTPSWrk:
			fmt.Fprintln(tw, "HTTPS UNDER WRK (net/http GET over TLS, keep-alive)\tbody\tconns\treq/s median [min–max]\t×net-tls\tsrv CPU µs/req [min–max]\t×net-tls\tnegotiated (last rep)\t")
		case harness.FilesTLS:
			fmt.Fprintln(tw, "FILE STREAMING OVER TLS (page-cache file to N clients)\tclients\tGbit/s median [min–max]\t×net-tls\tsrv CPU s/GB [min–max]\t×net-tls\tnegotiated (last rep)\t")
		case harness.RelayTLS:
			fmt.Fprintln(tw, "TLS-TERMINATING RELAY (TLS clients → server → plain backend, both ways)\tconns\tGbit/s median [min–max]\t×net-tls\trelay CPU s/GB [min–max]\t×net-tls\tnegotiated (last rep)\t")
		}
		for _, r := range rs {
			base := Find(rows, r.Scenario, NetTLS, r.Size, r.Conns)
			suite := notes(r)["tls"]
			if h := notes(r)["ztls_handshakes"]; h != "" {
				suite += " (ztls handshakes: " + h + ")"
			}
			if why := notes(r)["ztls_refused"]; why != "" {
				suite += " refused: " + why
			}
			switch sc {
			case harness.HTTPSWrk:
				fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, SizeString(r.Size), r.Conns, spread(r.Sum(MsgsPerS), "%.0f"),
					ratio(r.Sum(MsgsPerS), sumOf(base, MsgsPerS)), spread(r.Sum(SrvCPUPerMsg), "%.2f"), ratio(r.Sum(SrvCPUPerMsg), sumOf(base, SrvCPUPerMsg)), suite)
			case harness.FilesTLS, harness.RelayTLS:
				fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, r.Conns, spread(r.Sum(Gbps), "%.2f"), ratio(r.Sum(Gbps), sumOf(base, Gbps)),
					spread(r.Sum(SrvCPUPerGB), "%.3f"), ratio(r.Sum(SrvCPUPerGB), sumOf(base, SrvCPUPerGB)), suite)
			}
		}
		fmt.Fprintln(tw, "\t")
	}
	tw.Flush()
}

// TLSGoals judges issue 28's goals where the kernel has TLS, read against the TLS A/A
// pair's noise like every goal (UNDECIDED when a check's rounds straddle its target or it
// lies within the noise):
//
//  14. TLS file send: ztls server CPU s/GB ≤ 0.6× net-tls's at ≥ 1.0× its Gbit/s (1 and 8 clients);
//  15. HTTPS small (64 B bodies, 32 connections): ztls server CPU per request ≤ 1.0× net-tls's;
//  16. TLS-terminating relay (8 connections): ztls relay CPU s/GB ≤ 0.6× net-tls's.
//
// kernelErr is why the ztls mode cannot run here (nil when it can): the goals are then NOT
// RUN with that reason, never MET. Each goal's note gives ztls-user / net-tls, what the
// user-space fallback costs (informational; TLSFallback).
func TLSGoals(rows []Row, skipped map[harness.Scenario]string, kernelErr error) []Goal {
	missing := func(s harness.Scenario, what string) string {
		if why, ok := skipped[s]; ok {
			return why
		}
		if kernelErr != nil {
			return "ztls: " + kernelErr.Error()
		}
		return what + " not measured"
	}
	var gs []Goal

	name := "TLS file send: ztls (kernel TLS, sendfile) server CPU s/GB ≤ 0.6× net-tls (crypto/tls) at ≥ 1.0× its Gbit/s (1 and 8 clients)"
	var checks []Check
	why := ""
	for _, n := range TLSFileConns {
		z, nt := Find(rows, harness.FilesTLS, ZTLS, ServiceFrame, n), Find(rows, harness.FilesTLS, NetTLS, ServiceFrame, n)
		if z == nil || nt == nil {
			why = missing(harness.FilesTLS, fmt.Sprintf("files-tls ×%d of ztls and net-tls", n))
			break
		}
		checks = append(checks, compare(fmt.Sprintf("×%d CPU/GB: ztls / net-tls", n), z, nt, SrvCPUPerGB, unitTLSSrvSGB, 0.6, false),
			compare(fmt.Sprintf("×%d Gbit/s: ztls / net-tls", n), z, nt, Gbps, unitTLSGbps, 1.0, true))
	}
	gs = append(gs, goalOf(TLSFileGoalID, name, checks, why))

	name = fmt.Sprintf("HTTPS small responses (64 B, %d conns, wrk): ztls server CPU per request ≤ 1.0× net-tls", HTTPSConns)
	checks, why = nil, ""
	z, nt := Find(rows, harness.HTTPSWrk, ZTLS, 64, HTTPSConns), Find(rows, harness.HTTPSWrk, NetTLS, 64, HTTPSConns)
	if z == nil || nt == nil {
		why = missing(harness.HTTPSWrk, "https 64 B of ztls and net-tls")
	} else {
		checks = append(checks, compare("64 B: ztls / net-tls", z, nt, SrvCPUPerMsg, unitTLSSrvUs, 1.0, false))
	}
	gs = append(gs, goalOf(TLSSmallGoalID, name, checks, why))

	name = fmt.Sprintf("TLS-terminating relay (%d conns): ztls relay CPU s/GB ≤ 0.6× net-tls", TLSRelayConns)
	checks, why = nil, ""
	z, nt = Find(rows, harness.RelayTLS, ZTLS, ServiceFrame, TLSRelayConns), Find(rows, harness.RelayTLS, NetTLS, ServiceFrame, TLSRelayConns)
	if z == nil || nt == nil {
		why = missing(harness.RelayTLS, fmt.Sprintf("relay-tls ×%d of ztls and net-tls", TLSRelayConns))
	} else {
		checks = append(checks, compare(fmt.Sprintf("×%d CPU/GB: ztls / net-tls", TLSRelayConns), z, nt, SrvCPUPerGB, unitTLSSrvSGB, 0.6, false))
	}
	gs = append(gs, goalOf(TLSRelayGoalID, name, checks, why))
	applyNoise(gs, rows)

	// Not judged: 64 KiB responses with the kernel, and the fallback's cost.
	var info []string
	if a, b := Find(rows, harness.HTTPSWrk, ZTLS, 64<<10, HTTPSConns), Find(rows, harness.HTTPSWrk, NetTLS, 64<<10, HTTPSConns); a != nil && b != nil {
		info = append(info, "https 64 KiB: "+ratioText("ztls / net-tls server CPU per request", a, b, SrvCPUPerMsg))
	}
	for i := range gs {
		scen := map[int]harness.Scenario{TLSFileGoalID: harness.FilesTLS, TLSSmallGoalID: harness.HTTPSWrk, TLSRelayGoalID: harness.RelayTLS}[gs[i].ID]
		var fb, ku []string
		for _, l := range TLSFallback(rows) {
			if strings.HasPrefix(l, string(scen)+" ") {
				fb = append(fb, l)
			}
		}
		for _, l := range kernelVsUser(rows) {
			if strings.HasPrefix(l, string(scen)+" ") {
				ku = append(ku, l)
			}
		}
		if len(fb) > 0 {
			gs[i].Note = strings.TrimPrefix(gs[i].Note+"; ", "; ") + "not judged, the user-space fallback against crypto/tls (should be ≈1.0×): " + strings.Join(fb, "; ")
		}
		if len(ku) > 0 {
			gs[i].Note = strings.TrimPrefix(gs[i].Note+"; ", "; ") + "not judged, the kernel against the fallback (where it loses, the issue wants user space as the shape's default): " + strings.Join(ku, "; ")
		}
		if gs[i].ID == TLSSmallGoalID && len(info) > 0 {
			gs[i].Note = strings.TrimPrefix(gs[i].Note+"; ", "; ") + "not judged: " + strings.Join(info, "; ")
		}
	}
	return gs
}

// TLSFallback compares ztls-user with net-tls in every TLS case where both ran: server
// CPU per unit and throughput, ratio of medians with its rounds, and whether the
// fallback costs about the same as crypto/tls (≈1.0×: its rounds reach 1.0, or the ratio
// lies within the TLS A/A noise of its unit) or not.
func TLSFallback(rows []Row) []string {
	var out []string
	for _, r := range rows {
		if r.Mode != ZTLSUser || len(r.Reps) == 0 {
			continue
		}
		nt := Find(rows, r.Scenario, NetTLS, r.Size, r.Conns)
		if nt == nil || len(nt.Reps) == 0 {
			continue
		}
		label := fmt.Sprintf("%s %s ×%d", r.Scenario, SizeString(r.Size), r.Conns)
		cpu, cpuUnit, rate, rateUnit := SrvCPUPerMsg, unitTLSSrvUs, MsgsPerS, unitTLSReqs
		if r.Scenario == harness.FilesTLS || r.Scenario == harness.RelayTLS {
			label = fmt.Sprintf("%s ×%d", r.Scenario, r.Conns)
			cpu, cpuUnit, rate, rateUnit = SrvCPUPerGB, unitTLSSrvSGB, Gbps, unitTLSGbps
		}
		out = append(out, label+": ztls-user / net-tls server CPU "+fallbackText(rows, &r, nt, cpu, cpuUnit)+
			"; "+rateUnit+" "+fallbackText(rows, &r, nt, rate, rateUnit))
	}
	return out
}

// kernelVsUser compares ztls (records in the kernel) with ztls-user (its user-space path)
// in every TLS case where both ran: server CPU per unit, ratio of medians with its rounds.
func kernelVsUser(rows []Row) []string {
	var out []string
	for _, r := range rows {
		if r.Mode != ZTLS || len(r.Reps) == 0 {
			continue
		}
		u := Find(rows, r.Scenario, ZTLSUser, r.Size, r.Conns)
		if u == nil || len(u.Reps) == 0 {
			continue
		}
		label, cpu, unit := fmt.Sprintf("%s %s ×%d", r.Scenario, SizeString(r.Size), r.Conns), SrvCPUPerMsg, "µs/req"
		if r.Scenario == harness.FilesTLS || r.Scenario == harness.RelayTLS {
			label, cpu, unit = fmt.Sprintf("%s ×%d", r.Scenario, r.Conns), SrvCPUPerGB, "s/GB"
		}
		ma, mb := r.Sum(cpu).Median, u.Sum(cpu).Median
		t := fmt.Sprintf("%s: ztls / ztls-user server CPU = %.2f×", label, ma/mb)
		if lo, hi, ok := roundRatios(&r, u, cpu); ok {
			t += fmt.Sprintf(" [rounds %.2f–%.2f]", lo, hi)
		}
		out = append(out, t+fmt.Sprintf(" (%s vs %s %s)", fmtNum(ma), fmtNum(mb), unit))
	}
	return out
}

// fallbackText is "X× [rounds lo–hi] (a vs b): ≈1.0" or "...: NOT ≈1.0 (...)".
func fallbackText(rows []Row, a, b *Row, f Figure, unit string) string {
	ma, mb := a.Sum(f).Median, b.Sum(f).Median
	x := ma / mb
	s := fmt.Sprintf("%.2f×", x)
	lo, hi, ok := roundRatios(a, b, f)
	if ok {
		s += fmt.Sprintf(" [rounds %.2f–%.2f]", lo, hi)
	}
	s += fmt.Sprintf(" (%s vs %s)", fmtNum(ma), fmtNum(mb))
	dev, hasNoise := AANoise(rows, unit)
	switch {
	case math.IsNaN(x):
		return s
	case ok && lo <= 1 && 1 <= hi:
		return s + " ≈1.0 (its rounds reach 1.0)"
	case hasNoise && math.Abs(x-1) <= dev:
		return s + fmt.Sprintf(" ≈1.0 (within the A/A noise ±%.1f%%)", 100*dev)
	case !hasNoise:
		return s + " NOT ≈1.0 in every round (no A/A measure of " + unit + " to read it against)"
	default:
		return s + fmt.Sprintf(" NOT ≈1.0 (every round on one side, outside the A/A noise ±%.1f%%)", 100*dev)
	}
}

// PrintTLSGoals writes the verdicts of issue 28's goals; their notes give what the
// user-space fallback costs against crypto/tls.
func PrintTLSGoals(w io.Writer, gs []Goal) {
	fmt.Fprintln(w, "GOALS (issue 28, TLS): where the kernel has TLS; ratios of medians side by side in this run, read against the TLS A/A noise (net-tls-aa / net-tls); ztls-user is zc/ztls with Options.UserSpace")
	printGoals(w, gs)
}
