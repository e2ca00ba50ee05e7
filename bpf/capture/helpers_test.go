package capture

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/leakcheck"
	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/internal/testutil"
)

// helperEnv makes the test binary run a helper instead of the tests (the
// privilege test re-executes itself with it).
const helperEnv = "ZCNET_CAPTURE_TEST_HELPER"

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		os.Exit(runHelper(h))
	}
	netns.RemoveStale(nsPrefix)
	// Every kernel object a capture creates (programs, maps, links, the
	// ring) is held by an fd of this process; a leaked one shows here.
	code := leakcheck.Main(m, 2*time.Second, leakcheck.Check{Name: "BPF fds", Open: bpfFDs})
	if ns := netns.Own(nsPrefix); len(ns) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: network namespaces left behind: %v\n", ns)
		code = 1
	}
	os.Exit(code)
}

// bpfFDs counts this process's open BPF fds (programs, maps, links).
func bpfFDs() int64 {
	var n int64
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		target, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err == nil && strings.HasPrefix(target, "anon_inode:bpf-") {
			n++
		}
	}
	return n
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON)")
	}
}

// nsPrefix names the network namespaces the tests create.
const nsPrefix = "zccap"

// newVethPair makes two namespaces joined by a veth pair with queues TX and
// RX queues each way, removed at cleanup (testutil.NewVethPair).
func newVethPair(t *testing.T, queues int) *testutil.VethPair {
	t.Helper()
	return testutil.NewVethPair(t, testutil.VethConfig{
		Prefix: nsPrefix,
		Queues: queues,
		Server: netip.MustParsePrefix("10.213.12.1/24"),
		Client: netip.MustParsePrefix("10.213.12.2/24"),
	})
}

func bpfFlowKey(remote, local netip.AddrPort) bpf.FlowKey {
	return bpf.FlowKey{Remote: remote, Local: local}
}
