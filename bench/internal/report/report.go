// Package report turns zcbench's repetitions into results: medians with min–max, the
// tables with ratios against net, the verdicts on issue 10's goals, the JSON file and
// the plots.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
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
	Gbps         Figure = func(r harness.Rep) float64 { return r.Gbps }
	MsgsPerS     Figure = func(r harness.Rep) float64 { return r.MsgsPerS }
	P50          Figure = func(r harness.Rep) float64 { return r.P50us }
	P99          Figure = func(r harness.Rep) float64 { return r.P99us }
	P999         Figure = func(r harness.Rep) float64 { return r.P999us }
	CPUPerGB     Figure = func(r harness.Rep) float64 { return r.CPUSndPerGB + r.CPURcvPerGB }
	CPUSndPerGB  Figure = func(r harness.Rep) float64 { return r.CPUSndPerGB }
	CPURcvPerGB  Figure = func(r harness.Rep) float64 { return r.CPURcvPerGB }
	CPUPerMsg    Figure = func(r harness.Rep) float64 { return r.CPUusPerMsg }
	SrvCPUPerMsg Figure = func(r harness.Rep) float64 { return r.SrvCPUusPerMsg }
	// IdleBytes is the server's resident memory per idle connection (bytes).
	IdleBytes Figure = func(r harness.Rep) float64 { return r.IdleBytesPerConn }
	// IdlePinned is the server's pinned memory with every idle connection open (bytes).
	IdlePinned Figure = func(r harness.Rep) float64 { return r.IdlePinned }
	rssBefore  Figure = func(r harness.Rep) float64 { return nonZero(float64(r.Server.RSSBefore)) }
	rssAfter   Figure = func(r harness.Rep) float64 { return nonZero(float64(r.Server.RSSAfter)) }
)

func nonZero(x float64) float64 {
	if x == 0 {
		return math.NaN()
	}
	return x
}

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
	case harness.Bulk, harness.FileSend, harness.Relay, harness.RelayHalfClose, harness.FileStream, harness.FilesTLS, harness.RelayTLS:
		return Gbps, "gbps", true
	case harness.PingPong:
		return P99, "p99_us", false
	case harness.Idle:
		return IdleBytes, "idle_bytes_per_conn", false
	default:
		return MsgsPerS, "msgs_per_s", true
	}
}

// Result is one object of the JSON's "results": one per (scenario, mode, size, conns).
// Figures are medians over the repetitions; min and max are the spread of the headline
// figure (named by "headline"); a figure that does not apply is null. zc_bytes and
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

	// What min/max refer to, the CPU split, the raw headline of every repetition in run
	// order.
	Headline       string   `json:"headline"`
	CPUSndPerGB    *float64 `json:"cpu_snd_s_per_gb"`
	CPURcvPerGB    *float64 `json:"cpu_rcv_s_per_gb"`
	CPUusPerMsg    *float64 `json:"cpu_us_per_msg"`
	SrvCPUusPerMsg *float64 `json:"srv_cpu_us_per_msg"`
	// SrvCPUsPerGB: the services' server CPU seconds per GB verified (relay, files).
	SrvCPUsPerGB  *float64  `json:"srv_cpu_s_per_gb"`
	HeadlineReps  []float64 `json:"headline_reps"`
	RxMappedBytes uint64    `json:"rx_mapped_bytes"`
	RxCopiedBytes uint64    `json:"rx_copied_bytes"`
	// Idle: the server's resident memory per idle connection, VmRSS before the first
	// and with all connections (bytes), and its pinned memory (VmPin) with them.
	IdleBytesPerConn *float64 `json:"idle_bytes_per_conn"`
	RSSBefore        *float64 `json:"rss_before_bytes"`
	RSSAfter         *float64 `json:"rss_after_bytes"`
	PinnedBytes      *float64 `json:"pinned_bytes"`
	// Notes: what the server said about itself (zc's steering), from the last
	// repetition.
	Notes map[string]string `json:"notes,omitempty"`
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
			CPUusPerMsg: opt(r.Sum(CPUPerMsg)), SrvCPUusPerMsg: opt(r.Sum(SrvCPUPerMsg)), Headline: hname,
			SrvCPUsPerGB:     opt(r.Sum(SrvCPUPerGB)),
			IdleBytesPerConn: opt(r.Sum(IdleBytes)), PinnedBytes: opt(r.Sum(IdlePinned)),
			RSSBefore: opt(r.Sum(rssBefore)), RSSAfter: opt(r.Sum(rssAfter)),
			Notes: notes(r),
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

// notes returns the notes of the last repetition: the server's, and the client's
// with "client " before their keys.
func notes(r Row) map[string]string {
	if len(r.Reps) == 0 {
		return nil
	}
	last := r.Reps[len(r.Reps)-1]
	if len(last.Client.Notes) == 0 {
		return last.Server.Notes
	}
	n := maps.Clone(last.Server.Notes)
	if n == nil {
		n = map[string]string{}
	}
	for k, v := range last.Client.Notes {
		n["client "+k] = v
	}
	return n
}

