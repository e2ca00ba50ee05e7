package report

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// The figures of the services suite.
var (
	// SrvCPUPerGB is the server's CPU seconds per GB the client verified.
	SrvCPUPerGB Figure = func(r harness.Rep) float64 { return r.SrvCPUPerGB }
)

// NetAA is net run again as a services variant of its own: the services' A/A pair
// (relay ×8 and key-value small), whose ratio to net is the noise the services goals
// are read against.
const NetAA = "net-aa"

// ZCStraight is the key-value server written the straightforward way with zc's event-loop
// API (values in Go memory sent with Conn.SendBytes), beside the tuned one (ZC).
const ZCStraight = "zc-straight"

// Units of the services goals, each measured by the services' A/A pair (noiseSources).
const (
	unitSrvUs   = "srv µs/unit"
	unitSrvSGB  = "srv s/GB"
	unitSvcGbps = "svc Gbit/s"
)

// The services' geometry the goals judge (zcbench plans the same).
var (
	RelayConns  = []int{8, 64}
	FanOutConns = []int{100, 1000}
	FanOutSizes = []int{64, 1 << 10}
	FileConns   = []int{1, 8, 32, 128}
	KVSizes     = []int{64, 100 << 10} // small values; the mix up to 100 KiB
	WrkSizes    = []int{64, 64 << 10}
	WrkConns    = []int{32, 512}
	// WrkLarge is one more wrk case: a 1 MiB body from memory on WrkLargeConns connections
	// (issue 29: the face's Write of a large slice sends from it, no staging copy).
	WrkLarge, WrkLargeConns = 1 << 20, 32
	MQConns                 = 512
	KVConns                 = 32
	ServiceFrame            = 64 << 10 // relay and file frames
)

// WrkCase is one wrk case: the body size and the connections.
type WrkCase struct{ Size, Conns int }

// WrkCases are the wrk scenario's cases: every WrkSizes × WrkConns, then WrkLarge.
func WrkCases() []WrkCase {
	var cs []WrkCase
	for _, size := range WrkSizes {
		for _, n := range WrkConns {
			cs = append(cs, WrkCase{size, n})
		}
	}
	return append(cs, WrkCase{WrkLarge, WrkLargeConns})
}

// kvName says which mix a key-value Size stands for.
func kvName(size int) string {
	if size == 64 {
		return "16–64 B"
	}
	return "mix ≤ 100 KiB"
}

