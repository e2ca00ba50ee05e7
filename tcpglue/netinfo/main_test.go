package netinfo

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/zcnet/zcnet/internal/leakcheck"
	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
)

const nsPrefix = "netinfotest"

func TestMain(m *testing.M) {
	netns.RemoveStale(nsPrefix)
	code := leakcheck.Main(m, 0, leakcheck.Check{Name: "netinfo stacks", Open: openStacks.Load})
	if left := netns.Own(nsPrefix); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "leak: network namespaces left behind: %v\n", left)
		code = 1
	}
	os.Exit(code)
}

// topo is two namespaces joined by a veth pair:
//
//	A: hn0 10.9.0.1/24, 10.9.0.5/24 (secondary), 10.9.1.1/24, fd00:9::1/64,
//	   fd00:9::5/64 (deprecated); routes 10.9.2.0/24 via 10.9.0.2,
//	   10.9.3.0/24 via 10.9.0.2 src 10.9.1.1, 10.9.4.0/24 via 10.9.0.2 mtu 1300
//	B: hn1 10.9.0.2/24, 10.9.2.1/24, 10.9.3.1/24, fd00:9::2/64; 10.9.1.0/24 via 10.9.0.1
type topo struct {
	a, b *netns.NS
	sa   *Stack // in A
}

func newTopo(t *testing.T) *topo {
	t.Helper()
	testutil.RequireRoot(t)
	a, err := netns.Create(nsPrefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err := netns.Create(nsPrefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	steps := []struct {
		ns   *netns.NS
		args []string
	}{
		{a, []string{"link", "add", "hn0", "type", "veth", "peer", "name", "hn1", "netns", b.Name}},
		{a, []string{"addr", "add", "10.9.0.1/24", "dev", "hn0"}},
		{a, []string{"addr", "add", "10.9.0.5/24", "dev", "hn0"}},
		{a, []string{"addr", "add", "10.9.1.1/24", "dev", "hn0"}},
		{a, []string{"addr", "add", "fd00:9::1/64", "dev", "hn0", "nodad"}},
		{a, []string{"addr", "add", "fd00:9::5/64", "dev", "hn0", "nodad", "preferred_lft", "0"}},
		{b, []string{"addr", "add", "10.9.0.2/24", "dev", "hn1"}},
		{b, []string{"addr", "add", "10.9.2.1/24", "dev", "hn1"}},
		{b, []string{"addr", "add", "10.9.3.1/24", "dev", "hn1"}},
		{b, []string{"addr", "add", "fd00:9::2/64", "dev", "hn1", "nodad"}},
		{a, []string{"link", "set", "hn0", "up"}},
		{b, []string{"link", "set", "hn1", "up"}},
		{a, []string{"route", "add", "10.9.2.0/24", "via", "10.9.0.2"}},
		{a, []string{"route", "add", "10.9.3.0/24", "via", "10.9.0.2", "src", "10.9.1.1"}},
		{a, []string{"route", "add", "10.9.4.0/24", "via", "10.9.0.2", "mtu", "1300"}},
		{b, []string{"route", "add", "10.9.1.0/24", "via", "10.9.0.1"}},
	}
	for _, s := range steps {
		if err := s.ns.IP(s.args...); err != nil {
			t.Fatal(err)
		}
	}
	sa, err := Open(Options{NetNS: a.Fd()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sa.Close() })
	return &topo{a: a, b: b, sa: sa}
}

// listenIn opens a TCP listener inside ns on addr (port 0) and returns its address.
func listenIn(t *testing.T, ns *netns.NS, addr string) (*tcpglue.Socket, netip.AddrPort) {
	t.Helper()
	var ln *tcpglue.Socket
	err := netns.Do(ns.Fd(), func() (err error) {
		ln, err = tcpglue.Listen("tcp", net.JoinHostPort(addr, "0"), tcpglue.ListenOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	la, err := ln.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	return ln, la
}

// dialFrom connects from inside ns without binding and returns the local address the
// kernel chose.
func dialFrom(t *testing.T, ns *netns.NS, to netip.AddrPort) netip.AddrPort {
	t.Helper()
	var c *tcpglue.Socket
	err := netns.Do(ns.Fd(), func() (err error) {
		c, err = tcpglue.DialAddrPort(to, tcpglue.DialOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	la, err := c.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	return la
}

// macIn returns a device's MAC inside ns.
func macIn(t *testing.T, ns *netns.NS, name string) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	err := netns.Do(ns.Fd(), func() error {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		mac = ifi.HardwareAddr
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

func ifindexIn(t *testing.T, ns *netns.NS, name string) int {
	t.Helper()
	var idx int
	err := netns.Do(ns.Fd(), func() error {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		idx = ifi.Index
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return idx
}
