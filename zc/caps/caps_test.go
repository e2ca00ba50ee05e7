package caps

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
	// Every namespace has a loopback device, and the report has a section for it.
	if c.NICsErr != nil {
		t.Fatalf("per-NIC report: %v", c.NICsErr)
	}
	lo := false
	for _, n := range c.NICs {
		lo = lo || n.Loopback
	}
	if !lo || !strings.Contains(s, "nic lo (") || !strings.Contains(s, "  zcrx ") {
		t.Fatalf("per-NIC section missing:\n%s", s)
	}
}
