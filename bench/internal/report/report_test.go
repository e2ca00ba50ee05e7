package report

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

func nanRep(round int) harness.Rep {
	n := math.NaN()
	return harness.Rep{Gbps: n, MsgsPerS: n, P50us: n, P99us: n, P999us: n, CPUSndPerGB: n, CPURcvPerGB: n,
		CPUusPerMsg: n, SrvCPUusPerMsg: n, IdleBytesPerConn: n, IdlePinned: n, Round: round}
}

// bulk is a bulk row with one repetition per Gbit/s figure (round = position); CPU per
// GB is 1.5/Gbit/s (sender 1, receiver 0.5).
func bulk(mode string, size int, gbps ...float64) Row {
	return oneWay(harness.Bulk, mode, size, gbps...)
}

func oneWay(s harness.Scenario, mode string, size int, gbps ...float64) Row {
	r := Row{Variant: harness.Variant{Scenario: s, Mode: mode, Size: size, Conns: 1}}
	for i, g := range gbps {
		rep := nanRep(i)
		rep.Gbps, rep.MsgsPerS, rep.CPUSndPerGB, rep.CPURcvPerGB = g, g*1e9/8/float64(size), 1/g, 0.5/g
		rep.ZCBytes, rep.CopiedBytes = 10, 5
		r.Reps = append(r.Reps, rep)
	}
	return r
}

// rr is a request/response row with one repetition per msgs/s figure; p99 as given.
func rr(s harness.Scenario, mode string, size, conns int, p99 float64, msgs ...float64) Row {
	r := Row{Variant: harness.Variant{Scenario: s, Mode: mode, Size: size, Conns: conns}}
	for i, m := range msgs {
		rep := nanRep(i)
		rep.MsgsPerS, rep.P50us, rep.P99us, rep.P999us, rep.CPUusPerMsg, rep.SrvCPUusPerMsg = m, p99/2, p99, p99*2, 3, 1
		r.Reps = append(r.Reps, rep)
	}
	return r
}

func idle(mode string, conns int, perConn float64) Row {
	r := Row{Variant: harness.Variant{Scenario: harness.Idle, Mode: mode, Size: 64, Conns: conns}}
	rep := nanRep(0)
	rep.IdleConns, rep.IdleBytesPerConn, rep.IdlePinned = conns, perConn, 32<<20
	rep.Server.RSSBefore, rep.Server.RSSAfter = 10<<20, 10<<20+uint64(perConn*float64(conns))
	r.Reps = append(r.Reps, rep)
	return r
}

func withSteering(r Row, steering string) Row {
	for i := range r.Reps {
		r.Reps[i].Server.Notes = map[string]string{"steering": steering, "per_queue": "q0:128 q1:128 q2:128 q3:128"}
		r.Reps[i].Server.CPUs = []int{0, 1, 2, 3}
	}
	return r
}