// RunInfo describes the run in the JSON file.
type RunInfo struct {
	Title     string `json:"title"`
	Reps      int    `json:"reps"`
	Duration  string `json:"duration"`
	Placement string `json:"placement"`
	// MultiCore: the CPUs of the server and of the load generator.
	MultiCoreServerCPUs []int `json:"multicore_server_cpus,omitempty"`
	MultiCoreLoadCPUs   []int `json:"multicore_load_cpus,omitempty"`
	// Skipped: scenarios this machine could not run, and why.
	Skipped map[string]string `json:"skipped"`
	Notes   []string          `json:"notes"`
}

// Document is the JSON file: the run, its results, the goal verdicts.
type Document struct {
	Run     RunInfo  `json:"run"`
	Results []Result `json:"results"`
	Goals   []Goal   `json:"goals"`
	// Noise is the A/A comparison (zc-copy-aa / zc-copy), when the run has one.
	Noise []Check `json:"noise,omitempty"`
}

// WriteJSON writes the run, its results and the goal verdicts as one JSON object.
func WriteJSON(path string, run RunInfo, rows []Row, goals []Goal) error {
	noise := NoiseFloor(rows)
	doc := Document{Run: run, Results: Results(rows), Goals: goals, Noise: noise}
	b, err := json.MarshalIndent(doc, "", "  ")
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
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
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

// sumOf summarizes f over the row r points at, or nothing.
func sumOf(r *Row, f Figure) stats.Summary {
	if r == nil {
		return stats.Summary{}
	}
	return r.Sum(f)
}

func mib(s stats.Summary) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", s.Median/(1<<20))
}

// Table prints the results, one section per scenario, with ratios against net (and
// iperf3 for bulk, netpoll for multi-core). Ratios are of medians: mode/net.
func Table(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, sc := range harness.Scenarios {
		var rs []Row
		for _, r := range rows {
			if r.Scenario == sc && len(r.Reps) > 0 {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 || sc.Service() {
			continue
		}
		switch sc {
		case harness.Bulk:
			fmt.Fprintln(tw, "BULK (one stream)\tsize\tGbit/s median [min–max]\t×net\t×net-buf\t×iperf3\tCPU s/GB snd+rcv\tsnd\trcv\tCPU ×net\tCPU ×net-buf\t")
		case harness.Echo:
			fmt.Fprintln(tw, "ECHO (request/response, one CPU each side)\tsize\tconns\tmsgs/s median [min–max]\t×net\tRTT p50 µs\tp99 µs\tCPU µs/msg\tsrv CPU µs/msg [min–max]\tsrv CPU ×c-uring\t")
		case harness.PingPong:
			fmt.Fprintln(tw, "PING-PONG (one conn, RTT)\tsize\tp50 µs\tp99 µs median [min–max]\tp99.9 µs\tp99 ×net\tCPU µs/msg\t")
		case harness.Stream:
			fmt.Fprintln(tw, "SMALL-MESSAGE STREAM (net: 4 KiB bufio.Writer, net-buf: 1 MiB)\tsize\tmsgs/s median [min–max]\t×net\t×net-buf\tGbit/s\tCPU s/GB snd+rcv\t")
		case harness.MultiCore:
			fmt.Fprintln(tw, "MULTI-CORE ECHO (server N CPUs, load others)\tconns\tmsgs/s median [min–max]\t×net\t×netpoll\tRTT p50 µs\tp99 µs\tsrv CPU µs/msg\tsteering\t")
		case harness.HTTP:
			fmt.Fprintln(tw, "HTTP (net/http server on the mode's listener)\tconns\treq/s median [min–max]\t×net\tRTT p50 µs\tp99 µs\tsrv CPU µs/req\t")
		case harness.FileSend:
			fmt.Fprintln(tw, "FILE SEND (io.Copy from *os.File)\tframes\tGbit/s median [min–max]\t×net\tCPU s/GB snd\trcv\t")
		case harness.Idle:
			fmt.Fprintln(tw, "IDLE CONNECTIONS (server memory)\tconns\tbytes/conn median [min–max]\t×net\tRSS before MiB\twith conns MiB\tpinned MiB\t")
		}
		for _, r := range rs {
			net := Find(rows, r.Scenario, "net", r.Size, r.Conns)
			nbuf := Find(rows, r.Scenario, NetBuf, r.Size, r.Conns)
			size := SizeString(r.Size)
			switch sc {
			case harness.Bulk:
				ip := Find(rows, r.Scenario, "iperf3", r.Size, r.Conns)
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, size, spread(r.Sum(Gbps), "%.2f"),
					ratio(r.Sum(Gbps), sumOf(net, Gbps)), ratio(r.Sum(Gbps), sumOf(nbuf, Gbps)), ratio(r.Sum(Gbps), sumOf(ip, Gbps)),
					num(r.Sum(CPUPerGB), "%.3f"), num(r.Sum(CPUSndPerGB), "%.3f"), num(r.Sum(CPURcvPerGB), "%.3f"),
					ratio(r.Sum(CPUPerGB), sumOf(net, CPUPerGB)), ratio(r.Sum(CPUPerGB), sumOf(nbuf, CPUPerGB)))
			case harness.Echo:
				cu := Find(rows, r.Scenario, CUring, r.Size, r.Conns)
				fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, size, r.Conns, spread(r.Sum(MsgsPerS), "%.0f"),
					ratio(r.Sum(MsgsPerS), sumOf(net, MsgsPerS)), num(r.Sum(P50), "%.1f"), num(r.Sum(P99), "%.1f"), num(r.Sum(CPUPerMsg), "%.2f"),
					spread(r.Sum(SrvCPUPerMsg), "%.2f"), ratio(r.Sum(SrvCPUPerMsg), sumOf(cu, SrvCPUPerMsg)))
			case harness.PingPong:
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, size, num(r.Sum(P50), "%.1f"), spread(r.Sum(P99), "%.1f"),
					num(r.Sum(P999), "%.1f"), ratio(r.Sum(P99), sumOf(net, P99)), num(r.Sum(CPUPerMsg), "%.2f"))
			case harness.Stream:
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, size, spread(r.Sum(MsgsPerS), "%.0f"),
					ratio(r.Sum(MsgsPerS), sumOf(net, MsgsPerS)), ratio(r.Sum(MsgsPerS), sumOf(nbuf, MsgsPerS)), num(r.Sum(Gbps), "%.3f"), num(r.Sum(CPUPerGB), "%.2f"))
			case harness.MultiCore:
				np := Find(rows, r.Scenario, "netpoll", r.Size, r.Conns)
				fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, r.Conns, spread(r.Sum(MsgsPerS), "%.0f"),
					ratio(r.Sum(MsgsPerS), sumOf(net, MsgsPerS)), ratio(r.Sum(MsgsPerS), sumOf(np, MsgsPerS)),
					num(r.Sum(P50), "%.1f"), num(r.Sum(P99), "%.1f"), num(r.Sum(SrvCPUPerMsg), "%.2f"), notes(r)["steering"])
			case harness.HTTP:
				fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, r.Conns, spread(r.Sum(MsgsPerS), "%.0f"),
					ratio(r.Sum(MsgsPerS), sumOf(net, MsgsPerS)), num(r.Sum(P50), "%.1f"), num(r.Sum(P99), "%.1f"), num(r.Sum(SrvCPUPerMsg), "%.2f"))
			case harness.FileSend:
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, size, spread(r.Sum(Gbps), "%.2f"),
					ratio(r.Sum(Gbps), sumOf(net, Gbps)), num(r.Sum(CPUSndPerGB), "%.3f"), num(r.Sum(CPURcvPerGB), "%.3f"))
			case harness.Idle:
				fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, r.Conns, spread(r.Sum(IdleBytes), "%.0f"),
					ratio(r.Sum(IdleBytes), sumOf(net, IdleBytes)), mib(r.Sum(rssBefore)), mib(r.Sum(rssAfter)), mib(r.Sum(IdlePinned)))
			}
		}
		fmt.Fprintln(tw, "\t")
	}
	tw.Flush()
	servicesTable(w, rows)
	tlsTable(w, rows)
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

