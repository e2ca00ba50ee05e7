package capture

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/leakcheck"
)

// helperEnv makes the test binary run a helper instead of the tests (the
// privilege test re-executes itself with it).
const helperEnv = "ZCNET_CAPTURE_TEST_HELPER"

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		os.Exit(runHelper(h))
	}
	// Every kernel object a capture creates (programs, maps, links, the
	// ring) is held by an fd of this process; a leaked one shows here.
	os.Exit(leakcheck.Main(m, 2*time.Second, leakcheck.Check{Name: "BPF fds", Open: bpfFDs}))
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

// vethPair is two network namespaces joined by a veth pair, created for
// one test and removed at cleanup. Nothing is added to the host namespace.
type vethPair struct {
	srvNS, cliNS     string
	srvIf, cliIf     string
	srvIdx, cliIdx   int
	srvAddr, cliAddr netip.Addr
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

var vethSeq int

func newVethPair(t *testing.T, queues int) *vethPair {
	t.Helper()
	requireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 not installed")
	}
	vethSeq++
	id := fmt.Sprintf("%d%c", os.Getpid()%100000, 'a'+vethSeq%26)
	v := &vethPair{
		srvNS:   "zccap-s" + id,
		cliNS:   "zccap-c" + id,
		srvIf:   "zks" + id,
		cliIf:   "zkc" + id,
		srvAddr: netip.MustParseAddr("10.213.12.1"),
		cliAddr: netip.MustParseAddr("10.213.12.2"),
	}
	ipCmd(t, "netns", "add", v.srvNS)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", v.srvNS).Run() })
	ipCmd(t, "netns", "add", v.cliNS)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", v.cliNS).Run() })
	q := fmt.Sprint(queues)
	ipCmd(t, "-n", v.srvNS, "link", "add", v.srvIf, "numtxqueues", q, "numrxqueues", q,
		"type", "veth", "peer", "name", v.cliIf, "netns", v.cliNS, "numtxqueues", q, "numrxqueues", q)
	ipCmd(t, "-n", v.srvNS, "addr", "add", v.srvAddr.String()+"/24", "dev", v.srvIf)
	ipCmd(t, "-n", v.cliNS, "addr", "add", v.cliAddr.String()+"/24", "dev", v.cliIf)
	for _, ns := range []string{v.srvNS, v.cliNS} {
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	ipCmd(t, "-n", v.srvNS, "link", "set", v.srvIf, "up")
	ipCmd(t, "-n", v.cliNS, "link", "set", v.cliIf, "up")
	v.srvIdx = v.ifindex(t, v.srvNS, v.srvIf)
	v.cliIdx = v.ifindex(t, v.cliNS, v.cliIf)
	return v
}

func (v *vethPair) ifindex(t *testing.T, ns, name string) int {
	t.Helper()
	var idx int
	v.in(t, ns, func() error {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		idx = ifi.Index
		return nil
	})
	return idx
}

// in runs fn in namespace ns, failing the test on error.
func (v *vethPair) in(t *testing.T, ns string, fn func() error) {
	t.Helper()
	if err := inNetns("/run/netns/"+ns, fn); err != nil {
		t.Fatal(err)
	}
}

// inNetns runs fn on an OS thread switched into the network namespace at
// path; the thread is discarded afterwards. Sockets fn creates stay in that
// namespace and can be used from any goroutine.
func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with us
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func bpfFlowKey(remote, local netip.AddrPort) bpf.FlowKey {
	return bpf.FlowKey{Remote: remote, Local: local}
}
