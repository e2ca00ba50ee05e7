package hwq

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/leakcheck"
	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/memreg"
)

// xdpFDs counts the process's fds that are AF_XDP sockets (SO_DOMAIN) or BPF programs,
// maps and links.
func xdpFDs() int64 {
	ents, _ := os.ReadDir("/proc/self/fd")
	var n int64
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		switch l {
		case "anon_inode:bpf-prog", "anon_inode:bpf-map", "anon_inode:bpf-link":
			n++
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if d, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN); err == nil && d == unix.AF_XDP {
			n++
		}
	}
	return n
}

const nsPrefix = "hwqtest"

func TestMain(m *testing.M) {
	if spec := os.Getenv(rawChildEnv); spec != "" {
		os.Exit(rawChild(spec))
	}
	netns.RemoveStale(nsPrefix)
	// Raw queues: their sockets (UMEMs and rings go with them), the XDP programs and links of
	// their steering (fds, counted by leakcheck too) and the regions used as UMEMs.
	code := leakcheck.Main(m, 0, leakcheck.Check{Name: "hwq clients", Open: openClients.Load},
		leakcheck.Check{Name: "raw queues (AF_XDP sockets)", Open: openRawQueues.Load},
		leakcheck.Check{Name: "raw-queue steering programs", Open: bpf.OpenRawSteerings},
		leakcheck.Check{Name: "memreg regions (UMEMs)", Open: memreg.OpenRegions},
		leakcheck.Check{Name: "AF_XDP sockets or BPF objects among the fds", Open: xdpFDs})
	// Every namespace a test created must be gone.
	if left := netns.Own(nsPrefix); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "leak: network namespaces left behind: %v\n", left)
		code = 1
	}
	os.Exit(code)
}

// vethEnv is a namespace holding a veth pair (both ends inside it) with several queues,
// and a Client opened in it.
type vethEnv struct {
	ns     *netns.NS
	c      *Client
	a, b   string // the two ends
	queues int
}

// newVeth creates the namespace, the pair "hq0"/"hq1" with n TX and RX queues, brings both
// up, and opens a Client in the namespace. Everything is removed when the test ends.
func newVeth(t *testing.T, n int) *vethEnv {
	t.Helper()
	testutil.RequireRoot(t)
	ns, err := netns.Create(nsPrefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	q := strconv.Itoa(n)
	if err := ns.IP("link", "add", "hq0", "numtxqueues", q, "numrxqueues", q, "type", "veth",
		"peer", "name", "hq1", "numtxqueues", q, "numrxqueues", q); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"hq0", "hq1"} {
		if err := ns.IP("link", "set", l, "up"); err != nil {
			t.Fatal(err)
		}
	}
	c, err := Open(Options{NetNS: ns.Fd()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &vethEnv{ns: ns, c: c, a: "hq0", b: "hq1", queues: n}
}

func mustIfindex(t *testing.T, c *Client, name string) int {
	t.Helper()
	idx, err := c.Ifindex(name)
	if err != nil {
		t.Fatal(err)
	}
	return idx
}