// statusMET etc. are the verdicts of a goal.
const (
	StatusMet    = "MET"
	StatusMissed = "MISSED"
	// StatusNotRun starts the verdict of a goal whose figures this run did not measure:
	// "NOT RUN (why)". Never MET.
	StatusNotRun = "NOT RUN"
	// StatusUndecided: a check of the goal lies closer to its target than this run's A/A
	// pair moved round by round in that figure (or the run has no A/A measure of it), and
	// no other check missed outright: the run cannot tell met from missed.
	StatusUndecided = "UNDECIDED"
)

// Check is one comparison a goal makes: a ratio of medians of two figures measured in
// this run, the spread of the same ratio taken round by round (the variants of one
// round ran side by side), and whether it meets the target. A check without figures
// (Text) compares a fact, such as the steering in use.
type Check struct {
	What     string   `json:"what"`
	Ratio    *float64 `json:"ratio,omitempty"`
	RoundMin *float64 `json:"round_min,omitempty"`
	RoundMax *float64 `json:"round_max,omitempty"`
	// A and B are the medians compared (Ratio = A/B), in Unit.
	A    *float64 `json:"a,omitempty"`
	B    *float64 `json:"b,omitempty"`
	Unit string   `json:"unit,omitempty"`
	// Target: "≥ 0.9", "≤ 0.8" for a ratio.
	Target string `json:"target"`
	Text   string `json:"text,omitempty"`
	Met    bool   `json:"met"`
	// Noise is this run's A/A noise in the check's figure (AANoise: the largest per-round
	// deviation of the pair from 1), absent when the run has no A/A measure of it.
	Noise *float64 `json:"noise,omitempty"`
	// InNoise: the ratio is closer to its target than Noise (relative to the target), or
	// there is no Noise to judge by: the run cannot tell met from missed; Met still says
	// which side the median fell on.
	InNoise bool `json:"in_noise,omitempty"`
	// Rounds: the ratio round by round (the A/A checks of NOISE).
	Rounds []float64 `json:"rounds,omitempty"`
	goal   float64   // the target as a number (0: none)
}

