package testutil

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/zcnet/zcnet/internal/errs"
)

func TestParseVersion(t *testing.T) {
	for rel, want := range map[string][3]int{
		"6.18.0-1-cloud-amd64":    {6, 18, 0},
		"7.3.4+deb13-cloud-amd64": {7, 3, 4},
		"6.1":                     {6, 1, 0},
		"":                        {0, 0, 0},
	} {
		a, b, c := parseVersion(rel)
		if [3]int{a, b, c} != want {
			t.Errorf("%q: got %d.%d.%d, want %v", rel, a, b, c, want)
		}
	}
	if !KernelAtLeast("2.6") || KernelAtLeast("99.0") {
		t.Fatal("KernelAtLeast")
	}
}

type fakeTB struct {
	testing.TB
	skipped, failed bool
}

func (f *fakeTB) Helper()               {}
func (f *fakeTB) Skipf(string, ...any)  { f.skipped = true }
func (f *fakeTB) Fatalf(string, ...any) { f.failed = true }
func (f *fakeTB) Skip(...any)           { f.skipped = true }

func TestSkipIfNotSupported(t *testing.T) {
	ns := fmt.Errorf("x: %w", errs.ErrNotSupported)
	for _, c := range []struct {
		err          error
		min          string
		skip, failed bool
	}{
		{nil, "", false, false},
		{ns, "", true, false},
		{ns, "99.0", true, false},
		{ns, "2.6", false, true},
		{fmt.Errorf("other"), "", false, true},
	} {
		f := &fakeTB{}
		SkipIfNotSupported(f, c.err, c.min)
		if f.skipped != c.skip || f.failed != c.failed {
			t.Errorf("%v/%q: skipped %v failed %v", c.err, c.min, f.skipped, f.failed)
		}
	}
}

// errorRecorder keeps what Errorf reports instead of failing the test.
type errorRecorder struct {
	testing.TB
	errors []string
}

func (r *errorRecorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func TestCompareWithC(t *testing.T) {
	r := &errorRecorder{TB: t}
	CompareWithC(r, []string{"stdint.h"}, nil, map[string]uint64{
		"sizeof(uint32_t)": 4,
		"UINT16_MAX":       65535,
		"sizeof(uint64_t)": 4, // wrong on purpose
	})
	if len(r.errors) != 1 || r.errors[0] != "sizeof(uint64_t): C says 8, Go says 4" {
		t.Errorf("errors %q, want the one wrong check", r.errors)
	}
}

func TestRequireFeature(t *testing.T) {
	for _, c := range []struct {
		ok           bool
		min          string
		skip, failed bool
	}{
		{true, "2.6", false, false},
		{false, "99.0", true, false},
		{false, "2.6", false, true},
	} {
		f := &fakeTB{}
		RequireFeature(f, c.ok, "thing", c.min)
		if f.skipped != c.skip || f.failed != c.failed {
			t.Errorf("%v/%q: skipped %v failed %v", c.ok, c.min, f.skipped, f.failed)
		}
	}
}

func TestHasIPv6Loopback(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]struct {
		table string
		want  bool
	}{
		"lo":      {"00000000000000000000000000000001 01 80 10 80       lo\nfe8000000000000000fc00fffe000001 04 40 20 80     eth0\n", true},
		"no ::1":  {"fe8000000000000000fc00fffe000001 04 40 20 80     eth0\n", false},
		"not lo":  {"00000000000000000000000000000001 04 80 10 80     eth0\n", false},
		"missing": {"", false},
	} {
		p := dir + "/" + strings.ReplaceAll(name, " ", "_")
		if name != "missing" {
			if err := os.WriteFile(p, []byte(c.table), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		got, err := hasIPv6Loopback(p)
		if err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", name, got, err, c.want)
		}
	}
	if _, err := hasIPv6Loopback(dir); err == nil {
		t.Error("reading a directory as the table: no error")
	}
}
