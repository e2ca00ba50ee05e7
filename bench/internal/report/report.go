// Package report turns zcbench's repetitions into results: medians with min–max, the
// table with ratios against net, the goal verdicts, the JSON file and the plots.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/bench/internal/stats"
)

// Row is every repetition of one variant.
type Row struct {
	harness.Variant
	Reps []harness.Rep
}

// Figure picks one number out of a repetition.
type Figure func(harness.Rep) float64

// The figures of a repetition.
var (
	Gbps        Figure = func(r harness.Rep) float64 { return r.Gbps }
	MsgsPerS    Figure = func(r harness.Rep) float64 { return r.MsgsPerS }
	P50         Figure = func(r harness.Rep) float64 { return r.P50us }
	P99         Figure = func(r harness.Rep) float64 { return r.P99us }
	P999        Figure = func(r harness.Rep) float64 { return r.P999us }
	CPUPerGB    Figure = func(r harness.Rep) float64 { return r.CPUSndPerGB + r.CPURcvPerGB }
	CPUSndPerGB Figure = func(r harness.Rep) float64 { return r.CPUSndPerGB }
	CPURcvPerGB Figure = func(r harness.Rep) float64 { return r.CPURcvPerGB }
	CPUPerMsg   Figure = func(r harness.Rep) float64 { return r.CPUusPerMsg }
)

// Sum summarizes one figure over the repetitions.
func (r Row) Sum(f Figure) stats.Summary {
	xs := make([]float64, len(r.Reps))
	for i, rep := range r.Reps {
		xs[i] = f(rep)
	}
	return stats.Summarize(xs)
}

// Headline is the figure a scenario is judged by, its JSON name, and whether
// higher is better.
func Headline(s harness.Scenario) (Figure, string, bool) {
	switch s {
	case harness.Bulk:
		return Gbps, "gbps", true
	case harness.PingPong:
		return P99, "p99_us", false
	default:
		return MsgsPerS, "msgs_per_s", true
	}
}

// Result is one JSON object of -json: one per (scenario, mode, size, conns). Figures
// are medians over the repetitions; min and max are the spread of the headline figure
// (named by "headline"); a figure that does not apply is null. zc_bytes and
// copied_bytes (sends: zero-copy / copied) and rx_mapped_bytes and rx_copied_bytes
// (mapped receive path: mapped pages / copied) are totals over all repetitions.
type Result struct {
	Scenario    string   `json:"scenario"`
	Mode        string   `json:"mode"`
	Size        int      `json:"size"`
	Conns       int      `json:"conns"`
	Reps        int      `json:"reps"`
	Gbps        *float64 `json:"gbps"`
	MsgsPerS    *float64 `json:"msgs_per_s"`
	P50us       *float64 `json:"p50_us"`
	P99us       *float64 `json:"p99_us"`
	P999us      *float64 `json:"p999_us"`
	CPUsPerGB   *float64 `json:"cpu_s_per_gb"`
	Min         *float64 `json:"min"`
	Max         *float64 `json:"max"`
	ZCBytes     uint64   `json:"zc_bytes"`
	CopiedBytes uint64   `json:"copied_bytes"`

	// Beyond the list: what min/max refer to, the CPU split, the raw
	// headline of every repetition in run order.
	Headline      string    `json:"headline"`
	CPUSndPerGB   *float64  `json:"cpu_snd_s_per_gb"`
	CPURcvPerGB   *float64  `json:"cpu_rcv_s_per_gb"`
	CPUusPerMsg   *float64  `json:"cpu_us_per_msg"`
	HeadlineReps  []float64 `json:"headline_reps"`
	RxMappedBytes uint64    `json:"rx_mapped_bytes"`
	RxCopiedBytes uint64    `json:"rx_copied_bytes"`
}

func opt(s stats.Summary) *float64 {
	if s.N == 0 {
		return nil
	}
	v := s.Median
	return &v
}

