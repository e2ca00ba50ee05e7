package netinfo

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

var ip = netip.MustParseAddr

func TestRouteTo(t *testing.T) {
	tp := newTopo(t)
	r, err := tp.sa.RouteTo(ip("10.9.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Gateway != ip("10.9.0.2") || r.NextHop != r.Gateway || r.Ifname != "hn0" || r.Src != ip("10.9.0.1") ||
		r.MTU != 1500 || r.RouteMTU || r.Local() {
		t.Fatalf("via gateway: %+v", r)
	}
	r, err = tp.sa.RouteTo(ip("10.9.0.2"))
	if err != nil || r.Gateway.IsValid() || r.NextHop != ip("10.9.0.2") || r.Ifname != "hn0" {
		t.Fatalf("on-link: %+v, %v", r, err)
	}
	r, err = tp.sa.RouteTo(ip("10.9.4.1"))
	if err != nil || r.MTU != 1300 || !r.RouteMTU {
		t.Fatalf("route with mtu 1300: %+v, %v", r, err)
	}
	r, err = tp.sa.RouteTo(ip("10.9.0.1"))
	if err != nil || !r.Local() {
		t.Fatalf("own address: %+v, %v", r, err)
	}
	r, err = tp.sa.RouteTo(ip("fd00:9::2"))
	if err != nil || r.Ifname != "hn0" || r.Src != ip("fd00:9::1") || r.Gateway.IsValid() {
		t.Fatalf("IPv6 on-link: %+v, %v", r, err)
	}
	// The namespace has no default route.
	_, err = tp.sa.RouteTo(ip("192.0.2.1"))
	var oe *OpError
	if !errors.As(err, &oe) || !errors.Is(err, unix.ENETUNREACH) {
		t.Fatalf("no route: %v", err)
	}
	if _, err := tp.sa.RouteTo(netip.Addr{}); err == nil {
		t.Fatal("invalid address accepted")
	}
}

func addrsOf(s []SourceAddr) []string {
	var out []string
	for _, a := range s {
		out = append(out, a.Addr.Addr().String())
	}
	return out
}

// TestSourceAddrsIPv4: the preferred source comes first and is the address the kernel
// really uses for a connection; the others follow in the kernel's ranking.
func TestSourceAddrsIPv4(t *testing.T) {
	tp := newTopo(t)
	for _, c := range []struct {
		dst  string
		want []string
	}{
		// Next hop 10.9.0.2: the primary address of its subnet, then the other primary,
		// then the secondary 10.9.0.5. 127.0.0.1 (scope host) is not usable.
		{"10.9.2.1", []string{"10.9.0.1", "10.9.1.1", "10.9.0.5"}},
		// The route says src 10.9.1.1.
		{"10.9.3.1", []string{"10.9.1.1", "10.9.0.1", "10.9.0.5"}},
	} {
		got, err := tp.sa.SourceAddrs(ip(c.dst))
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range got {
			t.Logf("%s: %s (%s) %s", c.dst, g.Addr, g.Ifname, g.Why)
		}
		if strings.Join(addrsOf(got), " ") != strings.Join(c.want, " ") {
			t.Fatalf("%s: sources %v, want %v", c.dst, addrsOf(got), c.want)
		}
		if got[0].Ifname != "hn0" || !strings.Contains(got[0].Why, "kernel's choice") {
			t.Errorf("first %+v", got[0])
		}
		_, la := listenIn(t, tp.b, c.dst)
		if used := dialFrom(t, tp.a, la); used.Addr() != got[0].Addr.Addr() {
			t.Fatalf("connect to %s used source %s, SourceAddrs said %s", la, used.Addr(), got[0].Addr)
		}
	}
	// A local destination: loopback's 127.0.0.1 is usable for 127.0.0.1.
	got, err := tp.sa.SourceAddrs(ip("127.0.0.1"))
	if err != nil || len(got) == 0 || got[0].Addr.Addr() != ip("127.0.0.1") {
		t.Fatalf("loopback: %v, %v", addrsOf(got), err)
	}
	if _, err := tp.sa.SourceAddrs(ip("192.0.2.1")); !errors.Is(err, unix.ENETUNREACH) {
		t.Fatalf("unreachable: %v", err)
	}
}

// TestSourceAddrsIPv6: the deprecated address ranks below (rule 3) and link-local
// addresses are not offered for a global destination.
func TestSourceAddrsIPv6(t *testing.T) {
	tp := newTopo(t)
	got, err := tp.sa.SourceAddrs(ip("fd00:9::2"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range got {
		t.Logf("%s (%s) %s", g.Addr, g.Ifname, g.Why)
	}
	if strings.Join(addrsOf(got), " ") != "fd00:9::1 fd00:9::5" {
		t.Fatalf("sources %v, want fd00:9::1 then the deprecated fd00:9::5", addrsOf(got))
	}
	if !strings.Contains(got[1].Why, "rule 3") {
		t.Errorf("deprecated address ranked by %q", got[1].Why)
	}
	_, la := listenIn(t, tp.b, "fd00:9::2")
	if used := dialFrom(t, tp.a, la); used.Addr() != got[0].Addr.Addr() {
		t.Fatalf("connect used %s, SourceAddrs said %s", used.Addr(), got[0].Addr)
	}
}

func TestRankIPv6Rules(t *testing.T) {
	r := Route{Ifindex: 2}
	mk := func(s string, ifindex int, flags uint32, order int) localAddr {
		return localAddr{addr: netip.MustParsePrefix(s), ifindex: ifindex, flags: flags, order: order}
	}
	got := rankIPv6(ip("2001:db8:1::9"), r, []localAddr{
		mk("fe80::1/64", 2, 0, 0),                    // narrower scope: left out
		mk("fd00::1/64", 2, 0, 1),                    // label 5 vs destination's 6
		mk("2001:db8:2::1/64", 3, 0, 2),              // not the outgoing interface
		mk("2001:db8:1::7/64", 2, ifaFTemporary, 3),  // temporary
		mk("2001:db8:1::8/64", 2, 0, 4),              // public, longest prefix
		mk("2001:db8:1::9/64", 3, ifaFDeprecated, 5), // the destination itself
		mk("2001:db8:f::1/64", 2, ifaFTentative, 6),  // tentative: left out
	})
	want := "2001:db8:1::9 2001:db8:1::8 2001:db8:1::7 fd00::1 2001:db8:2::1"
	if s := strings.Join(addrsOf(got), " "); s != want {
		t.Fatalf("got  %s\nwant %s", s, want)
	}
	if v6Label(ip("2001:10::1")) != 7 || v6Label(ip("2001::1")) != 6 || v6Label(ip("::1")) != 0 || v6Label(ip("2a00::1")) != 1 {
		t.Fatal("policy labels")
	}
	if commonPrefix(ip("2001:db8::1"), ip("2001:db8::3")) != 126 {
		t.Fatal("common prefix")
	}
}