// servicesTable prints the services suite, one section per scenario: server CPU per
// unit and throughput, with ratios against net.
func servicesTable(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, sc := range harness.ServiceScenarios {
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
		case harness.Relay, harness.RelayHalfClose:
			title := "RELAY (client → server relay → backend, both ways at once)"
			if sc == harness.RelayHalfClose {
				title = "RELAY, BACKEND HALF-CLOSES FIRST (answer, FIN, then the whole upload)"
			}
			fmt.Fprintln(tw, title+"\tconns\tGbit/s median [min–max]\t×net\trelay CPU s/GB\t×net\tlongest pause ms (all reps)\t")
		case harness.FanOut:
			fmt.Fprintln(tw, "FAN-OUT (1 publisher → N subscribers, 2% slow, drop at 64 KiB backlog)\tsize\tsubs\tdeliveries/s median [min–max]\t×net\tsrv CPU µs/delivery\t×net\tdropped (last rep)\t")
		case harness.FileStream:
			fmt.Fprintln(tw, "FILE STREAMING (page-cache file to N parallel clients)\tclients\tGbit/s median [min–max]\t×net\tsrv CPU s/GB\t×net\tlongest pause ms (all reps)\t")
		case harness.KV:
			fmt.Fprintln(tw, "KEY-VALUE (32 conns, 16 GET/SET pipelined)\tvalues\tops/s median [min–max]\t×net\tsrv CPU µs/op\t×net\tbatch RTT p99 µs\t")
		case harness.MultiQueue:
			fmt.Fprintln(tw, "MULTI-QUEUE, SHARED CPUS (server 2 queues, load on the same CPUs, 64 B echo)\tconns\tmsgs/s median [min–max]\t×net\t×netpoll\tsrv CPU µs/msg\t×net\t×netpoll\t")
		case harness.HTTPWrk:
			fmt.Fprintln(tw, "HTTP UNDER WRK (net/http GET, keep-alive)\tbody\tconns\treq/s median [min–max]\t×net\tsrv CPU µs/req\t×net\twrk p99 µs (last rep)\t")
		}
		for _, r := range rs {
			net := Find(rows, r.Scenario, "net", r.Size, r.Conns)
			switch sc {
			case harness.Relay, harness.RelayHalfClose:
				fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, r.Conns, spread(r.Sum(Gbps), "%.2f"), ratio(r.Sum(Gbps), sumOf(net, Gbps)),
					num(r.Sum(SrvCPUPerGB), "%.3f"), ratio(r.Sum(SrvCPUPerGB), sumOf(net, SrvCPUPerGB)), longestPause(r))
			case harness.FanOut:
				fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, SizeString(r.Size), r.Conns, spread(r.Sum(MsgsPerS), "%.0f"),
					ratio(r.Sum(MsgsPerS), sumOf(net, MsgsPerS)), num(r.Sum(SrvCPUPerMsg), "%.3f"), ratio(r.Sum(SrvCPUPerMsg), sumOf(net, SrvCPUPerMsg)), notes(r)["dropped"])
			case harness.FileStream:
				fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, r.Conns, spread(r.Sum(Gbps), "%.2f"), ratio(r.Sum(Gbps), sumOf(net, Gbps)),
					num(r.Sum(SrvCPUPerGB), "%.3f"), ratio(r.Sum(SrvCPUPerGB), sumOf(net, SrvCPUPerGB)), longestPause(r))
			case harness.KV:
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, kvName(r.Size), spread(r.Sum(MsgsPerS), "%.0f"), ratio(r.Sum(MsgsPerS), sumOf(net, MsgsPerS)),
					num(r.Sum(SrvCPUPerMsg), "%.3f"), ratio(r.Sum(SrvCPUPerMsg), sumOf(net, SrvCPUPerMsg)), num(r.Sum(P99), "%.0f"))
			case harness.MultiQueue:
				np := Find(rows, r.Scenario, Netpoll, r.Size, r.Conns)
				fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, r.Conns, spread(r.Sum(MsgsPerS), "%.0f"),
					ratio(r.Sum(MsgsPerS), sumOf(net, MsgsPerS)), ratio(r.Sum(MsgsPerS), sumOf(np, MsgsPerS)), num(r.Sum(SrvCPUPerMsg), "%.2f"),
					ratio(r.Sum(SrvCPUPerMsg), sumOf(net, SrvCPUPerMsg)), ratio(r.Sum(SrvCPUPerMsg), sumOf(np, SrvCPUPerMsg)))
			case harness.HTTPWrk:
				fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Mode, SizeString(r.Size), r.Conns, spread(r.Sum(MsgsPerS), "%.0f"),
					ratio(r.Sum(MsgsPerS), sumOf(net, MsgsPerS)), num(r.Sum(SrvCPUPerMsg), "%.2f"), ratio(r.Sum(SrvCPUPerMsg), sumOf(net, SrvCPUPerMsg)), notes(r)["client wrk_p99_us"])
			}
		}
		fmt.Fprintln(tw, "\t")
	}
	tw.Flush()
}

// longestPause is the longest wait for bytes in the middle of a stream that the
// client saw in any repetition (ms), as its note says: a stall shows there.
func longestPause(r Row) string {
	best := -1.0
	for _, rep := range r.Reps {
		if x, err := strconv.ParseFloat(rep.Client.Notes["longest_pause_ms"], 64); err == nil {
			best = max(best, x)
		}
	}
	if best < 0 {
		return "-"
	}
	return strconv.FormatFloat(best, 'f', 1, 64)
}

