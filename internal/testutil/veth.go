package testutil

import (
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"testing"

	"github.com/zcnet/zcnet/internal/netns"
)

// VethPair is two network namespaces joined by a veth pair, made for one test by
// NewVethPair and removed when it ends: the server end SrvIf (SrvAddr) in Srv and the
// client end CliIf (CliAddr) in Cli. Both namespaces are fresh, so the interface names are
// fixed.
type VethPair struct {
	Srv, Cli         *netns.NS
	SrvIf, CliIf     string
	SrvIdx, CliIdx   int
	SrvAddr, CliAddr netip.Addr
}

// VethConfig says how NewVethPair builds the pair.
type VethConfig struct {
	// Prefix names the namespaces (netns.Create's prefix); TestMain may pass it to
	// netns.RemoveStale.
	Prefix string
	// Queues is the number of TX and of RX queues on each end; 0 means 1.
	Queues int
	// Server and Client are the ends' addresses with their subnet (10.213.6.1/24).
	Server, Client netip.Prefix
}

// NewVethPair creates the two namespaces (loopback up in each), the veth pair between
// them, its addresses, and brings both ends up. The pair is created inside the server
// namespace with its peer placed in the client one: nothing is ever added to the host's
// namespace. The namespaces, and with them the links and whatever is attached to them,
// are deleted at the test's cleanup, on every path. It skips without root or ip(8).
func NewVethPair(t testing.TB, cfg VethConfig) *VethPair {
	t.Helper()
	RequireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 not installed")
	}
	v := &VethPair{
		SrvIf:   "zveth-s",
		CliIf:   "zveth-c",
		SrvAddr: cfg.Server.Addr(),
		CliAddr: cfg.Client.Addr(),
	}
	var err error
	if v.Srv, err = netns.Create(cfg.Prefix); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Srv.Close() })
	if v.Cli, err = netns.Create(cfg.Prefix); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Cli.Close() })
	q := strconv.Itoa(max(cfg.Queues, 1))
	for _, step := range []struct {
		ns   *netns.NS
		args []string
	}{
		{v.Srv, []string{"link", "add", v.SrvIf, "numtxqueues", q, "numrxqueues", q, "type", "veth",
			"peer", "name", v.CliIf, "netns", v.Cli.Name, "numtxqueues", q, "numrxqueues", q}},
		{v.Srv, []string{"addr", "add", cfg.Server.String(), "dev", v.SrvIf}},
		{v.Cli, []string{"addr", "add", cfg.Client.String(), "dev", v.CliIf}},
		{v.Srv, []string{"link", "set", v.SrvIf, "up"}},
		{v.Cli, []string{"link", "set", v.CliIf, "up"}},
	} {
		if err := step.ns.IP(step.args...); err != nil {
			t.Fatal(err)
		}
	}
	v.SrvIdx = v.ifindex(t, v.Srv, v.SrvIf)
	v.CliIdx = v.ifindex(t, v.Cli, v.CliIf)
	return v
}

func (v *VethPair) ifindex(t testing.TB, ns *netns.NS, name string) int {
	t.Helper()
	var idx int
	v.In(t, ns, func() error {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		idx = ifi.Index
		return nil
	})
	return idx
}

// In runs fn on a thread inside ns (v.Srv or v.Cli; see netns.Do: sockets fn creates stay
// in ns), failing the test on error. Call it from the test's goroutine; elsewhere use
// netns.Do(ns.Fd(), fn).
func (v *VethPair) In(t testing.TB, ns *netns.NS, fn func() error) {
	t.Helper()
	if err := netns.Do(ns.Fd(), fn); err != nil {
		t.Fatal(err)
	}
}
