package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/bench/internal/services"
)

func TestMain(m *testing.M) {
	if harness.IsChild(os.Args) {
		os.Exit(harness.ChildMain(os.Args[1:], allModes(), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestTinyRun(t *testing.T) {
	dir := t.TempDir()
	jsonPath, pngPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.png")
	var out, errs strings.Builder
	code := run([]string{"-reps", "1", "-d", "30ms", "-modes", "net,syscall", "-scenarios", "bulk,pingpong",
		"-json", jsonPath, "-png", pngPath}, &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errs.String())
	}
	for _, s := range []string{"BULK", "PING-PONG", "GOALS (issue 10)", "NOT RUN (zc bulk 4 KiB not measured)",
		"GOAL (issue 30, against the limit)", "13. against the limit", "NOT RUN (c-uring not measured",
		"NOT RUN (multicore 512 conns of zc and net not measured)"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []struct {
			Scenario string   `json:"scenario"`
			Mode     string   `json:"mode"`
			Reps     int      `json:"reps"`
			Gbps     *float64 `json:"gbps"`
			P99      *float64 `json:"p99_us"`
		} `json:"results"`
		Goals []struct {
			ID     int    `json:"id"`
			Status string `json:"status"`
		} `json:"goals"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	res := doc.Results
	if len(doc.Goals) != 13 || doc.Goals[0].ID != 1 || !strings.HasPrefix(doc.Goals[0].Status, "NOT RUN") ||
		doc.Goals[6].ID != 7 || !strings.HasPrefix(doc.Goals[11].Status, "NOT RUN") ||
		doc.Goals[12].ID != 13 || !strings.HasPrefix(doc.Goals[12].Status, "NOT RUN") {
		t.Errorf("goals: %+v", doc.Goals)
	}
	// bulk: 3 sizes × 2 modes; pingpong: 2 modes.
	if len(res) != 8 {
		t.Fatalf("%d results, want 8", len(res))
	}
	for _, r := range res {
		if r.Reps != 1 {
			t.Errorf("%s %s: %d reps", r.Scenario, r.Mode, r.Reps)
		}
		if r.Scenario == "bulk" && (r.Gbps == nil || *r.Gbps <= 0) {
			t.Errorf("bulk %s: gbps %v", r.Mode, r.Gbps)
		}
		if r.Scenario == "pingpong" && (r.P99 == nil || *r.P99 <= 0) {
			t.Errorf("pingpong %s: p99 %v", r.Mode, r.P99)
		}
	}
	if st, err := os.Stat(pngPath); err != nil || st.Size() == 0 {
		t.Errorf("png: %v", err)
	}
}

func TestSelftestCorruptFails(t *testing.T) {
	var out, errs strings.Builder
	code := run([]string{"-reps", "1", "-d", "30ms", "-modes", "net", "-scenarios", "bulk", "-selftest-corrupt", "1"}, &out, &errs)
	if code != 3 {
		t.Fatalf("exit %d, want 3\nstderr:\n%s", code, errs.String())
	}
	// The damage is one payload byte under a correct checksum field: caught only because
	// the receiver hashes the payload.
	if !strings.Contains(errs.String(), "wrong bytes") || !strings.Contains(errs.String(), "frame 1 (size 4096): payload CRC-32C") {
		t.Errorf("stderr does not say why:\n%s", errs.String())
	}
}

func TestPerRun(t *testing.T) {
	for _, tc := range []struct {
		budget time.Duration
		timed  int
		fixed  time.Duration
	}{{3 * time.Minute, 70, 18 * time.Second}, {4 * time.Minute, 215, 70 * time.Second}, {time.Minute, 135, 10 * time.Second},
		{time.Second, 100, 0}, {time.Minute, 10, 2 * time.Minute}} {
		d := perRun(tc.budget, tc.timed, tc.fixed)
		if d < 200*time.Millisecond || d > 10*time.Second {
			t.Errorf("perRun(%v, %d, %v) = %v out of bounds", tc.budget, tc.timed, tc.fixed, d)
		}
		if total := time.Duration(tc.timed)*(d+120*time.Millisecond) + tc.fixed; tc.budget >= time.Minute &&
			d > 200*time.Millisecond && total > tc.budget*11/10 {
			t.Errorf("perRun(%v, %d, %v) = %v: estimated total %v", tc.budget, tc.timed, tc.fixed, d, total)
		}
	}
}

// The plan of a default run on this machine: every scenario with the modes that fit it,
// multicore left out (with the reason) where there are fewer than 4 CPUs.
func TestPlan(t *testing.T) {
	cfg := config{mcConns: "512,4096", idleConns: 10000, bulkSizes: "4096,65536,1048576"}
	skipped := map[harness.Scenario]string{harness.MultiCore: "needs ≥ 4 CPUs"}
	vs, notes, err := plan(cfg, skipped)
	if err != nil {
		t.Fatal(err)
	}
	has := func(s harness.Scenario, mode string, size, conns int) bool {
		return slices.Contains(vs, harness.Variant{Scenario: s, Mode: mode, Size: size, Conns: conns})
	}
	for _, v := range []harness.Variant{
		{Scenario: harness.Bulk, Mode: "netpoll", Size: 64 << 10, Conns: 1},
		{Scenario: harness.Echo, Mode: "netpoll", Size: 64, Conns: 64},
		{Scenario: harness.PingPong, Mode: "netpoll", Size: 64, Conns: 1},
		{Scenario: harness.Stream, Mode: "net", Size: 64, Conns: 1},
		{Scenario: harness.HTTP, Mode: "net", Size: 64, Conns: 32},
		{Scenario: harness.FileSend, Mode: "net", Size: 64 << 10, Conns: 1},
		{Scenario: harness.Idle, Mode: "net", Size: 64, Conns: 10000},
		{Scenario: harness.Idle, Mode: "netpoll", Size: 64, Conns: 10000},
	} {
		if !has(v.Scenario, v.Mode, v.Size, v.Conns) {
			t.Errorf("plan lacks %+v", v)
		}
	}
	for _, v := range vs {
		if v.Scenario == harness.MultiCore {
			t.Errorf("multicore planned although skipped: %+v", v)
		}
		if v.Mode == "syscall" && (v.Scenario == harness.Idle || v.Scenario == harness.HTTP) {
			t.Errorf("syscall planned for %s", v.Scenario)
		}
	}
	if !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "multicore: not run: needs ≥ 4 CPUs") }) {
		t.Errorf("notes lack the multicore reason: %q", notes)
	}
	// With the CPUs, multicore runs both connection counts for net, netpoll and zc.
	vs, _, err = plan(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"net", "netpoll", "zc", "zc-hash"} {
		for _, n := range []int{512, 4096} {
			if !slices.Contains(vs, harness.Variant{Scenario: harness.MultiCore, Mode: m, Size: 64, Conns: n}) {
				t.Errorf("multicore %s ×%d not planned", m, n)
			}
		}
	}
	if _, _, err := plan(config{mcConns: "512,x", idleConns: 1, bulkSizes: "4096"}, nil); err == nil {
		t.Error("bad -mc-conns accepted")
	}
	// -bulk-sizes picks the bulk write sizes; out-of-range or garbage sizes are refused.
	vs, _, err = plan(config{scenarios: "bulk", modes: "net", bulkSizes: " 8192,2097152"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []harness.Variant{{Scenario: harness.Bulk, Mode: "net", Size: 8192, Conns: 1},
		{Scenario: harness.Bulk, Mode: "net", Size: 2 << 20, Conns: 1}}; !slices.Equal(vs, want) {
		t.Errorf("-bulk-sizes 8192,2097152 planned %+v", vs)
	}
	for _, bad := range []string{"", "x", "4095", "0", "-4096", "16777217", "4096,,8192"} {
		if _, _, err := plan(config{scenarios: "bulk", modes: "net", bulkSizes: bad}, nil); err == nil || !strings.Contains(err.Error(), "-bulk-sizes") {
			t.Errorf("-bulk-sizes %q: %v", bad, err)
		}
	}
}

// fdLimit leaves the plan alone where RLIMIT_NOFILE has room (this test's limit is
// raised only up to its hard limit, never lowered).
func TestFDLimit(t *testing.T) {
	vs := []harness.Variant{{Scenario: harness.Idle, Mode: "net", Size: 64, Conns: 100},
		{Scenario: harness.MultiCore, Mode: "net", Size: 64, Conns: 200}, {Scenario: harness.Bulk, Mode: "net", Size: 4096, Conns: 1}}
	out, note := fdLimit(slices.Clone(vs))
	if !slices.Equal(out, vs) || note != "" {
		t.Errorf("fdLimit changed a plan that fits: %v %q", out, note)
	}
	if out, note := fdLimit(vs[2:]); len(out) != 1 || note != "" {
		t.Errorf("no connections to make room for: %v %q", out, note)
	}
}

// Where the limit cannot be raised: idle variants shrink together to what the hungriest
// mode fits (zc-net holds two descriptors per connection), multi-core ones that do not fit
// are left out; the zc-net server is asked for 2 per connection.
func TestShrinkToFit(t *testing.T) {
	if n := modeFDs("zc-net"); n != 2 {
		t.Errorf("zc-net holds %d descriptors per connection, want 2", n)
	}
	if n := modeFDs("net"); n != 1 {
		t.Errorf("net holds %d descriptors per connection, want 1", n)
	}
	vs := []harness.Variant{{Scenario: harness.Idle, Mode: "net", Conns: 10000},
		{Scenario: harness.Idle, Mode: "zc-net", Conns: 10000},
		{Scenario: harness.MultiCore, Mode: "net", Conns: 4096},
		{Scenario: harness.MultiCore, Mode: "zc", Conns: 512},
		{Scenario: harness.Bulk, Mode: "net", Conns: 1}}
	out, idleFit, dropped := shrinkToFit(vs, 3000, modeFDs)
	if idleFit != 1500 || len(out) != 4 || out[0].Conns != 1500 || out[1].Conns != 1500 || out[2].Conns != 512 {
		t.Errorf("shrinkToFit(3000): idle %d, plan %+v", idleFit, out)
	}
	if len(dropped) != 1 || dropped[0] != "net ×4096" {
		t.Errorf("dropped %q, want the 4096-connection multicore variant", dropped)
	}
}

// tinyServices are the flags that make every services case small.
var tinyServices = []string{"-reps", "1", "-svc-d", "50ms", "-relay-bytes", "262144", "-file-size", "8388608", "-d", "50ms"}

// Every services scenario runs with every mode that fits it, checks its bytes and yields
// its figures and goals.
func TestServicesRun(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "r.json")
	var out, errs strings.Builder
	code := run(append([]string{"-scenarios", "services", "-json", jsonPath}, tinyServices...), &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errs.String())
	}
	for _, s := range []string{"RELAY (client", "RELAY, BACKEND HALF-CLOSES FIRST", "FAN-OUT", "FILE STREAMING", "KEY-VALUE",
		"MULTI-QUEUE, SHARED CPUS", "GOALS (issue 20, services)", "7. relay", "12. HTTP under wrk", "net-aa / net"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
	wrk := harness.WrkAvailable() == nil
	if wrk != strings.Contains(out.String(), "HTTP UNDER WRK") {
		t.Errorf("wrk available %v, but the wrk table printed %v", wrk, !wrk)
	}
	if !wrk && !strings.Contains(out.String(), "scenario wrk: not run: wrk not installed") {
		t.Errorf("no note that wrk is missing:\n%s", out.String())
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []struct {
			Scenario string   `json:"scenario"`
			Mode     string   `json:"mode"`
			Size     int      `json:"size"`
			Conns    int      `json:"conns"`
			Reps     int      `json:"reps"`
			MsgsPerS *float64 `json:"msgs_per_s"`
			SrvUs    *float64 `json:"srv_cpu_us_per_msg"`
			SrvSGB   *float64 `json:"srv_cpu_s_per_gb"`
		} `json:"results"`
		Goals []struct {
			ID     int    `json:"id"`
			Status string `json:"status"`
		} `json:"goals"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range doc.Results {
		seen[r.Scenario+" "+r.Mode] = true
		if r.Reps != 1 || r.MsgsPerS == nil || *r.MsgsPerS <= 0 || r.SrvUs == nil || *r.SrvUs <= 0 {
			t.Errorf("%s %s %d×%d: reps %d, units/s %v, server µs/unit %v", r.Scenario, r.Mode, r.Size, r.Conns, r.Reps, r.MsgsPerS, r.SrvUs)
		}
		if (r.Scenario == "relay" || r.Scenario == "files") && (r.SrvSGB == nil || *r.SrvSGB <= 0) {
			t.Errorf("%s %s ×%d: server s/GB %v", r.Scenario, r.Mode, r.Conns, r.SrvSGB)
		}
	}
	want := []string{"relay net", "relay net-aa", "relay zc", "relay-hc net", "relay-hc zc", "fanout net", "fanout zc",
		"files net", "files zc", "kv net", "kv net-aa", "kv zc", "kv zc-straight", "mq net", "mq netpoll", "mq zc"}
	if wrk {
		want = append(want, "wrk net", "wrk zc-net")
	}
	for _, w := range want {
		if !seen[w] {
			t.Errorf("no result for %s", w)
		}
	}
	for _, g := range doc.Goals {
		if g.ID >= 7 && g.ID <= 11 && strings.HasPrefix(g.Status, "NOT RUN") {
			t.Errorf("goal %d: %s", g.ID, g.Status)
		}
	}
}

// A damaged byte fails every services scenario with "wrong bytes": relay (upload and
// download frames), fan-out (a published message), files (a frame of the file), key-value
// (a stored value read back), multi-queue (a request) and wrk (a response body).
func TestServicesCorrupt(t *testing.T) {
	for _, tc := range []struct{ scen, modes, says string }{
		{"relay", "zc", "payload CRC-32C"},
		{"relay-hc", "net", "payload CRC-32C"},
		{"fanout", "zc", "payload damaged"},
		{"files", "zc", "payload CRC-32C"},
		{"kv", "zc", "not what was stored"},
		{"kv", "zc-straight", "not what was stored"},
		{"mq", "zc", "payload CRC-32C"},
		{"wrk", "zc-net", "responses were not the"},
		{"files-tls", "net-tls", "payload CRC-32C"},
		{"relay-tls", "ztls-user", "payload CRC-32C"},
		{"https", "ztls-user", "responses were not the"},
	} {
		t.Run(tc.scen, func(t *testing.T) {
			if (tc.scen == "wrk" || tc.scen == "https") && harness.WrkAvailable() != nil {
				t.Skip(harness.WrkAvailable())
			}
			var out, errs strings.Builder
			code := run(append([]string{"-scenarios", tc.scen, "-modes", tc.modes, "-selftest-corrupt", "0"}, tinyServices...), &out, &errs)
			if code != 3 {
				t.Fatalf("exit %d, want 3\nstdout:\n%s\nstderr:\n%s", code, out.String(), errs.String())
			}
			if !strings.Contains(errs.String(), "wrong bytes") || !strings.Contains(errs.String(), tc.says) {
				t.Errorf("stderr does not say %q:\n%s", tc.says, errs.String())
			}
		})
	}
}

// The services plan: each scenario with its modes, the A/A pair only where it belongs,
// nothing of the suite with -services=false.
func TestPlanServices(t *testing.T) {
	cfg := config{services: true, mcConns: "512", idleConns: 10, bulkSizes: "4096", scenarios: "services"}
	vs, _, err := plan(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	has := func(s harness.Scenario, mode string, size, conns int) bool {
		return slices.Contains(vs, harness.Variant{Scenario: s, Mode: mode, Size: size, Conns: conns})
	}
	for _, v := range []harness.Variant{
		{Scenario: harness.Relay, Mode: "net-aa", Size: 64 << 10, Conns: 8},
		{Scenario: harness.Relay, Mode: "zc", Size: 64 << 10, Conns: 64},
		{Scenario: harness.RelayHalfClose, Mode: "net", Size: 64 << 10, Conns: 8},
		{Scenario: harness.FanOut, Mode: "zc", Size: 1 << 10, Conns: 1000},
		{Scenario: harness.FileStream, Mode: "net", Size: 64 << 10, Conns: 128},
		{Scenario: harness.KV, Mode: "net-aa", Size: 64, Conns: 32},
		{Scenario: harness.KV, Mode: "zc", Size: 100 << 10, Conns: 32},
		{Scenario: harness.KV, Mode: "zc-straight", Size: 100 << 10, Conns: 32},
		{Scenario: harness.KV, Mode: "zc-straight", Size: 64, Conns: 32},
		{Scenario: harness.MultiQueue, Mode: "netpoll", Size: 64, Conns: 512},
		{Scenario: harness.MultiQueue, Mode: "c-uring", Size: 64, Conns: 512},
		{Scenario: harness.HTTPWrk, Mode: "zc-net", Size: 64 << 10, Conns: 512},
		{Scenario: harness.HTTPSWrk, Mode: "net-tls", Size: 64 << 10, Conns: 32},
		{Scenario: harness.HTTPSWrk, Mode: "net-tls-aa", Size: 64, Conns: 32},
		{Scenario: harness.HTTPSWrk, Mode: "ztls-user", Size: 64, Conns: 32},
		{Scenario: harness.FilesTLS, Mode: "net-tls-aa", Size: 64 << 10, Conns: 1},
		{Scenario: harness.FilesTLS, Mode: "ztls-user", Size: 64 << 10, Conns: 8},
		{Scenario: harness.RelayTLS, Mode: "net-tls", Size: 64 << 10, Conns: 8},
	} {
		if !has(v.Scenario, v.Mode, v.Size, v.Conns) {
			t.Errorf("plan lacks %+v", v)
		}
	}
	for _, v := range vs {
		if !v.Scenario.Service() {
			t.Errorf("-scenarios services planned %+v", v)
		}
		if v.Mode == "net-aa" && !(v.Scenario == harness.Relay && v.Conns == 8 || v.Scenario == harness.KV && v.Size == 64) {
			t.Errorf("A/A copy planned for %+v", v)
		}
		if v.Scenario == harness.MultiQueue && !slices.Contains([]string{"net", "netpoll", "zc", "c-uring", "c-epoll"}, v.Mode) {
			t.Errorf("mq planned with %s", v.Mode)
		}
		if v.Scenario == harness.HTTPWrk && v.Mode != "net" && v.Mode != "zc-net" {
			t.Errorf("wrk planned with %s", v.Mode)
		}
		tlsMode := strings.HasPrefix(v.Mode, "net-tls") || strings.HasPrefix(v.Mode, "ztls")
		if tlsMode != slices.Contains(harness.TLSScenarios, v.Scenario) {
			t.Errorf("planned %+v", v)
		}
		if v.Mode == "net-tls-aa" && !(v.Scenario == harness.HTTPSWrk && v.Size == 64 || v.Scenario == harness.FilesTLS && v.Conns == 1) {
			t.Errorf("TLS A/A copy planned for %+v", v)
		}
		if v.Mode == "ztls" && services.KernelTLSAvailable() != nil {
			t.Errorf("ztls planned without kernel TLS: %+v", v)
		}
	}
	cfg.scenarios, cfg.services = "", false
	vs, _, err = plan(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(vs, func(v harness.Variant) bool { return v.Scenario.Service() }) {
		t.Error("-services=false planned services")
	}
}

// The TLS scenarios (https, files-tls, relay-tls) run tiny on any host: net-tls, its A/A
// copy and ztls-user always; ztls where the kernel has TLS, and where it has not, a note
// says so ("not available here: kernel TLS ...") and goals 14–16 are NOT RUN with that
// reason, never MET.
func TestTLSRun(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "r.json")
	var out, errs strings.Builder
	code := run(append([]string{"-scenarios", "https,files-tls,relay-tls", "-json", jsonPath}, tinyServices...), &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errs.String())
	}
	kernelErr := services.KernelTLSAvailable()
	wrk := harness.WrkAvailable() == nil
	for _, s := range []string{"FILE STREAMING OVER TLS", "TLS-TERMINATING RELAY", "GOALS (issue 28, TLS)", "14. TLS file send",
		"15. HTTPS small responses", "16. TLS-terminating relay",
		"ztls-user / net-tls server CPU"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
	if wrk != strings.Contains(out.String(), "HTTPS UNDER WRK") {
		t.Errorf("wrk available %v, but the https table printed %v", wrk, !wrk)
	}
	if kernelErr != nil && !strings.Contains(out.String(), "mode ztls: "+kernelErr.Error()) {
		t.Errorf("no note that ztls is not available here (%v):\n%s", kernelErr, out.String())
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []struct {
			Scenario string            `json:"scenario"`
			Mode     string            `json:"mode"`
			Size     int               `json:"size"`
			Reps     int               `json:"reps"`
			SrvUs    *float64          `json:"srv_cpu_us_per_msg"`
			SrvSGB   *float64          `json:"srv_cpu_s_per_gb"`
			Notes    map[string]string `json:"notes"`
		} `json:"results"`
		Goals []struct {
			ID     int    `json:"id"`
			Status string `json:"status"`
			Note   string `json:"note"`
		} `json:"goals"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range doc.Results {
		seen[r.Scenario+" "+r.Mode] = true
		if r.Reps != 1 || r.SrvUs == nil || *r.SrvUs <= 0 || (r.Scenario != "https" && (r.SrvSGB == nil || *r.SrvSGB <= 0)) {
			t.Errorf("%s %s %d: reps %d, µs/unit %v, s/GB %v", r.Scenario, r.Mode, r.Size, r.Reps, r.SrvUs, r.SrvSGB)
		}
		if !strings.HasPrefix(r.Notes["tls"], "TLS 1.3 TLS_") {
			t.Errorf("%s %s: negotiated %q", r.Scenario, r.Mode, r.Notes["tls"])
		}
		if r.Mode == "net-tls-aa" && r.Scenario == "https" && r.Size != 64 {
			t.Errorf("A/A copy ran https %d", r.Size)
		}
	}
	want := []string{"files-tls net-tls", "files-tls net-tls-aa", "files-tls ztls-user", "relay-tls net-tls", "relay-tls ztls-user"}
	if wrk {
		want = append(want, "https net-tls", "https net-tls-aa", "https ztls-user")
	}
	if kernelErr == nil {
		want = append(want, "files-tls ztls")
	} else if seen["files-tls ztls"] || seen["https ztls"] || seen["relay-tls ztls"] {
		t.Error("ztls ran without kernel TLS")
	}
	for _, w := range want {
		if !seen[w] {
			t.Errorf("no result for %s", w)
		}
	}
	ids := 0
	for _, g := range doc.Goals {
		if g.ID < 14 || g.ID > 16 {
			continue
		}
		ids++
		if kernelErr != nil && g.Status != "NOT RUN (ztls: "+kernelErr.Error()+")" && !(g.ID == 15 && !wrk) {
			t.Errorf("goal %d without kernel TLS: %s", g.ID, g.Status)
		}
		if g.ID == 14 && !strings.Contains(g.Note, "files-tls ×1: ztls-user / net-tls server CPU") {
			t.Errorf("goal 14's note lacks the fallback's cost: %s", g.Note)
		}
	}
	if ids != 3 {
		t.Errorf("goals: %+v", doc.Goals)
	}
}

// -cpuprofile writes, for every child, its CPU profile and its allocation profile beside it.
func TestProfiles(t *testing.T) {
	dir := t.TempDir()
	var out, errs strings.Builder
	code := run(append(append([]string{}, tinyServices...), "-modes", "net", "-scenarios", "kv", "-cpuprofile", dir), &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errs.String())
	}
	for _, size := range []string{"64", "102400"} {
		for _, role := range []string{"server", "client"} {
			for _, suffix := range []string{".pprof", "-allocs.pprof"} {
				name := filepath.Join(dir, "net-kv-"+size+"-"+role+suffix)
				if st, err := os.Stat(name); err != nil || st.Size() == 0 {
					t.Errorf("%s: %v (want a profile)", filepath.Base(name), err)
				}
			}
		}
	}
}