// Goal is the verdict on one goal of issue 10.
type Goal struct {
	ID     int     `json:"id"`
	Name   string  `json:"name"`
	Status string  `json:"status"` // MET, MISSED, or NOT RUN (why)
	Checks []Check `json:"checks"`
	Note   string  `json:"note,omitempty"`
	anyOf  bool    // met when any check is met (goal 4), not every one
}

// Zero-copy mode names, as the zc adapters register them.
const (
	ZC     = "zc"
	ZCCopy = "zc-copy"
	// ZCCopyAA is zc-copy run again as a variant of its own: the A/A pair whose ratio
	// measures how far two identical variants drift apart in this run (NoiseFloor).
	ZCCopyAA = "zc-copy-aa"
	ZCBusy   = "zc-busy"
	// ZCExtraP is zc's default with Config.AddProcs (zc's package doc, "Queues and Go's
	// scheduler"): printed beside goal 4, not counted for it.
	ZCExtraP = "zc-extra-p"
	ZCSendZC = "zc-sendzc"
	ZCMmap   = "zc-mmap"
	ZCNet    = "zc-net"
	Netpoll  = "netpoll"
	// NetBuf and SyscallBuf are the buffered baselines: net and syscall writing through a
	// 1 MiB user buffer (bulk and stream), the batching zc's sends do.
	NetBuf     = "net-buf"
	SyscallBuf = "syscall-buf"
)

// roundRatios pairs the repetitions of a and b by round and returns the min and max of
// f(a)/f(b) over the rounds where both have a value.
func roundRatios(a, b *Row, f Figure) (lo, hi float64, ok bool) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, ra := range a.Reps {
		for _, rb := range b.Reps {
			if ra.Round != rb.Round {
				continue
			}
			x, y := f(ra), f(rb)
			if math.IsNaN(x) || math.IsNaN(y) || y == 0 {
				continue
			}
			lo, hi, ok = min(lo, x/y), max(hi, x/y), true
		}
	}
	return lo, hi, ok
}

func ptr(x float64) *float64 { return &x }

// compare makes the check f(a)/f(b) against target (≥ when atLeast, else ≤).
func compare(what string, a, b *Row, f Figure, unit string, target float64, atLeast bool) Check {
	ma, mb := a.Sum(f).Median, b.Sum(f).Median
	x := ma / mb
	c := Check{What: what, Ratio: ptr(x), A: ptr(ma), B: ptr(mb), Unit: unit, goal: target}
	if lo, hi, ok := roundRatios(a, b, f); ok {
		c.RoundMin, c.RoundMax = ptr(lo), ptr(hi)
	}
	if atLeast {
		c.Target = fmt.Sprintf("≥ %.2g", target)
		c.Met = x >= target
	} else {
		c.Target = fmt.Sprintf("≤ %.2g", target)
		c.Met = x <= target
	}
	return c
}

func verdict(id int, name string, checks []Check, note string) Goal {
	st := StatusMet
	for _, c := range checks {
		if !c.Met {
			st = StatusMissed
		}
	}
	return Goal{ID: id, Name: name, Status: st, Checks: checks, Note: note}
}

func notRun(id int, name, why string) Goal {
	return Goal{ID: id, Name: name, Status: StatusNotRun + " (" + why + ")"}
}

// bulkSizes are the write sizes goals 1 and 6 judge.
var bulkSizes = []int{4 << 10, 64 << 10, 1 << 20}

