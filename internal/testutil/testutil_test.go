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
