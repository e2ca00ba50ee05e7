package hwq

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/zcnet/zcnet/internal/leakcheck"
	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/internal/testutil"
)

const nsPrefix = "hwqtest"

func TestMain(m *testing.M) {
	netns.RemoveStale(nsPrefix)
	code := leakcheck.Main(m, 0, leakcheck.Check{Name: "hwq clients", Open: openClients.Load})
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
