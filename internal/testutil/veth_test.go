package testutil

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zcnet/zcnet/internal/netns"
)

// TestVethPair: the pair carries TCP from the client namespace to the server one, each end
// has the queues asked for, the host's namespace does not see either end, and cleanup
// deletes both namespaces.
func TestVethPair(t *testing.T) {
	var names []string
	t.Run("pair", func(t *testing.T) {
		v := NewVethPair(t, VethConfig{
			Prefix: "zctestutil",
			Queues: 3,
			Server: netip.MustParsePrefix("10.213.99.1/24"),
			Client: netip.MustParsePrefix("10.213.99.2/24"),
		})
		names = []string{v.Srv.Name, v.Cli.Name}
		for _, name := range []string{v.SrvIf, v.CliIf} {
			if _, err := net.InterfaceByName(name); err == nil {
				t.Errorf("%s is in the host's namespace", name)
			}
		}
		for _, end := range []struct {
			ns   *netns.NS
			name string
		}{{v.Srv, v.SrvIf}, {v.Cli, v.CliIf}} {
			out, err := exec.Command("ip", "-n", end.ns.Name, "-d", "link", "show", "dev", end.name).CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v: %s", end.name, err, out)
			}
			if s := string(out); !strings.Contains(s, "state UP") || !strings.Contains(s, "numtxqueues 3 numrxqueues 3") {
				t.Errorf("%s in %s: %s", end.name, end.ns.Name, s)
			}
		}
		var ln net.Listener
		v.In(t, v.Srv, func() (err error) {
			ln, err = net.Listen("tcp", netip.AddrPortFrom(v.SrvAddr, 0).String())
			return err
		})
		defer ln.Close()
		var c net.Conn
		v.In(t, v.Cli, func() (err error) {
			c, err = net.Dial("tcp", ln.Addr().String())
			return err
		})
		defer c.Close()
		a, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if got := a.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); got != v.CliAddr {
			t.Errorf("connection from %v, want %v", got, v.CliAddr)
		}
	})
	for _, name := range names {
		if _, err := os.Stat(filepath.Join("/run/netns", name)); !os.IsNotExist(err) {
			t.Errorf("namespace %s left behind (%v)", name, err)
		}
	}
}