// Goals judges the six goals of issue 10 on the medians of one run. skipped says why a
// scenario did not run on this machine (MultiCore: "needs ≥ 4 CPUs"); a goal whose
// figures are missing is NOT RUN, never MET.
func Goals(rows []Row, skipped map[harness.Scenario]string) []Goal {
	missing := func(s harness.Scenario, what string) string {
		if why, ok := skipped[s]; ok {
			return why
		}
		return what + " not measured"
	}
	var gs []Goal

	// 1. Bulk: zc ≥ 0.9× the best single stream of any mode, at every size.
	name := "bulk: zc ≥ 0.9× the best mode's Gbit/s at every write size (4 KiB–1 MiB)"
	var checks []Check
	why := ""
	for _, size := range bulkSizes {
		z := Find(rows, harness.Bulk, ZC, size, 1)
		if z == nil {
			why = missing(harness.Bulk, "zc bulk "+SizeString(size))
			break
		}
		best := z
		for i := range rows {
			r := &rows[i]
			if r.Scenario == harness.Bulk && r.Size == size && r.Conns == 1 && len(r.Reps) > 0 &&
				r.Mode != ZCCopyAA && r.Sum(Gbps).Median > best.Sum(Gbps).Median {
				best = r
			}
		}
		c := compare(fmt.Sprintf("%s: zc / %s (best)", SizeString(size), best.Mode), z, best, Gbps, "Gbit/s", 0.9, true)
		if best == z {
			c.goal = 0 // zc is the best mode: met exactly, whatever the noise
		}
		checks = append(checks, c)
	}
	if why != "" {
		gs = append(gs, notRun(1, name, why))
	} else {
		gs = append(gs, verdict(1, name, checks, ""))
	}

	// 2. Bulk CPU per GB at 64 KiB, against the stronger of net and net-buf (the lower CPU
	// per GB): a Go user who cares about CPU per byte buffers writes.
	name = "bulk 64 KiB: zc CPU s/GB (sender + receiver) ≤ 0.8× net (the stronger of net and net-buf)"
	z, n := Find(rows, harness.Bulk, ZC, 64<<10, 1), Find(rows, harness.Bulk, "net", 64<<10, 1)
	if z == nil || n == nil {
		gs = append(gs, notRun(2, name, missing(harness.Bulk, "bulk 64 KiB of zc and net")))
	} else {
		note := "net-buf not measured: the baseline is unbuffered net only"
		if nb := Find(rows, harness.Bulk, NetBuf, 64<<10, 1); nb != nil {
			note = fmt.Sprintf("CPU s/GB: net %.3f, net-buf %.3f", n.Sum(CPUPerGB).Median, nb.Sum(CPUPerGB).Median)
			if nb.Sum(CPUPerGB).Median < n.Sum(CPUPerGB).Median {
				n = nb
			}
		}
		gs = append(gs, verdict(2, name, []Check{compare("zc / "+n.Mode, z, n, CPUPerGB, "CPU s/GB", 0.8, false)}, note))
	}

	// 3. Multi-core echo, 512 connections.
	gs = append(gs, multiCoreGoal(rows, missing))

	// 4. Ping-pong p99: the default (CPU-friendly) and the opt-in busy-polling mode, both
	// measured; the goal is met when either meets it (the note says which).
	name = "ping-pong 64 B: zc RTT p99 ≤ 0.8× net (default or opt-in busy poll)"
	z, n = Find(rows, harness.PingPong, ZC, 64, 1), Find(rows, harness.PingPong, "net", 64, 1)
	zb := Find(rows, harness.PingPong, ZCBusy, 64, 1)
	if z == nil || n == nil {
		gs = append(gs, notRun(4, name, missing(harness.PingPong, "ping-pong of zc and net")))
	} else {
		checks := []Check{compare("zc (default) / net", z, n, P99, "µs", 0.8, false)}
		if zb != nil {
			checks = append(checks, compare("zc-busy (BusyPoll) / net", zb, n, P99, "µs", 0.8, false))
		}
		var notes []string
		for _, m := range []string{ZCCopy, ZCExtraP} {
			if r := Find(rows, harness.PingPong, m, 64, 1); r != nil {
				notes = append(notes, fmt.Sprintf("%s p99 %.2f× net", m, r.Sum(P99).Median/n.Sum(P99).Median))
			}
		}
		note := strings.Join(notes, ", ")
		g := verdict(4, name, checks, note)
		g.anyOf = true // either configuration meeting it is the goal
		if zb != nil && g.Status != StatusMet && (checks[0].Met || checks[1].Met) {
			g.Status = StatusMet
		}
		gs = append(gs, g)
	}

	// 5. The net.Conn face: HTTP and a file send through the adapter.
	name = "net.Conn face: HTTP req/s over NetListen ≥ 1.0× net/http on Go net; file send through the adapter ≥ 1.0× io.Copy on *net.TCPConn"
	zh, nh := Find(rows, harness.HTTP, ZCNet, 64, 32), Find(rows, harness.HTTP, "net", 64, 32)
	zf, nf := Find(rows, harness.FileSend, ZCNet, 64<<10, 1), Find(rows, harness.FileSend, "net", 64<<10, 1)
	switch {
	case zh == nil || nh == nil:
		gs = append(gs, notRun(5, name, missing(harness.HTTP, "HTTP of zc-net and net")))
	case zf == nil || nf == nil:
		gs = append(gs, notRun(5, name, missing(harness.FileSend, "file send of zc-net and net")))
	default:
		note := ""
		if n := notes(*zf); n["client io.ReaderFrom"] != "" {
			note = fmt.Sprintf("zc-net's connection implements io.ReaderFrom: %s, io.WriterTo: %s (net's: %s, %s)",
				n["client io.ReaderFrom"], n["client io.WriterTo"], notes(*nf)["client io.ReaderFrom"], notes(*nf)["client io.WriterTo"])
		}
		gs = append(gs, verdict(5, name, []Check{
			compare("HTTP: zc-net / net", zh, nh, MsgsPerS, "req/s", 1.0, true),
			compare("file send: zc-net / net", zf, nf, Gbps, "Gbit/s", 1.0, true),
		}, note))
	}

	// 6. Adaptive zero-copy never costs more than copying.
	name = "adaptive: zc ≥ 0.98× zc-copy (Gbit/s) at every bulk size"
	checks, why = nil, ""
	for _, size := range bulkSizes {
		z, cp := Find(rows, harness.Bulk, ZC, size, 1), Find(rows, harness.Bulk, ZCCopy, size, 1)
		if z == nil || cp == nil {
			why = missing(harness.Bulk, "bulk "+SizeString(size)+" of zc and zc-copy")
			break
		}
		checks = append(checks, compare(SizeString(size)+": zc / zc-copy", z, cp, Gbps, "Gbit/s", 0.98, true))
	}
	if why != "" {
		gs = append(gs, notRun(6, name, why))
	} else {
		gs = append(gs, verdict(6, name, checks, ""))
	}
	applyNoise(gs, rows)
	return gs
}

