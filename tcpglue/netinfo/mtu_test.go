package netinfo

import (
	"errors"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"
)

func nextChange(t *testing.T, w *MTUWatch) MTUChange {
	t.Helper()
	select {
	case c, ok := <-w.C:
		if !ok {
			t.Fatalf("watch ended: %v", w.Close())
		}
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no MTU change reported")
	}
	return MTUChange{}
}

// TestWatchMTU: a change is reported with the old and new value, other link changes are
// not, devices that appear and go away are, and Close stops the goroutine even while
// nobody reads.
func TestWatchMTU(t *testing.T) {
	tp := newTopo(t)
	goroutines := runtime.NumGoroutine()
	if mtu, err := tp.sa.LinkMTU("hn0"); err != nil || mtu != 1500 {
		t.Fatalf("LinkMTU %d, %v", mtu, err)
	}
	w, err := tp.sa.WatchMTU()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := tp.a.IP("link", "set", "hn0", "mtu", "1400"); err != nil {
		t.Fatal(err)
	}
	if c := nextChange(t, w); c.Ifname != "hn0" || c.Old != 1500 || c.New != 1400 {
		t.Fatalf("change %+v", c)
	}
	if mtu, _ := tp.sa.LinkMTU("hn0"); mtu != 1400 {
		t.Fatalf("LinkMTU after change %d", mtu)
	}
	if r, _ := tp.sa.RouteTo(ip("10.9.2.1")); r.MTU != 1400 || r.RouteMTU {
		t.Fatalf("route MTU follows the device: %+v", r)
	}
	// Link changes that leave the MTU alone are not reported: the next report is 1400->1450.
	if err := tp.a.IP("link", "set", "hn0", "alias", "zcnet-test"); err != nil {
		t.Fatal(err)
	}
	if err := tp.a.IP("link", "set", "hn0", "mtu", "1450"); err != nil {
		t.Fatal(err)
	}
	if c := nextChange(t, w); c.Old != 1400 || c.New != 1450 {
		t.Fatalf("change %+v, want 1400 -> 1450 (and nothing for the alias)", c)
	}
	// New devices and removed ones.
	if err := tp.a.IP("link", "add", "hx0", "mtu", "9000", "type", "veth", "peer", "name", "hx1", "mtu", "9000"); err != nil {
		t.Fatal(err)
	}
	seen := map[string]MTUChange{}
	for len(seen) < 2 {
		c := nextChange(t, w)
		seen[c.Ifname] = c
	}
	if seen["hx0"].Old != 0 || seen["hx0"].New != 9000 || seen["hx1"].New != 9000 {
		t.Fatalf("new devices: %+v", seen)
	}
	if err := tp.a.IP("link", "del", "hx0"); err != nil {
		t.Fatal(err)
	}
	seen = map[string]MTUChange{}
	for len(seen) < 2 {
		c := nextChange(t, w)
		seen[c.Ifname] = c
	}
	if seen["hx0"].New != 0 || seen["hx0"].Old != 9000 || seen["hx1"].New != 0 {
		t.Fatalf("removed devices: %+v", seen)
	}

	// Nobody reads while changes pile up; Close still returns and ends the goroutine.
	for _, m := range []string{"1300", "1310", "1320"} {
		tp.a.IP("link", "set", "hn0", "mtu", m)
	}
	for i := 0; i < 20; i++ {
		tp.a.IP("link", "set", "hn0", "mtu", "1280")
		tp.a.IP("link", "set", "hn0", "mtu", "1290")
	}
	done := make(chan error, 1)
	go func() { done <- w.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs while nobody reads")
	}
	for range w.C {
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutines {
		t.Fatalf("%d goroutines after Close, %d before the watch", n, goroutines)
	}
	var nw *MTUWatch
	if err := nw.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestClosedStack(t *testing.T) {
	s, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RouteTo(ip("127.0.0.1")); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("RouteTo: %v", err)
	}
	if _, err := s.WatchMTU(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("WatchMTU: %v", err)
	}
	if _, err := s.ReservePort("tcp4", netip.MustParseAddrPort("127.0.0.1:0"), PortOptions{}); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("ReservePort: %v", err)
	}
}