// Results converts rows to JSON objects.
func Results(rows []Row) []Result {
	out := make([]Result, 0, len(rows))
	for _, r := range rows {
		hf, hname, _ := Headline(r.Scenario)
		h := r.Sum(hf)
		res := Result{
			Scenario: string(r.Scenario), Mode: r.Mode, Size: r.Size, Conns: r.Conns, Reps: len(r.Reps),
			Gbps: opt(r.Sum(Gbps)), MsgsPerS: opt(r.Sum(MsgsPerS)),
			P50us: opt(r.Sum(P50)), P99us: opt(r.Sum(P99)), P999us: opt(r.Sum(P999)),
			CPUsPerGB: opt(r.Sum(CPUPerGB)), CPUSndPerGB: opt(r.Sum(CPUSndPerGB)), CPURcvPerGB: opt(r.Sum(CPURcvPerGB)),
			CPUusPerMsg: opt(r.Sum(CPUPerMsg)), Headline: hname,
		}
		if h.N > 0 {
			lo, hi := h.Min, h.Max
			res.Min, res.Max = &lo, &hi
		}
		for _, rep := range r.Reps {
			res.ZCBytes += rep.ZCBytes
			res.CopiedBytes += rep.CopiedBytes
			res.RxMappedBytes += rep.RxMappedBytes
			res.RxCopiedBytes += rep.RxCopiedBytes
			if v := hf(rep); !math.IsNaN(v) {
				res.HeadlineReps = append(res.HeadlineReps, v)
			}
		}
		out = append(out, res)
	}
	return out
}

// WriteJSON writes the results as a JSON array to path.
func WriteJSON(path string, rows []Row) error {
	b, err := json.MarshalIndent(Results(rows), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Find returns the row of a variant, or nil.
func Find(rows []Row, s harness.Scenario, mode string, size, conns int) *Row {
	for i := range rows {
		r := &rows[i]
		if r.Scenario == s && r.Mode == mode && r.Size == size && r.Conns == conns && len(r.Reps) > 0 {
			return r
		}
	}
	return nil
}

// SizeString prints a byte count the way the issue does: 64 B, 4 KiB, 1 MiB.
func SizeString(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func spread(s stats.Summary, format string) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf(format+" ["+format+"–"+format+"]", s.Median, s.Min, s.Max)
}

func num(s stats.Summary, format string) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf(format, s.Median)
}

func ratio(a, b stats.Summary) string {
	if a.N == 0 || b.N == 0 || b.Median == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a.Median/b.Median)
}