// noiseSources says which A/A pair measures the noise of a check's unit: the pair's
// scenario and figure. Rates of requests (HTTP) are read against the echo pair's, file
// sends against the bulk pair's.
var noiseSources = map[string]struct {
	scen harness.Scenario
	f    Figure
}{
	"Gbit/s":   {harness.Bulk, Gbps},
	"CPU s/GB": {harness.Bulk, CPUPerGB},
	"msgs/s":   {harness.Echo, MsgsPerS},
	"req/s":    {harness.Echo, MsgsPerS},
	"µs":       {harness.PingPong, P99},
	// server CPU per request, the goal against the limit (limit.go)
	unitSrvMsg: {harness.Echo, SrvCPUPerMsg},
	// the services' A/A pair (net-aa / net)
	unitSrvUs:   {harness.KV, SrvCPUPerMsg},
	unitSrvSGB:  {harness.Relay, SrvCPUPerGB},
	unitSvcGbps: {harness.Relay, Gbps},
	// the TLS A/A pair (net-tls-aa / net-tls)
	unitTLSSrvUs:  {harness.HTTPSWrk, SrvCPUPerMsg},
	unitTLSReqs:   {harness.HTTPSWrk, MsgsPerS},
	unitTLSSrvSGB: {harness.FilesTLS, SrvCPUPerGB},
	unitTLSGbps:   {harness.FilesTLS, Gbps},
}

// AANoise is this run's noise in a unit of the goals: over every A/A pair that measures it
// (zc-copy-aa / zc-copy in the scenario of noiseSources), the largest deviation from 1 of
// the pair's ratio taken round by round. Not the ratio of medians, which hides how far
// two identical variants moved apart in single rounds. ok is false when no pair measured
// it.
func AANoise(rows []Row, unit string) (dev float64, ok bool) {
	src, known := noiseSources[unit]
	if !known {
		return 0, false
	}
	for _, p := range aaPairs(rows) {
		if p[0].Scenario != src.scen || (src.scen == harness.Relay && p[0].Conns != 8) {
			continue
		}
		if lo, hi, has := roundRatios(p[0], p[1], src.f); has {
			dev, ok = max(dev, math.Abs(lo-1), math.Abs(hi-1)), true
		}
	}
	return dev, ok
}

// NoiseFloor compares every A/A pair of the run (zc-copy-aa / zc-copy) in its scenario's
// headline figure (bulk also in CPU s/GB): the ratio of medians and the ratio round by
// round (Rounds).
func NoiseFloor(rows []Row) []Check {
	var checks []Check
	for _, p := range aaPairs(rows) {
		hf, _, _ := Headline(p[0].Scenario)
		figs := []Figure{hf}
		units := []string{headlineUnit(p[0].Scenario)}
		switch p[0].Scenario {
		case harness.Bulk:
			figs, units = append(figs, CPUPerGB), append(units, "CPU s/GB")
		case harness.Echo:
			figs, units = append(figs, SrvCPUPerMsg), append(units, unitSrvMsg)
		case harness.KV:
			figs, units = []Figure{SrvCPUPerMsg}, []string{unitSrvUs}
		case harness.Relay:
			figs, units = []Figure{Gbps, SrvCPUPerGB}, []string{unitSvcGbps, unitSrvSGB}
		case harness.HTTPSWrk:
			figs, units = []Figure{MsgsPerS, SrvCPUPerMsg}, []string{unitTLSReqs, unitTLSSrvUs}
		case harness.FilesTLS:
			figs, units = []Figure{Gbps, SrvCPUPerGB}, []string{unitTLSGbps, unitTLSSrvSGB}
		}
		for i, f := range figs {
			what := fmt.Sprintf("%s %s: %s / %s", p[0].Scenario, SizeString(p[0].Size), p[0].Mode, p[1].Mode)
			c := compare(what, p[0], p[1], f, units[i], 1, true)
			c.Target, c.Met, c.goal = "", true, 0
			for _, ra := range p[0].Reps {
				for _, rb := range p[1].Reps {
					if x, y := f(ra), f(rb); ra.Round == rb.Round && !math.IsNaN(x) && !math.IsNaN(y) && y != 0 {
						c.Rounds = append(c.Rounds, x/y)
					}
				}
			}
			checks = append(checks, c)
		}
	}
	return checks
}

