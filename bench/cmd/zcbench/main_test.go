package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/bench/internal/modes"
)

func TestMain(m *testing.M) {
	if harness.IsChild(os.Args) {
		os.Exit(harness.ChildMain(os.Args[1:], modes.All(), os.Stdout, os.Stderr))
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
	for _, s := range []string{"BULK", "PING-PONG", "GOALS", "n/a (mode not available)"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var res []struct {
		Scenario string   `json:"scenario"`
		Mode     string   `json:"mode"`
		Reps     int      `json:"reps"`
		Gbps     *float64 `json:"gbps"`
		P99      *float64 `json:"p99_us"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
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
	if !strings.Contains(errs.String(), "wrong bytes") {
		t.Errorf("stderr does not say why:\n%s", errs.String())
	}
}

func TestPerRun(t *testing.T) {
	for _, tc := range []struct {
		budget       time.Duration
		ours, iperfs int
	}{{3 * time.Minute, 70, 15}, {3 * time.Minute, 210, 15}, {time.Minute, 135, 9}, {time.Second, 100, 0}} {
		d := perRun(tc.budget, tc.ours, tc.iperfs)
		if d < 200*time.Millisecond || d > 10*time.Second {
			t.Errorf("perRun(%v, %d, %d) = %v out of bounds", tc.budget, tc.ours, tc.iperfs, d)
		}
		if tc.budget >= time.Minute {
			total := time.Duration(tc.ours)*(d+60*time.Millisecond) + time.Duration(tc.iperfs)*(max(time.Second, d)+200*time.Millisecond)
			if total > tc.budget*11/10 {
				t.Errorf("perRun(%v, %d, %d) = %v: estimated total %v", tc.budget, tc.ours, tc.iperfs, d, total)
			}
		}
	}
}
