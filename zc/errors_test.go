package zc

import (
	"errors"
	"testing"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/kmod"
	"github.com/zcnet/zcnet/kmod/shim"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// One ErrNotSupported: a refusal from any zcnet package matches zc.ErrNotSupported.
func TestOneErrNotSupported(t *testing.T) {
	for name, e := range map[string]error{
		"uring": uring.ErrNotSupported, "memreg": memreg.ErrNotSupported, "tcpglue": tcpglue.ErrNotSupported,
		"bpf": bpf.ErrNotSupported, "kmod": kmod.ErrNotSupported, "shim": shim.ErrNotSupported,
	} {
		if e != ErrNotSupported {
			t.Errorf("%s.ErrNotSupported is not zc.ErrNotSupported", name)
		}
	}
	// Real refusals, where this machine refuses.
	if err := shim.Probe(); err != nil && !errors.Is(err, ErrNotSupported) && !errors.Is(err, shim.ErrABIMismatch) {
		t.Errorf("shim.Probe: %v is neither a refusal nor an ABI mismatch", err)
	}
	if _, err := kmod.Loaded(); err != nil && !errors.Is(err, ErrNotSupported) {
		t.Errorf("kmod.Loaded: %v does not match zc.ErrNotSupported", err)
	}
	if r, err := memreg.New(memreg.Options{BufSize: 4096, Count: 16, HugePages: true, RequireHugePages: true}); err == nil {
		r.Close() // huge pages are reserved here: no refusal to check
	} else {
		if !errors.Is(err, ErrNotSupported) {
			t.Errorf("memreg huge-page refusal %v does not match zc.ErrNotSupported", err)
		}
	}
}
