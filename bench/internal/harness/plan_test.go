package harness

import (
	"fmt"
	"strings"
	"testing"
)

func TestInterleave(t *testing.T) {
	vs := []Variant{{Mode: "A"}, {Mode: "B"}, {Mode: "C"}}
	runs := Interleave(vs, 3)
	var got []string
	for _, r := range runs {
		got = append(got, fmt.Sprintf("%s%d", r.Mode, r.Rep))
		if vs[r.Index].Mode != r.Mode {
			t.Fatalf("run %+v: Index points at %s", r, vs[r.Index].Mode)
		}
	}
	if s := strings.Join(got, " "); s != "A0 B0 C0 A1 B1 C1 A2 B2 C2" {
		t.Fatalf("order %s", s)
	}
	if len(Interleave(vs, 0)) != 0 {
		t.Fatal("0 reps gave runs")
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