// Table prints the results, one section per scenario, with ratios against net (and
// iperf3 for bulk). Ratios are of medians: mode/net.
func Table(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, sc := range harness.Scenarios {
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
		case harness.Bulk:
			fmt.Fprintln(tw, "BULK (one stream)\tsize\tGbit/s median [min–max]\t×net\t×iperf3\tCPU s/GB snd+rcv\tsnd\trcv\tCPU ×net\t")
		case harness.Echo:
			fmt.Fprintln(tw, "ECHO (request/response)\tsize\tconns\tmsgs/s median [min–max]\t×net\tRTT p50 µs\tp99 µs\tCPU µs/msg\t")
		case harness.PingPong:
			fmt.Fprintln(tw, "PING-PONG (one conn, RTT)\tsize\tp50 µs\tp99 µs median [min–max]\tp99.9 µs\tp99 ×net\tCPU µs/msg\t")
		case harness.Stream:
			fmt.Fprintln(tw, "SMALL-MESSAGE STREAM\tsize\tmsgs/s median [min–max]\t×net\tGbit/s\tCPU s/GB snd+rcv\t")
		}
		for _, r := range rs {
			net := Find(rows, r.Scenario, "net", r.Size, r.Conns)
			var netRow Row
			if net != nil {
				netRow = *net
			}
			size := SizeString(r.Size)
			switch sc {
			case harness.Bulk:
				ip := Find(rows, r.Scenario, "iperf3", r.Size, r.Conns)
				ipr := "-"
				if ip != nil {
					ipr = ratio(r.Sum(Gbps), ip.Sum(Gbps))
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, size, spread(r.Sum(Gbps), "%.2f"),
					ratio(r.Sum(Gbps), netRow.Sum(Gbps)), ipr,
					num(r.Sum(CPUPerGB), "%.3f"), num(r.Sum(CPUSndPerGB), "%.3f"), num(r.Sum(CPURcvPerGB), "%.3f"),
					ratio(r.Sum(CPUPerGB), netRow.Sum(CPUPerGB)))
			case harness.Echo:
				fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, size, r.Conns, spread(r.Sum(MsgsPerS), "%.0f"),
					ratio(r.Sum(MsgsPerS), netRow.Sum(MsgsPerS)), num(r.Sum(P50), "%.1f"), num(r.Sum(P99), "%.1f"), num(r.Sum(CPUPerMsg), "%.2f"))
			case harness.PingPong:
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, size, num(r.Sum(P50), "%.1f"), spread(r.Sum(P99), "%.1f"),
					num(r.Sum(P999), "%.1f"), ratio(r.Sum(P99), netRow.Sum(P99)), num(r.Sum(CPUPerMsg), "%.2f"))
			case harness.Stream:
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, size, spread(r.Sum(MsgsPerS), "%.0f"),
					ratio(r.Sum(MsgsPerS), netRow.Sum(MsgsPerS)), num(r.Sum(Gbps), "%.3f"), num(r.Sum(CPUPerGB), "%.2f"))
			}
		}
		fmt.Fprintln(tw, "\t")
	}
	tw.Flush()
	mappedTable(w, rows)
}

// mappedTable prints, for the rows of a mapped receive path, how much of what arrived
// was mapped rather than copied (totals over the repetitions).
func mappedTable(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := false
	for _, r := range rows {
		var mapped, copied uint64
		for _, rep := range r.Reps {
			mapped += rep.RxMappedBytes
			copied += rep.RxCopiedBytes
		}
		if mapped+copied == 0 {
			continue
		}
		if !head {
			fmt.Fprintln(tw, "MAPPED RECEIVE (TCP_ZEROCOPY_RECEIVE)\tscenario\tsize\treceived as mapped pages\tcopied\t")
			head = true
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%.1f%% (%.2f GB)\t%.2f GB\t\n", r.Mode, r.Scenario, SizeString(r.Size),
			100*float64(mapped)/float64(mapped+copied), float64(mapped)/1e9, float64(copied)/1e9)
	}
	if head {
		fmt.Fprintln(tw, "\t")
	}
	tw.Flush()
}

// Goal is the verdict on one goal of issue 4.
type Goal struct {
	Name   string
	Status string // "met", "missed", or "n/a (...)"
	Detail string
}

// Zero-copy mode names, as the zc adapters register them.
const (
	ZC       = "zc"
	ZCCopy   = "zc-copy"
	ZCSendZC = "zc-sendzc"
	ZCMmap   = "zc-mmap"
)

