package bpferr

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
)

func TestClassify(t *testing.T) {
	old := errs.NotSupported("thing", "Linux 9.9", nil)
	for _, tc := range []struct {
		in   error
		want error
	}{
		{unix.EPERM, ErrPermission},
		{unix.EACCES, ErrPermission},
		{unix.EOPNOTSUPP, errs.ErrNotSupported},
		{ebpf.ErrNotSupported, errs.ErrNotSupported},
		{ebpf.ErrKeyNotExist, ErrNotFound},
		{ErrInvalid, ErrInvalid},
	} {
		got := Classify(tc.in, old, []Cap{CapBPF}, []Cap{CapPerfmon})
		if !errors.Is(got, tc.want) || !errors.Is(got, tc.in) {
			t.Errorf("Classify(%v) = %v: want it to match %v and keep the cause", tc.in, got, tc.want)
		}
	}
	if got := Classify(unix.ENOENT, old, nil, nil); got != unix.ENOENT {
		t.Errorf("an inconclusive errno changed: %v", got)
	}
	if Classify(nil, old, nil, nil) != nil {
		t.Error("nil classified")
	}
	if got := Classify(unix.EPERM, old, []Cap{CapBPF}, nil).Error(); !strings.Contains(got, "CAP_") {
		t.Errorf("a permission refusal does not name capabilities: %q", got)
	}
}

func TestAndList(t *testing.T) {
	for in, want := range map[string]string{"": "", "a": "a", "a b": "a and b", "a b c": "a, b and c"} {
		if got := andList(strings.Fields(in)); got != want {
			t.Errorf("andList(%q) = %q, want %q", in, got, want)
		}
	}
}
