package harness

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestInterleave(t *testing.T) {
	vs := []Variant{{Mode: "A"}, {Mode: "B"}, {Mode: "C"}}
	runs := Interleave(vs, 3, nil)
	var got []string
	for _, r := range runs {
		got = append(got, fmt.Sprintf("%s%d", r.Mode, r.Rep))
		if vs[r.Index].Mode != r.Mode {
			t.Fatalf("run %+v: Index points at %s", r, vs[r.Index].Mode)
		}
	}
	if s := strings.Join(got, " "); s != "A0 B0 C0 C1 B1 A1 A2 B2 C2" {
		t.Fatalf("order %s", s)
	}
	if len(Interleave(vs, 0, nil)) != 0 {
		t.Fatal("0 reps gave runs")
	}
}

// A floating variant (the A/A copy) runs once per round, at a position that moves over
// the rounds, so it is not always next to its partner.
func TestInterleaveFloating(t *testing.T) {
	var vs []Variant
	for _, m := range []string{"A", "B", "C", "D", "E", "F", "G", "H"} {
		vs = append(vs, Variant{Mode: m})
	}
	vs = append(vs, Variant{Mode: "H-aa"})
	const reps = 5
	runs := Interleave(vs, reps, func(v Variant) bool { return strings.HasSuffix(v.Mode, "-aa") })
	if len(runs) != len(vs)*reps {
		t.Fatalf("%d runs, want %d", len(runs), len(vs)*reps)
	}
	dist := map[int]bool{}
	for r := 0; r < reps; r++ {
		round := runs[r*len(vs) : (r+1)*len(vs)]
		seen := map[string]int{}
		for i, run := range round {
			if run.Rep != r || vs[run.Index].Mode != run.Mode {
				t.Fatalf("round %d: %+v", r, run)
			}
			seen[run.Mode] = i
		}
		if len(seen) != len(vs) {
			t.Fatalf("round %d runs %d distinct variants, want %d", r, len(seen), len(vs))
		}
		d := seen["H-aa"] - seen["H"]
		dist[d] = true
	}
	if len(dist) < 4 {
		t.Fatalf("the A/A copy sat at %d distinct distances from its partner over %d rounds, want at least 4", len(dist), reps)
	}
	// The fixed variants keep the A B C … / … C B A order.
	var fixed []string
	for _, run := range runs[:len(vs)] {
		if run.Mode != "H-aa" {
			fixed = append(fixed, run.Mode)
		}
	}
	if s := strings.Join(fixed, ""); s != "ABCDEFGH" {
		t.Fatalf("round 0 fixed order %s", s)
	}
}

func TestCaseValidate(t *testing.T) {
	ok := Case{Scenario: Echo, Mode: "net", Size: 64, Conns: 64, RecvBuf: 1, Duration: 1}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []func(*Case){
		func(c *Case) { c.Scenario = "x" },
		func(c *Case) { c.Size = 31 },
		func(c *Case) { c.Conns = 0 },
		func(c *Case) { c.Scenario = Bulk },
		func(c *Case) { c.RecvBuf = 0 },
		func(c *Case) { c.Duration = 0 },
	}
	for i, f := range bad {
		c := ok
		f(&c)
		if c.Validate() == nil {
			t.Errorf("case %d accepted: %+v", i, c)
		}
	}
}

func TestSplitCPUs(t *testing.T) {
	seq := func(n int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = i
		}
		return s
	}
	for _, tc := range []struct {
		cpus, queues int
		server, load int
	}{{16, 4, 4, 12}, {8, 4, 4, 4}, {6, 4, 3, 3}, {4, 4, 2, 2}, {64, 4, 4, 60}, {16, 1, 1, 15}} {
		srv, load, err := SplitCPUs(seq(tc.cpus), tc.queues)
		if err != nil || len(srv) != tc.server || len(load) != tc.load || srv[0] != 0 || load[0] != tc.server {
			t.Errorf("%d CPUs, %d queues: server %v, load %v, %v", tc.cpus, tc.queues, srv, load, err)
		}
	}
	for _, n := range []int{0, 1, 2, 3} {
		if _, _, err := SplitCPUs(seq(n), 4); !errors.Is(err, ErrFewCPUs) || !strings.Contains(err.Error(), "needs ≥ 4 CPUs") {
			t.Errorf("%d CPUs: %v", n, err)
		}
	}
	if _, _, err := SplitCPUs(seq(8), 0); err == nil {
		t.Error("0 queues accepted")
	}
}

func TestParseStatus(t *testing.T) {
	m := parseStatus([]byte("Name:\tx\nVmPeak:\t  100 kB\nVmPin:\t    2048 kB\nVmRSS:\t   51200 kB\nThreads:\t7\n"))
	if m.rss != 51200*1024 || m.pin != 2048*1024 {
		t.Errorf("parsed %+v", m)
	}
	if m := parseStatus([]byte("garbage\nVmRSS: x kB\n")); m != (memSample{}) {
		t.Errorf("garbage parsed as %+v", m)
	}
	if m := readMem(); m.rss == 0 {
		t.Error("VmRSS of this process reads 0")
	}
}

func TestCaseValidateNewScenarios(t *testing.T) {
	for _, c := range []Case{
		{Scenario: MultiCore, Size: 64, Conns: 512, RecvBuf: 1, Duration: 1, Queues: 4},
		{Scenario: HTTP, Size: 64, Conns: 32, RecvBuf: 1, Duration: 1},
		{Scenario: Idle, Size: 64, Conns: 10000, RecvBuf: 1, Duration: 1},
		{Scenario: FileSend, Size: 65536, Conns: 1, RecvBuf: 1, Duration: 1, File: "/x"},
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", c.Scenario, err)
		}
	}
	for _, c := range []Case{
		{Scenario: FileSend, Size: 65536, Conns: 1, RecvBuf: 1, Duration: 1},
		{Scenario: FileSend, Size: 65536, Conns: 2, RecvBuf: 1, Duration: 1, File: "/x"},
	} {
		if c.Validate() == nil {
			t.Errorf("accepted %+v", c)
		}
	}
	if !HTTP.HarnessClient() || !Idle.HarnessClient() || !MultiCore.HarnessClient() || Echo.HarnessClient() {
		t.Error("HarnessClient")
	}
	if !FileSend.OneWay() || Idle.OneWay() || Idle.RequestResponse() || !MultiCore.RequestResponse() {
		t.Error("OneWay/RequestResponse")
	}
}