func headlineUnit(s harness.Scenario) string {
	switch _, name, _ := Headline(s); name {
	case "gbps":
		return "Gbit/s"
	case "p99_us":
		return "µs"
	case "idle_bytes_per_conn":
		return "B"
	}
	return "msgs/s"
}

// aaPairs lists the A/A pairs of the run: {zc-copy-aa, zc-copy} of the same scenario, size
// and connections.
func aaPairs(rows []Row) [][2]*Row {
	var ps [][2]*Row
	for i := range rows {
		aa := &rows[i]
		if (aa.Mode != ZCCopyAA && aa.Mode != NetAA && aa.Mode != NetTLSAA) || len(aa.Reps) == 0 {
			continue
		}
		base := ZCCopy
		switch aa.Mode {
		case NetAA:
			base = "net"
		case NetTLSAA:
			base = NetTLS
		}
		if cp := Find(rows, aa.Scenario, base, aa.Size, aa.Conns); cp != nil {
			ps = append(ps, [2]*Row{aa, cp})
		}
	}
	return ps
}

// applyNoise reads every check of a measured goal against its own rounds and this run's A/A
// noise in its unit (AANoise): a check whose rounds straddle its target, a ratio closer to
// its target than that noise (relative to the target), or one whose unit no A/A pair
// measured, is InNoise. The goal is then MISSED if a check
// missed outside the noise (goal 4, met by either configuration: if none met outside it),
// UNDECIDED if a check lies within it, MET otherwise. A check of zc against itself (goal 1
// where zc is the best mode) and a check of a fact (goal 3's steering) are exact.
func applyNoise(gs []Goal, rows []Row) {
	for i := range gs {
		g := &gs[i]
		if strings.HasPrefix(g.Status, StatusNotRun) {
			continue
		}
		var undecided []string
		decidedMet, decidedMissed := false, false
		for j := range g.Checks {
			c := &g.Checks[j]
			if c.Ratio != nil && c.goal > 0 {
				dev, ok := AANoise(rows, c.Unit)
				switch {
				case c.RoundMin != nil && c.RoundMax != nil && *c.RoundMin < c.goal && c.goal < *c.RoundMax:
					// The check's own rounds fall on both sides of its target: whatever the
					// median says, this run cannot tell met from missed.
					c.InNoise = true
					if ok {
						c.Noise = ptr(dev)
					}
					undecided = append(undecided, fmt.Sprintf("%s: its rounds %.2f–%.2f straddle the target", c.What, *c.RoundMin, *c.RoundMax))
				case !ok:
					c.InNoise = true
					undecided = append(undecided, c.What+": no A/A measure of "+c.Unit)
				default:
					c.Noise = ptr(dev)
					if math.Abs(*c.Ratio-c.goal) < dev*c.goal {
						c.InNoise = true
						undecided = append(undecided, fmt.Sprintf("%s within ±%.1f%%", c.What, 100*dev))
					}
				}
			}
			if !c.InNoise {
				decidedMet = decidedMet || c.Met
				decidedMissed = decidedMissed || !c.Met
			}
		}
		switch {
		case g.anyOf && decidedMet, !g.anyOf && !decidedMissed && len(undecided) == 0:
			g.Status = StatusMet
		case g.anyOf && len(undecided) == 0, !g.anyOf && decidedMissed:
			g.Status = StatusMissed
		default:
			g.Status = StatusUndecided
		}
		if len(undecided) > 0 {
			g.Note = strings.TrimPrefix(g.Note+"; ", "; ") + "in this run's A/A noise (NOISE below), not decided: " + strings.Join(undecided, ", ")
		}
	}
}

// PrintNoise writes the A/A comparisons and the noise each unit of the goals is read
// against, when the run has an A/A pair.
func PrintNoise(w io.Writer, rows []Row) {
	checks := NoiseFloor(rows)
	if len(checks) == 0 {
		return
	}
	fmt.Fprintln(w, "NOISE (A/A): zc-copy-aa is zc-copy run again as a variant of its own (net-aa: the services' net, net-tls-aa: net-tls), at a position in each round that moves over the rounds; the ratio of the two, round by round:")
	for _, c := range checks {
		rs := make([]string, len(c.Rounds))
		for i, x := range c.Rounds {
			rs[i] = fmt.Sprintf("%.2f", x)
		}
		fmt.Fprintf(w, "       %s, %s: medians %.3f× (%s vs %s), rounds %s\n", c.What, c.Unit, *c.Ratio, fmtNum(*c.A), fmtNum(*c.B), strings.Join(rs, " "))
	}
	var units []string
	for _, u := range slices.Sorted(maps.Keys(noiseSources)) {
		if dev, ok := AANoise(rows, u); ok {
			units = append(units, fmt.Sprintf("%s ±%.1f%%", u, 100*dev))
		} else {
			units = append(units, u+" unmeasured")
		}
	}
	fmt.Fprintf(w, "       noise of this run (largest per-round deviation from 1): %s; a goal's check closer to its target than that is UNDECIDED\n", strings.Join(units, ", "))
}

