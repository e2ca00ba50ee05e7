package hwq

import (
	"errors"
	"testing"

	"github.com/zcnet/zcnet/internal/netns"
)

// TestDriver: the package-level Driver answers what the Client's does, in the calling
// thread's namespace: veth for a veth, "" for loopback, an error naming the device for one
// that does not exist.
func TestDriver(t *testing.T) {
	v := newVeth(t, 1)
	var got, lo string
	var missing error
	err := netns.Do(v.ns.Fd(), func() error {
		var err error
		if got, err = Driver(v.a); err != nil {
			return err
		}
		if lo, err = Driver("lo"); err != nil {
			return err
		}
		_, missing = Driver("nosuchdev0")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want, err := v.c.Driver(v.a)
	if err != nil || got != "veth" || want != got || lo != "" {
		t.Fatalf("Driver: %q (Client: %q, %v), lo %q", got, want, err, lo)
	}
	var oe *OpError
	if !errors.As(missing, &oe) || oe.Iface != "nosuchdev0" {
		t.Fatalf("Driver of a missing device: %v", missing)
	}
	var ve *ValueError
	for _, bad := range []string{"", "sixteen-bytes-xx"} {
		if _, err := Driver(bad); !errors.As(err, &ve) {
			t.Errorf("Driver(%q): %v, want a *ValueError", bad, err)
		}
	}
}