// ServiceGoals judges the goals of issue 20 (numbered 7–12, after issue 10's six) on the
// medians of one run, read against the services' A/A noise. A variant with repetitions
// that failed (a stall, lost bytes) is reported by zcbench as FAILED; the goals that need
// "every repetition completed" check it.
func ServiceGoals(rows []Row, skipped map[harness.Scenario]string) []Goal {
	missing := func(s harness.Scenario, what string) string {
		if why, ok := skipped[s]; ok {
			return why
		}
		return what + " not measured"
	}
	var gs []Goal
	// completed: zc ran as many repetitions as the most any variant of the scenario did
	// (a failed repetition, a stall or wrong bytes, is missing).
	completed := func(what string, s harness.Scenario, z *Row) Check {
		most := 0
		for _, r := range rows {
			if r.Scenario == s {
				most = max(most, len(r.Reps))
			}
		}
		return Check{What: what, Text: fmt.Sprintf("%d of %d repetitions completed", len(z.Reps), most),
			Target: "every repetition", Met: len(z.Reps) == most}
	}

	// 7. Relay.
	name := "relay: zc relay CPU s/GB ≤ 0.7× the Go io.Copy relay at ≥ 1.1× its Gbit/s (8 and 64 conns), half-close correct"
	var checks []Check
	why := ""
	for _, n := range RelayConns {
		z, nt := Find(rows, harness.Relay, ZC, ServiceFrame, n), Find(rows, harness.Relay, "net", ServiceFrame, n)
		if z == nil || nt == nil {
			why = missing(harness.Relay, fmt.Sprintf("relay ×%d of zc and net", n))
			break
		}
		checks = append(checks, compare(fmt.Sprintf("×%d CPU/GB: zc / net", n), z, nt, SrvCPUPerGB, unitSrvSGB, 0.7, false),
			compare(fmt.Sprintf("×%d Gbit/s: zc / net", n), z, nt, Gbps, unitSvcGbps, 1.1, true))
	}
	if why == "" {
		if z := Find(rows, harness.RelayHalfClose, ZC, ServiceFrame, 8); z == nil {
			why = missing(harness.RelayHalfClose, "relay-hc of zc")
		} else {
			checks = append(checks, completed("half-close ×8: every byte of the upload after the backend's FIN", harness.RelayHalfClose, z))
		}
	}
	gs = append(gs, goalOf(7, name, checks, why))

	// 8. Fan-out.
	name = "fan-out: zc server CPU per delivered message ≤ 0.6× net (1 → 100 and 1,000 subscribers, 64 B and 1 KiB)"
	checks, why = nil, ""
	for _, n := range FanOutConns {
		for _, size := range FanOutSizes {
			z, nt := Find(rows, harness.FanOut, ZC, size, n), Find(rows, harness.FanOut, "net", size, n)
			if z == nil || nt == nil {
				why = missing(harness.FanOut, fmt.Sprintf("fan-out %s ×%d of zc and net", SizeString(size), n))
				break
			}
			checks = append(checks, compare(fmt.Sprintf("%s ×%d: zc / net", SizeString(size), n), z, nt, SrvCPUPerMsg, unitSrvUs, 0.6, false))
		}
	}
	gs = append(gs, goalOf(8, name, checks, why))

	// 9. File streaming.
	name = "file streaming: zc ≥ 1.3× net's Gbit/s at ≤ 0.7× its CPU s/GB at 1, 8, 32 and 128 clients, no stall"
	checks, why = nil, ""
	for _, n := range FileConns {
		z, nt := Find(rows, harness.FileStream, ZC, ServiceFrame, n), Find(rows, harness.FileStream, "net", ServiceFrame, n)
		if z == nil || nt == nil {
			why = missing(harness.FileStream, fmt.Sprintf("files ×%d of zc and net", n))
			break
		}
		checks = append(checks, compare(fmt.Sprintf("×%d Gbit/s: zc / net", n), z, nt, Gbps, unitSvcGbps, 1.3, true),
			compare(fmt.Sprintf("×%d CPU/GB: zc / net", n), z, nt, SrvCPUPerGB, unitSrvSGB, 0.7, false),
			completed(fmt.Sprintf("×%d no stall", n), harness.FileStream, z))
	}
	gs = append(gs, goalOf(9, name, checks, why))

	// 10. Key-value (issue 29's form: both zc servers, the tuned one and the
	// straightforward one that sends values from Go memory with SendBytes).
	name = "key-value: server CPU per op of both zc servers (tuned, straightforward) ≤ 0.7× net with 16–64 B values, ≤ 0.8× with the mix to 100 KiB (32 conns × 16 pipelined)"
	checks, why = nil, ""
kv:
	for _, size := range KVSizes {
		target := 0.7
		if size != 64 {
			target = 0.8
		}
		for _, mode := range []string{ZC, ZCStraight} {
			z, nt := Find(rows, harness.KV, mode, size, KVConns), Find(rows, harness.KV, "net", size, KVConns)
			if z == nil || nt == nil {
				why = missing(harness.KV, "key-value "+kvName(size)+" of "+mode+" and net")
				break kv
			}
			checks = append(checks, compare(kvName(size)+": "+mode+" / net", z, nt, SrvCPUPerMsg, unitSrvUs, target, false))
		}
	}
	gs = append(gs, goalOf(10, name, checks, why))

	// 11. Multi-queue on shared CPUs.
	name = "multi-queue, shared CPUs (2 queues, 512 conns, 64 B): zc server CPU per request ≤ 0.7× net and ≤ 0.8× netpoll"
	z, nt, np := Find(rows, harness.MultiQueue, ZC, 64, MQConns), Find(rows, harness.MultiQueue, "net", 64, MQConns), Find(rows, harness.MultiQueue, Netpoll, 64, MQConns)
	switch {
	case z == nil || nt == nil || np == nil:
		gs = append(gs, notRun(11, name, missing(harness.MultiQueue, "mq of zc, net and netpoll")))
	default:
		gs = append(gs, verdict(11, name, []Check{
			compare("zc / net", z, nt, SrvCPUPerMsg, unitSrvUs, 0.7, false),
			compare("zc / netpoll", z, np, SrvCPUPerMsg, unitSrvUs, 0.8, false),
		}, fmt.Sprintf("msgs/s: zc %.2f× net, %.2f× netpoll", z.Sum(MsgsPerS).Median/nt.Sum(MsgsPerS).Median, z.Sum(MsgsPerS).Median/np.Sum(MsgsPerS).Median)))
	}

	// 12. HTTP under wrk.
	name = "HTTP under wrk: net/http on netconn.Listen server CPU per request ≤ 0.9× on Go net (64 B and 64 KiB, 32 and 512 conns; 1 MiB ×32)"
	checks, why = nil, ""
	for _, wc := range WrkCases() {
		size, n := wc.Size, wc.Conns
		z, nt := Find(rows, harness.HTTPWrk, ZCNet, size, n), Find(rows, harness.HTTPWrk, "net", size, n)
		if z == nil || nt == nil {
			why = missing(harness.HTTPWrk, fmt.Sprintf("wrk %s ×%d of zc-net and net", SizeString(size), n))
			break
		}
		checks = append(checks, compare(fmt.Sprintf("%s ×%d: zc-net / net", SizeString(size), n), z, nt, SrvCPUPerMsg, unitSrvUs, 0.9, false))
	}
	gs = append(gs, goalOf(12, name, checks, why))
	applyNoise(gs, rows)
	return gs
}

// goalOf is goal id's verdict on checks, or NOT RUN with why when a case was not measured.
func goalOf(id int, name string, checks []Check, why string) Goal {
	if why != "" {
		return notRun(id, name, why)
	}
	return verdict(id, name, checks, "")
}

// PrintServiceGoals writes the verdicts of issue 20's goals.
func PrintServiceGoals(w io.Writer, gs []Goal) {
	fmt.Fprintln(w, "GOALS (issue 20, services): ratios of medians measured side by side in this run, read against the services' A/A noise (net-aa / net)")
	printGoals(w, gs)
}
