package testutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFindVirtioNICs: only devices whose driver is virtio_net count, sorted by MAC address
// whatever their names, and a pair that is not there says what was found.
func TestFindVirtioNICs(t *testing.T) {
	sys := t.TempDir()
	drivers := t.TempDir()
	for _, d := range []string{"virtio_net", "e1000"} {
		if err := os.MkdirAll(filepath.Join(drivers, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dev := func(name, driver, mac string) {
		dir := filepath.Join(sys, name)
		if err := os.MkdirAll(filepath.Join(dir, "device"), 0o755); err != nil {
			t.Fatal(err)
		}
		if driver != "" {
			if err := os.Symlink(filepath.Join(drivers, driver), filepath.Join(dir, "device", "driver")); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "address"), []byte(mac+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dev("lo", "", "00:00:00:00:00:00")
	dev("eth0", "virtio_net", "52:54:00:5a:43:01")
	dev("eth1", "e1000", "52:54:00:00:00:09")
	if _, err := setupNICPair(sys); err == nil || !strings.Contains(err.Error(), "found 1 [eth0]") {
		t.Fatalf("one virtio NIC: %v, want an error naming what was found", err)
	}
	dev("eth2", "virtio_net", "52:54:00:5a:43:00")
	nics, err := findVirtioNICs(sys)
	if err != nil {
		t.Fatal(err)
	}
	if len(nics) != 2 || nics[0].name != "eth2" || nics[1].name != "eth0" {
		t.Fatalf("found %+v, want eth2 (…:00) then eth0 (…:01)", nics)
	}
	if OpenNICPairs() != 0 {
		t.Fatalf("%d NIC pairs open after a failed setup", OpenNICPairs())
	}
}
