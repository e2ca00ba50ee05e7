package zc

import (
	"strings"
	"testing"
)

// TestProbe: on the CI kernel (6.18, root) everything but the shim module is available; the
// report says so line by line.
func TestProbe(t *testing.T) {
	c := Probe()
	t.Logf("\n%s", c)
	for name, err := range map[string]error{"io_uring": c.IOUring, "send_zc": c.SendZC, "bundles": c.RecvBundle,
		"defer taskrun": c.DeferTaskrun, "mapped recv": c.MappedRecv} {
		if err != nil {
			t.Errorf("%s unavailable on a kernel that has it: %v", name, err)
		}
	}
	if c.Shim == nil {
		t.Log("zcshim module is loaded")
	}
	s := c.String()
	if !strings.Contains(s, "io_uring") || !strings.Contains(s, "zcshim") {
		t.Fatalf("report lacks lines:\n%s", s)
	}
}