// Goals judges the goals of issue 4 on the medians of one run; a goal whose modes did
// not run is "n/a".
func Goals(rows []Row) []Goal {
	na := func(name, mode string) Goal {
		return Goal{Name: name, Status: fmt.Sprintf("n/a (%s not available)", mode)}
	}
	na0 := func(name string) Goal { return Goal{Name: name, Status: "n/a (mode not available)"} }
	judge := func(name string, ok bool, detail string) Goal {
		st := "missed"
		if ok {
			st = "met"
		}
		return Goal{Name: name, Status: st, Detail: detail}
	}
	var gs []Goal
	const k64 = 64 << 10
	zcBulk := Find(rows, harness.Bulk, ZC, k64, 1)
	netBulk := Find(rows, harness.Bulk, "net", k64, 1)
	ipBulk := Find(rows, harness.Bulk, "iperf3", k64, 1)

	g := "bulk 64 KiB: zc ≥ 2.0× net (Gbit/s)"
	switch {
	case zcBulk == nil:
		gs = append(gs, na0(g))
	case netBulk == nil:
		gs = append(gs, na(g, "net"))
	default:
		x := zcBulk.Sum(Gbps).Median / netBulk.Sum(Gbps).Median
		gs = append(gs, judge(g, x >= 2.0, fmt.Sprintf("%.3f×", x)))
	}
	g = "bulk 64 KiB: zc ≥ 2.5× iperf3 (Gbit/s)"
	switch {
	case zcBulk == nil:
		gs = append(gs, na0(g))
	case ipBulk == nil:
		gs = append(gs, na(g, "iperf3"))
	default:
		x := zcBulk.Sum(Gbps).Median / ipBulk.Sum(Gbps).Median
		gs = append(gs, judge(g, x >= 2.5, fmt.Sprintf("%.3f×", x)))
	}
	g = "bulk 64 KiB: zc CPU s/GB ≤ 0.6× net (sender+receiver)"
	switch {
	case zcBulk == nil:
		gs = append(gs, na0(g))
	case netBulk == nil:
		gs = append(gs, na(g, "net"))
	default:
		x := zcBulk.Sum(CPUPerGB).Median / netBulk.Sum(CPUPerGB).Median
		gs = append(gs, judge(g, x <= 0.6, fmt.Sprintf("%.3f×", x)))
	}
	g = "echo 64 B, 64 connections: zc ≥ 2.0× net (msgs/s)"
	zcEcho, netEcho := Find(rows, harness.Echo, ZC, 64, 64), Find(rows, harness.Echo, "net", 64, 64)
	switch {
	case zcEcho == nil:
		gs = append(gs, na0(g))
	case netEcho == nil:
		gs = append(gs, na(g, "net"))
	default:
		x := zcEcho.Sum(MsgsPerS).Median / netEcho.Sum(MsgsPerS).Median
		gs = append(gs, judge(g, x >= 2.0, fmt.Sprintf("%.3f×", x)))
	}
	g = "ping-pong 64 B: zc p99 ≤ net p99"
	zcPP, netPP := Find(rows, harness.PingPong, ZC, 64, 1), Find(rows, harness.PingPong, "net", 64, 1)
	switch {
	case zcPP == nil:
		gs = append(gs, na0(g))
	case netPP == nil:
		gs = append(gs, na(g, "net"))
	default:
		a, b := zcPP.Sum(P99).Median, netPP.Sum(P99).Median
		gs = append(gs, judge(g, a <= b, fmt.Sprintf("%.1f µs vs %.1f µs", a, b)))
	}
	g = "adaptive zc ≥ 0.95× zc-copy (bulk, every size; worst shown)"
	worst, found, missing := math.Inf(1), false, ""
	for _, r := range rows {
		if r.Scenario != harness.Bulk || r.Mode != ZC || len(r.Reps) == 0 {
			continue
		}
		cp := Find(rows, harness.Bulk, ZCCopy, r.Size, r.Conns)
		if cp == nil {
			missing = ZCCopy
			continue
		}
		found = true
		worst = min(worst, r.Sum(Gbps).Median/cp.Sum(Gbps).Median)
	}
	switch {
	case found:
		gs = append(gs, judge(g, worst >= 0.95, fmt.Sprintf("%.3f×", worst)))
	case missing != "":
		gs = append(gs, na(g, missing))
	default:
		gs = append(gs, na0(g))
	}
	return gs
}

// PrintGoals writes the verdicts.
func PrintGoals(w io.Writer, gs []Goal) {
	fmt.Fprintln(w, "GOALS (issue 4, medians of this run)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, g := range gs {
		d := g.Detail
		if d != "" {
			d = "(" + d + ")"
		}
		st := g.Status
		if st == "met" || st == "missed" {
			st = strings.ToUpper(st)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", g.Name, st, d)
	}
	tw.Flush()
}