// multiCoreGoal judges goal 3: with 512 connections, zc ≥ 2× net and ≥ 1.5× netpoll
// (msgs/s), and zc's default steering is the BPF CPU policy where BPF loads and says it
// hashes where it does not.
func multiCoreGoal(rows []Row, missing func(harness.Scenario, string) string) Goal {
	const name = "multi-core echo (server on 4 CPUs, 512 conns): zc ≥ 2× net and ≥ 1.5× netpoll (msgs/s), CPU-locality steering by default"
	z, n, np := Find(rows, harness.MultiCore, ZC, 64, 512), Find(rows, harness.MultiCore, "net", 64, 512),
		Find(rows, harness.MultiCore, Netpoll, 64, 512)
	switch {
	case z == nil || n == nil:
		return notRun(3, name, missing(harness.MultiCore, "multicore 512 conns of zc and net"))
	case np == nil:
		return notRun(3, name, "netpoll not measured")
	}
	checks := []Check{
		compare("zc / net", z, n, MsgsPerS, "msgs/s", 2.0, true),
		compare("zc / netpoll", z, np, MsgsPerS, "msgs/s", 1.5, true),
	}
	// zc's server notes how its listener steered: BPF with a policy, or the hash and
	// why (a fallback says BPF did not load).
	steer := notes(*z)["steering"]
	checks = append(checks, Check{What: "zc's default steering", Text: steer,
		Target: "bpf (cpu policy) where BPF loads, else hash (fallback: why)",
		Met:    strings.HasPrefix(steer, "bpf (cpu policy)") || strings.HasPrefix(steer, "hash (fallback")})
	note := fmt.Sprintf("RTT p99: zc %.0f µs, net %.0f µs, netpoll %.0f µs", z.Sum(P99).Median, n.Sum(P99).Median, np.Sum(P99).Median)
	if len(z.Reps) > 0 {
		if q := z.Reps[len(z.Reps)-1].Server.Notes["per_queue"]; q != "" {
			note += "; zc connections per queue: " + q
		}
	}
	var other []string
	for _, m := range []string{"zc-hash", "zc-cpu"} {
		if r := Find(rows, harness.MultiCore, m, 64, 512); r != nil {
			other = append(other, fmt.Sprintf("%s %.2f× net", m, r.Sum(MsgsPerS).Median/n.Sum(MsgsPerS).Median))
		}
	}
	if len(other) > 0 {
		note += "; " + strings.Join(other, ", ")
	}
	if cpus := z.Reps[0].Server.CPUs; len(cpus) != 4 {
		note += fmt.Sprintf("; the server had %d CPUs, not 4", len(cpus))
	}
	return verdict(3, name, checks, note)
}

// fmtCheck is one check on one line.
func fmtCheck(c Check) string {
	if c.Ratio == nil {
		st := "missed"
		if c.Met {
			st = "met"
		}
		return fmt.Sprintf("%s: %s (want %s): %s", c.What, c.Text, c.Target, st)
	}
	s := fmt.Sprintf("%s = %.3f×", c.What, *c.Ratio)
	if c.RoundMin != nil {
		s += fmt.Sprintf(" [rounds %.2f–%.2f]", *c.RoundMin, *c.RoundMax)
	}
	s += fmt.Sprintf(" (%s vs %s %s), want %s: ", fmtNum(*c.A), fmtNum(*c.B), c.Unit, c.Target)
	st := "missed"
	if c.Met {
		st = "met"
	}
	if c.InNoise {
		st += " (within the A/A noise)"
	}
	return s + st
}

func fmtNum(x float64) string {
	switch a := math.Abs(x); {
	case a >= 1000:
		return fmt.Sprintf("%.0f", x)
	case a >= 100:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.3g", x)
	}
}

// PrintGoals writes the verdicts, each with its checks.
func PrintGoals(w io.Writer, gs []Goal) {
	fmt.Fprintln(w, "GOALS (issue 10): ratios of medians measured side by side in this run; [rounds min–max] is the same ratio round by round")
	printGoals(w, gs)
}

func printGoals(w io.Writer, gs []Goal) {
	for _, g := range gs {
		fmt.Fprintf(w, "  %d. %s: %s\n", g.ID, g.Name, g.Status)
		for _, c := range g.Checks {
			fmt.Fprintf(w, "       %s\n", fmtCheck(c))
		}
		if g.Note != "" {
			fmt.Fprintf(w, "       (%s)\n", g.Note)
		}
	}
}

// Summary is the one-line tally of the verdicts: "MET 1, MISSED 3, NOT RUN 2".
func Summary(gs []Goal) string {
	n := map[string]int{}
	for _, g := range gs {
		n[strings.SplitN(g.Status, " (", 2)[0]]++
	}
	keys := slices.Sorted(maps.Keys(n))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, n[k])
	}
	return strings.Join(parts, ", ")
}