// The JSON document: the run, the results with the fields the issues list (null where
// a figure does not apply), the goals.
func TestJSONDocument(t *testing.T) {
	rows := []Row{bulk("net", 65536, 10, 12, 11), rr(harness.PingPong, "net", 64, 1, 50, 1000), idle("zc", 100, 2048)}
	path := filepath.Join(t.TempDir(), "r.json")
	run := RunInfo{Title: "test", Reps: 3, Skipped: map[string]string{"multicore": "needs ≥ 4 CPUs"}}
	if err := WriteJSON(path, run, rows, Goals(rows, nil)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Run     map[string]any   `json:"run"`
		Results []map[string]any `json:"results"`
		Goals   []map[string]any `json:"goals"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Run["title"] != "test" || doc.Run["skipped"].(map[string]any)["multicore"] != "needs ≥ 4 CPUs" {
		t.Errorf("run = %v", doc.Run)
	}
	if len(doc.Results) != 3 || len(doc.Goals) != 6 {
		t.Fatalf("%d results, %d goals", len(doc.Results), len(doc.Goals))
	}
	required := []string{"scenario", "mode", "size", "conns", "reps", "gbps", "msgs_per_s", "p50_us", "p99_us",
		"p999_us", "cpu_s_per_gb", "min", "max", "zc_bytes", "copied_bytes"}
	extras := []string{"headline", "cpu_snd_s_per_gb", "cpu_rcv_s_per_gb", "cpu_us_per_msg", "srv_cpu_us_per_msg",
		"srv_cpu_s_per_gb", "headline_reps", "rx_mapped_bytes", "rx_copied_bytes", "idle_bytes_per_conn", "rss_before_bytes",
		"rss_after_bytes", "pinned_bytes", "notes"}
	for _, o := range doc.Results {
		for _, k := range required {
			if _, ok := o[k]; !ok {
				t.Errorf("field %q missing in %v", k, o)
			}
		}
		for k := range o {
			if !slices.Contains(required, k) && !slices.Contains(extras, k) {
				t.Errorf("undocumented field %q", k)
			}
		}
	}
	b0, p1, i2 := doc.Results[0], doc.Results[1], doc.Results[2]
	want := map[string]any{"scenario": "bulk", "mode": "net", "size": 65536.0, "conns": 1.0, "reps": 3.0,
		"gbps": 11.0, "min": 10.0, "max": 12.0, "p99_us": nil, "zc_bytes": 30.0, "copied_bytes": 15.0, "headline": "gbps",
		"idle_bytes_per_conn": nil}
	for k, v := range want {
		if b0[k] != v {
			t.Errorf("bulk %s = %v, want %v", k, b0[k], v)
		}
	}
	if cpu := b0["cpu_s_per_gb"].(float64); math.Abs(cpu-1.5/11) > 1e-9 {
		t.Errorf("cpu_s_per_gb = %v, want the median of snd+rcv", cpu)
	}
	want = map[string]any{"scenario": "pingpong", "gbps": nil, "cpu_s_per_gb": nil, "p99_us": 50.0, "p50_us": 25.0,
		"p999_us": 100.0, "min": 50.0, "max": 50.0, "headline": "p99_us", "srv_cpu_us_per_msg": 1.0}
	for k, v := range want {
		if p1[k] != v {
			t.Errorf("pingpong %s = %v, want %v", k, p1[k], v)
		}
	}
	want = map[string]any{"scenario": "idle", "headline": "idle_bytes_per_conn", "idle_bytes_per_conn": 2048.0,
		"pinned_bytes": float64(32 << 20), "rss_before_bytes": float64(10 << 20), "msgs_per_s": nil, "min": 2048.0}
	for k, v := range want {
		if i2[k] != v {
			t.Errorf("idle %s = %v, want %v", k, i2[k], v)
		}
	}
	g := doc.Goals[3] // ping-pong: zc not measured
	if g["id"] != 4.0 || !strings.HasPrefix(g["status"].(string), "NOT RUN") {
		t.Errorf("goal 4 = %v", g)
	}
}

func goalByID(t *testing.T, gs []Goal, id int) Goal {
	t.Helper()
	for _, g := range gs {
		if g.ID == id {
			return g
		}
	}
	t.Fatalf("goal %d missing", id)
	return Goal{}
}

// With nothing of zc measured every goal is NOT RUN, and the multi-core goal says why
// this machine did not run it.
func TestGoalsNotRun(t *testing.T) {
	rows := []Row{bulk("net", 65536, 10), bulk("iperf3", 65536, 5)}
	gs := Goals(rows, map[harness.Scenario]string{harness.MultiCore: "needs ≥ 4 CPUs (this machine lets zcbench use 2)"})
	if len(gs) != 6 {
		t.Fatalf("%d goals, want 6", len(gs))
	}
	for _, g := range gs {
		if !strings.HasPrefix(g.Status, StatusNotRun+" (") {
			t.Errorf("goal %d: %q", g.ID, g.Status)
		}
	}
	if s := goalByID(t, gs, 3).Status; s != "NOT RUN (needs ≥ 4 CPUs (this machine lets zcbench use 2))" {
		t.Errorf("goal 3: %q", s)
	}
	// Multi-core measured but netpoll missing: still NOT RUN, never MET.
	rows = append(rows, withSteering(rr(harness.MultiCore, ZC, 64, 512, 100, 900), "bpf (cpu policy)"),
		rr(harness.MultiCore, "net", 64, 512, 100, 100))
	if s := goalByID(t, Goals(rows, nil), 3).Status; s != "NOT RUN (netpoll not measured)" {
		t.Errorf("goal 3 without netpoll: %q", s)
	}
	// A missing bulk size keeps goals 1 and 6 from being judged on the others.
	rows = []Row{bulk(ZC, 4096, 5), bulk(ZCCopy, 4096, 5), bulk(ZC, 65536, 5), bulk(ZCCopy, 65536, 5)}
	gs = Goals(rows, nil)
	for _, id := range []int{1, 6} {
		if s := goalByID(t, gs, id).Status; !strings.Contains(s, "1 MiB") || !strings.HasPrefix(s, StatusNotRun) {
			t.Errorf("goal %d: %q", id, s)
		}
	}
}

func TestGoalsJudged(t *testing.T) {
	const k4, k64, m1 = 4 << 10, 64 << 10, 1 << 20
	rows := []Row{
		// 1: zc/best 0.95 at 4 KiB (iperf3 best), 1.0 at 64 KiB (zc best), 0.5 at 1 MiB.
		bulk("net", k4, 9, 9), bulk("iperf3", k4, 10, 10), bulk(ZC, k4, 9.5, 9.5), bulk(ZCCopy, k4, 10, 10),
		bulk("net", k64, 20, 20), bulk(ZC, k64, 25, 30), bulk(ZCCopy, k64, 20, 20),
		bulk("net", m1, 40, 40), bulk(ZC, m1, 20, 20), bulk(ZCCopy, m1, 20, 20),
		// 3: zc 2.5× net, 1.4× netpoll.
		withSteering(rr(harness.MultiCore, ZC, 64, 512, 300, 250, 250), "bpf (cpu policy)"),
		rr(harness.MultiCore, "net", 64, 512, 600, 100, 100), rr(harness.MultiCore, Netpoll, 64, 512, 400, 180, 180),
		// 4: p99 0.8× net exactly.
		rr(harness.PingPong, "net", 64, 1, 100, 1000), rr(harness.PingPong, ZC, 64, 1, 80, 1000),
		// 5: HTTP 1.1×, file send 0.9×.
		rr(harness.HTTP, "net", 64, 32, 100, 1000), rr(harness.HTTP, ZCNet, 64, 32, 100, 1100),
		oneWay(harness.FileSend, "net", k64, 10), oneWay(harness.FileSend, ZCNet, k64, 9),
		// A/A pairs that never moved: no check is within the noise.
		bulk(ZCCopyAA, k4, 10, 10), bulk(ZCCopyAA, k64, 20, 20), bulk(ZCCopyAA, m1, 20, 20),
		rr(harness.Echo, ZCCopy, 64, 64, 100, 1000, 1000), rr(harness.Echo, ZCCopyAA, 64, 64, 100, 1000, 1000),
		rr(harness.PingPong, ZCCopy, 64, 1, 100, 1000), rr(harness.PingPong, ZCCopyAA, 64, 1, 100, 1000),
	}
	gs := Goals(rows, nil)
	for id, want := range map[int]string{1: StatusMissed, 2: StatusMet, 3: StatusMissed, 4: StatusMet, 5: StatusMissed, 6: StatusMissed} {
		if g := goalByID(t, gs, id); g.Status != want {
			t.Errorf("goal %d: %s, want %s: %+v", id, g.Status, want, g.Checks)
		}
	}
	g1 := goalByID(t, gs, 1)
	if len(g1.Checks) != 3 || !g1.Checks[0].Met || !strings.Contains(g1.Checks[0].What, "iperf3") ||
		!strings.Contains(g1.Checks[1].What, "zc (best)") || g1.Checks[2].Met || *g1.Checks[2].Ratio != 0.5 {
		t.Errorf("goal 1 checks: %+v", g1.Checks)
	}
	// 2: zc's CPU/GB is the median of 1.5/25 and 1.5/30 against 1.5/20; the per-round
	// ratios are 20/25 and 20/30.
	c2 := goalByID(t, gs, 2).Checks[0]
	if math.Abs(*c2.Ratio-(0.06+0.05)/2/0.075) > 1e-9 || math.Abs(*c2.RoundMin-20.0/30) > 1e-9 || math.Abs(*c2.RoundMax-20.0/25) > 1e-9 {
		t.Errorf("goal 2: ratio %v, rounds %v–%v", *c2.Ratio, *c2.RoundMin, *c2.RoundMax)
	}
	g3 := goalByID(t, gs, 3)
	if len(g3.Checks) != 3 || !g3.Checks[0].Met || g3.Checks[1].Met || !g3.Checks[2].Met ||
		!strings.Contains(g3.Note, "p99: zc 300 µs, net 600 µs, netpoll 400 µs") {
		t.Errorf("goal 3: %+v %q", g3.Checks, g3.Note)
	}
	g6 := goalByID(t, gs, 6)
	if len(g6.Checks) != 3 || g6.Checks[0].Met || !g6.Checks[1].Met || !g6.Checks[2].Met {
		t.Errorf("goal 6 checks: %+v", g6.Checks)
	}
	// Steering that is neither the CPU policy nor a visible fallback misses goal 3.
	rows[10] = withSteering(rr(harness.MultiCore, ZC, 64, 512, 300, 900, 900), "bpf (hash policy)")
	g3 = goalByID(t, Goals(rows, nil), 3)
	if g3.Status != StatusMissed || !g3.Checks[0].Met || !g3.Checks[1].Met || g3.Checks[2].Met {
		t.Errorf("goal 3 with hash policy: %s %+v", g3.Status, g3.Checks)
	}
	rows[10] = withSteering(rr(harness.MultiCore, ZC, 64, 512, 300, 900, 900), "hash (fallback: not root)")
	if g := goalByID(t, Goals(rows, nil), 3); g.Status != StatusMet {
		t.Errorf("goal 3 with a visible fallback: %s %+v", g.Status, g.Checks)
	}

	var sb strings.Builder
	PrintGoals(&sb, gs)
	out := sb.String()
	for _, s := range []string{"1. bulk", ": MISSED", ": MET", "4 KiB: zc / iperf3 (best) = 0.950× [rounds 0.95–0.95] (9.5 vs 10 Gbit/s), want ≥ 0.9: met",
		"zc's default steering: bpf (cpu policy)"} {
		if !strings.Contains(out, s) {
			t.Errorf("goals output lacks %q:\n%s", s, out)
		}
	}
	if got := Summary(gs); got != "MET 2, MISSED 4" {
		t.Errorf("Summary = %q", got)
	}
}

// Round pairing: a repetition missing in one row leaves that round out.
func TestRoundRatios(t *testing.T) {
	a, b := bulk("a", 4096, 10, 20, 30), bulk("b", 4096, 10, 10, 10)
	b.Reps = slices.Delete(b.Reps, 2, 3)
	lo, hi, ok := roundRatios(&a, &b, Gbps)
	if !ok || lo != 1 || hi != 2 {
		t.Errorf("rounds %v–%v %v, want 1–2", lo, hi, ok)
	}
	if _, _, ok := roundRatios(&a, &Row{}, Gbps); ok {
		t.Error("ratios from an empty row")
	}
}

func TestTableAndPNG(t *testing.T) {
	rows := []Row{
		bulk("net", 4096, 3, 4), bulk("syscall", 4096, 3), bulk("net", 65536, 10, 11, 12), bulk("syscall", 65536, 9),
		rr(harness.Echo, "net", 64, 64, 100, 1000), rr(harness.PingPong, "net", 64, 1, 50, 1000),
		rr(harness.PingPong, "syscall", 64, 1, 40, 900), rr(harness.Stream, "net", 64, 1, math.NaN(), 5000),
		rr(harness.MultiCore, "net", 64, 512, 100, 2000), withSteering(rr(harness.MultiCore, ZC, 64, 512, 100, 5000), "bpf (cpu policy)"),
		rr(harness.MultiCore, Netpoll, 64, 512, 100, 2500),
		rr(harness.HTTP, "net", 64, 32, 500, 20000), oneWay(harness.FileSend, "net", 65536, 17),
		idle("net", 10000, 6000), idle(ZC, 10000, 1500),
	}
	var sb strings.Builder
	Table(&sb, rows)
	out := sb.String()
	for _, s := range []string{"BULK", "ECHO", "PING-PONG", "SMALL-MESSAGE STREAM (net: 4 KiB bufio.Writer, net-buf: 1 MiB)", "11.00 [10.00–12.00]", "0.80", "0.82",
		"MULTI-CORE", "2.50  2.00", "bpf (cpu policy)", "HTTP", "FILE SEND", "IDLE CONNECTIONS", "6000 [6000–6000]", "0.25", "32.0"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
	path := filepath.Join(t.TempDir(), "p.png")
	if err := WritePNG(path, rows, "test"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 1000 || string(b[1:4]) != "PNG" {
		t.Fatalf("PNG: %d bytes, %v", len(b), err)
	}
	if err := WritePNG(path, nil, "empty"); err == nil {
		t.Error("a PNG without data")
	}
}

// Every tick marker labels at least two values of any sensible range.
func TestTicks(t *testing.T) {
	for _, r := range [][2]float64{{0, 1}, {0, 27}, {0, 4.3}, {0, 180000}, {10, 35}} {
		n := 0
		for _, tk := range (linTicks{}).Ticks(r[0], r[1]) {
			if tk.Label != "" {
				n++
			}
		}
		if n < 3 || n > 12 {
			t.Errorf("linear %v: %d labels", r, n)
		}
	}
	for _, r := range [][2]float64{{40, 2000}, {12000, 35000}, {60, 90}, {15000, 1.2e7}} {
		n := 0
		for _, tk := range (logTicks{}).Ticks(r[0], r[1]) {
			if tk.Label != "" {
				n++
			}
		}
		if n < 2 {
			t.Errorf("log %v: %d labels", r, n)
		}
	}
	for v, want := range map[float64]string{0: "0", 2.5: "2.5", 150: "150", 25000: "25k", 1.5e6: "1.5M", 2e6: "2M", 0.25: "0.25"} {
		if got := human(v); got != want {
			t.Errorf("human(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestSizeString(t *testing.T) {
	for n, want := range map[int]string{64: "64 B", 1024: "1 KiB", 4096: "4 KiB", 65536: "64 KiB", 1 << 20: "1 MiB", 1 << 30: "1 GiB", 1500: "1500 B"} {
		if got := SizeString(n); got != want {
			t.Errorf("SizeString(%d) = %q, want %q", n, got, want)
		}
	}
}

// The A/A pairs: the largest per-round deviation of a pair (not its ratio of medians)
// is the noise of its unit; a goal check closer to its target than that is UNDECIDED, as
// is one whose unit no pair measured; the A/A copy never counts as the best mode of goal
// 1; everything is printed and written to JSON.
func TestNoiseFloor(t *testing.T) {
	var rows []Row
	for _, size := range bulkSizes {
		rows = append(rows, bulk("net", size, 10, 10, 10), bulk(ZCCopy, size, 10, 10, 10),
			bulk(ZC, size, 9.7, 9.7, 9.7)) // zc / zc-copy = 0.97: missed by 1%
	}
	if checks := NoiseFloor(rows); len(checks) != 0 {
		t.Fatalf("no A/A rows: %d checks", len(checks))
	}
	if _, ok := AANoise(rows, "Gbit/s"); ok {
		t.Fatal("noise without an A/A pair")
	}
	g6 := goalByID(t, Goals(rows, nil), 6)
	if g6.Status != StatusUndecided || !g6.Checks[0].InNoise || !strings.Contains(g6.Note, "no A/A measure of Gbit/s") {
		t.Fatalf("goal 6 without A/A: %s %+v %q", g6.Status, g6.Checks, g6.Note)
	}

	// The pair's medians agree at 64 KiB, but its rounds moved 5% either way (and the copy
	// is the fastest there in round 0: never goal 1's best).
	rows = append(rows, bulk(ZCCopyAA, 4096, 10, 10, 10), bulk(ZCCopyAA, 65536, 10.5, 9.5, 10))
	checks := NoiseFloor(rows)
	if len(checks) != 4 || math.Abs(*checks[2].Ratio-1) > 1e-9 || len(checks[2].Rounds) != 3 || checks[3].Unit != "CPU s/GB" {
		t.Fatalf("A/A checks: %+v", checks)
	}
	if dev, ok := AANoise(rows, "Gbit/s"); !ok || math.Abs(dev-0.05) > 1e-9 {
		t.Fatalf("Gbit/s noise %v %v, want 0.05", dev, ok)
	}
	gs := Goals(rows, nil)
	g6 = goalByID(t, gs, 6)
	if g6.Status != StatusUndecided || !g6.Checks[0].InNoise || g6.Checks[0].Noise == nil || !strings.Contains(g6.Note, "within ±5.0%") {
		t.Errorf("goal 6 with A/A: %s %+v %q", g6.Status, g6.Checks, g6.Note)
	}
	g1 := goalByID(t, gs, 1)
	if strings.Contains(g1.Checks[1].What, ZCCopyAA) {
		t.Errorf("goal 1 at 64 KiB compared against %q", g1.Checks[1].What)
	}
	// Goal 1 (0.97 against 0.9) is outside the noise: decided, no note.
	if g1.Status != StatusMet || g1.Note != "" || g1.Checks[0].InNoise {
		t.Errorf("goal 1: %s %q %+v", g1.Status, g1.Note, g1.Checks)
	}
	// A decided miss outweighs an undecided check: zc at 0.5 of zc-copy at 1 MiB.
	rows[8] = bulk(ZC, 1<<20, 5, 5, 5)
	if g := goalByID(t, Goals(rows, nil), 6); g.Status != StatusMissed {
		t.Errorf("goal 6 with a clear miss: %s", g.Status)
	}
	rows[8] = bulk(ZC, 1<<20, 9.7, 9.7, 9.7)

	var sb strings.Builder
	PrintGoals(&sb, gs)
	PrintNoise(&sb, rows)
	out := sb.String()
	for _, s := range []string{"6. adaptive", ": UNDECIDED", "want ≥ 0.98: missed (within the A/A noise)", "NOISE (A/A):",
		"bulk 64 KiB: zc-copy-aa / zc-copy, Gbit/s: medians 1.000× (10 vs 10), rounds 1.05 0.95 1.00",
		"Gbit/s ±5.0%", "µs unmeasured"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
	if got := Summary(gs); !strings.Contains(got, "UNDECIDED") {
		t.Errorf("Summary = %q", got)
	}
	path := filepath.Join(t.TempDir(), "b.json")
	if err := WriteJSON(path, RunInfo{}, rows, gs); err != nil {
		t.Fatal(err)
	}
	var doc Document
	if b, err := os.ReadFile(path); err != nil || json.Unmarshal(b, &doc) != nil {
		t.Fatalf("read back: %v", err)
	}
	if len(doc.Noise) != 4 || len(doc.Noise[2].Rounds) != 3 || !goalByID(t, doc.Goals, 6).Checks[0].InNoise {
		t.Errorf("JSON: noise %+v, goal 6 %+v", doc.Noise, goalByID(t, doc.Goals, 6))
	}

	// zc the fastest at 4 KiB: goal 1 compares zc with itself there, an exact 1.0, never
	// "within the noise"; 0.91 of the best at 1 MiB is.
	rows[2] = bulk(ZC, 4096, 11, 11, 11)
	rows[8] = bulk(ZC, 1<<20, 9.1, 9.1, 9.1)
	g1 = goalByID(t, Goals(rows, nil), 1)
	if g1.Checks[0].What != "4 KiB: zc / zc (best)" || g1.Checks[0].InNoise || !g1.Checks[2].InNoise || g1.Status != StatusUndecided {
		t.Errorf("goal 1, zc best at 4 KiB: %s %+v %q", g1.Status, g1.Checks, g1.Note)
	}

	// Goal 4 is met by either configuration: a clear meet of the busy poll decides it even
	// when the default lies within the noise; the p99 noise comes from the ping-pong pair.
	pp := []Row{rr(harness.PingPong, "net", 64, 1, 100, 1000), rr(harness.PingPong, ZC, 64, 1, 82, 1000),
		rr(harness.PingPong, ZCBusy, 64, 1, 30, 1000),
		rr(harness.PingPong, ZCCopy, 64, 1, 100, 1000), rr(harness.PingPong, ZCCopyAA, 64, 1, 110, 1000)}
	g4 := goalByID(t, Goals(pp, nil), 4)
	if g4.Status != StatusMet || !g4.Checks[0].InNoise || g4.Checks[1].InNoise {
		t.Errorf("goal 4: %s %+v", g4.Status, g4.Checks)
	}
	pp[2] = rr(harness.PingPong, ZCBusy, 64, 1, 85, 1000)
	if g4 = goalByID(t, Goals(pp, nil), 4); g4.Status != StatusUndecided {
		t.Errorf("goal 4, both within the noise: %s %+v", g4.Status, g4.Checks)
	}
	pp[1], pp[2] = rr(harness.PingPong, ZC, 64, 1, 150, 1000), rr(harness.PingPong, ZCBusy, 64, 1, 150, 1000)
	if g4 = goalByID(t, Goals(pp, nil), 4); g4.Status != StatusMissed {
		t.Errorf("goal 4, both clearly missed: %s %+v", g4.Status, g4.Checks)
	}
}

// The buffered baseline: goal 2 compares zc's CPU per GB with the stronger (lower) of net
// and net-buf, and the bulk and stream tables show zc against both.
func TestBufferedBaseline(t *testing.T) {
	const k64 = 64 << 10
	rows := []Row{bulk("net", k64, 10, 10), bulk(NetBuf, k64, 20, 20), bulk(ZC, k64, 25, 25),
		bulk(ZCCopy, k64, 20, 20), bulk(ZCCopyAA, k64, 20, 20),
		oneWay(harness.Stream, "net", 64, 1, 1), oneWay(harness.Stream, NetBuf, 64, 2, 2), oneWay(harness.Stream, ZC, 64, 4, 4)}
	g2 := goalByID(t, Goals(rows, nil), 2)
	// zc 1.5/25 against net-buf's 1.5/20 (net's 1.5/10 is weaker): 0.8, met.
	if g2.Checks[0].What != "zc / net-buf" || math.Abs(*g2.Checks[0].Ratio-0.8) > 1e-9 || g2.Status != StatusMet ||
		!strings.Contains(g2.Note, "net 0.150, net-buf 0.075") {
		t.Errorf("goal 2: %s %+v %q", g2.Status, g2.Checks, g2.Note)
	}
	rows[1] = bulk(NetBuf, k64, 5, 5) // net-buf weaker than net: net is the baseline
	if g2 = goalByID(t, Goals(rows, nil), 2); g2.Checks[0].What != "zc / net" {
		t.Errorf("goal 2 with a weaker net-buf: %+v", g2.Checks)
	}
	rows[1] = bulk(NetBuf, k64, 20, 20)
	var sb strings.Builder
	Table(&sb, rows)
	out := sb.String()
	for _, re := range []string{`×net-buf`, `(?m)^\s+zc\s+64 KiB\s+25\.00 \[25\.00–25\.00\]\s+2\.50\s+1\.25\s`, `(?m)^\s+zc\s+64 B\s+\S+ \[\S+\]\s+4\.00\s+2\.00\s`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("table does not match %s:\n%s", re, out)
		}
	}
}

// A check whose own rounds fall on both sides of its target is UNDECIDED even where the
// run's A/A pair was quiet (session 9's wrk check was "met" at 0.80× with rounds 0.80–1.19,
// then 1.125× in the next run); rounds all on one side decide it.
func TestRoundsStraddlingTargetUndecided(t *testing.T) {
	rows := []Row{bulk(ZCCopy, 65536, 10, 10, 10), bulk(ZCCopyAA, 65536, 10, 10, 10)}
	check := func(lo, hi float64) Goal {
		c := Check{What: "x / net", Ratio: ptr(0.85), RoundMin: ptr(lo), RoundMax: ptr(hi), Unit: "Gbit/s",
			Target: "≥ 0.8", Met: true, goal: 0.8}
		gs := []Goal{{ID: 1, Name: "g", Status: StatusMet, Checks: []Check{c}}}
		applyNoise(gs, rows)
		return gs[0]
	}
	if g := check(0.70, 0.95); g.Status != StatusUndecided || !g.Checks[0].InNoise || !strings.Contains(g.Note, "rounds 0.70–0.95 straddle the target") {
		t.Errorf("straddling rounds: %s %q", g.Status, g.Note)
	}
	if g := check(0.82, 0.95); g.Status != StatusMet || g.Checks[0].InNoise {
		t.Errorf("rounds all above the target: %s %q", g.Status, g.Note)
	}
}
