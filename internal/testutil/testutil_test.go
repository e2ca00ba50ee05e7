package testutil

import (
	"fmt"
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
