package zc

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
)

const steerChildEnv = "ZC_STEER_CHILD"

func steerEngine(t *testing.T, mode SteeringMode) (*Engine, *Listener, *peerEvents) {
	testutil.RequireRoot(t)
	testutil.SkipIfNotSupported(t, bpf.Probe(), "6.6")
	e := newEngine(t, Config{Queues: 2, Steering: mode, NoPin: true})
	l, ev := listenEvents(t, e)
	if l.Steering() == nil {
		t.Fatalf("no steering: %s", l.Stats().Steering.Fallback)
	}
	return e, l, ev
}

func dialFrom(t *testing.T, from string, to netip.AddrPort) *tcpglue.Socket {
	s, err := tcpglue.DialAddrPort(to, tcpglue.DialOptions{LocalAddr: netip.MustParseAddrPort(from)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSteeringFlowTableAndDrain(t *testing.T) {
	_, l, ev := steerEngine(t, SteerBPF)
	st := l.Steering()
	srvAddr := l.Addr().(interface{ AddrPort() netip.AddrPort }).AddrPort()
	for _, c := range []struct {
		peer  string
		queue int
	}{{"127.0.0.2", 1}, {"127.0.0.3", 0}, {"127.0.0.4", 1}} {
		key := bpf.FlowKey{Remote: netip.AddrPortFrom(netip.MustParseAddr(c.peer), 0), Local: srvAddr}
		if err := st.SetFlow(key, c.queue); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			dialFrom(t, c.peer+":0", srvAddr)
			conn := recvEvent(t, ev.conn, "accept")
			if conn.q.idx != c.queue {
				t.Fatalf("flow from %s landed on queue %d, programmed %d", c.peer, conn.q.idx, c.queue)
			}
		}
	}
	// Drain queue 0: new connections without a flow entry avoid it, the old ones keep working.
	if err := st.Drain(0, true); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		dialFrom(t, "127.0.0.5:0", srvAddr)
		if q := recvEvent(t, ev.conn, "accept").q.idx; q != 1 {
			t.Fatalf("connection landed on drained queue %d", q)
		}
	}
	if err := st.Drain(0, false); err != nil {
		t.Fatal(err)
	}
}

func TestSteeringNoStaleFlows(t *testing.T) {
	e, l, ev := steerEngine(t, SteerAuto)
	srvAddr := l.Addr().(interface{ AddrPort() netip.AddrPort }).AddrPort()
	var conns []*Conn
	for i := 0; i < 100; i++ {
		s := dialFrom(t, "127.0.0.6:0", srvAddr)
		conns = append(conns, recvEvent(t, ev.conn, "accept"))
		s.Close()
	}
	for _, c := range conns {
		c.Close()
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("connection did not close after its peer left")
		}
	}
	learned, err := l.Steering().Learned()
	if err != nil {
		t.Fatal(err)
	}
	for k := range learned {
		if k.Remote.Addr() == netip.MustParseAddr("127.0.0.6") {
			t.Fatalf("stale flow %v after churn (%d learned)", k, len(learned))
		}
	}
	if e.Stats().Steering.Fallbacks != 0 {
		t.Fatal("fallback counted although steering loaded")
	}
}

// TestSteeringFallback runs a child without CAP_BPF/CAP_NET_ADMIN: SteerAuto falls back to
// SO_REUSEPORT hashing visibly, SteerBPF fails with the typed error.
func TestSteeringFallback(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to drop capabilities in a child")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	cmd := exec.Command(setpriv, "--bounding-set", "-bpf,-sys_admin,-net_admin,-perfmon", "--inh-caps", "-all", "--", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), steerChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "STEER-FALLBACK-OK") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

func steerChild() int {
	e, err := New(Config{Queues: 2, NoPin: true, SendBufs: 16, RecvBufs: 16, SendBufSize: 16 << 10, RecvBufSize: 16 << 10})
	if err != nil {
		println("new:", err.Error())
		return 1
	}
	defer e.Close()
	l, err := e.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return HandlerFuncs{} })
	if err != nil {
		println("listen:", err.Error())
		return 1
	}
	defer l.Close()
	if l.Steering() != nil || l.Stats().Steering.Fallback == "" || e.Stats().Steering.Fallbacks != 1 {
		println("fallback not visible")
		return 1
	}
	println("fallback:", l.Stats().Steering.Fallback)
	// Interfaces asked for: reported and counted, not attached; the listener works.
	li, err := e.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return HandlerFuncs{} }, ListenOptions{SteerInterfaces: []string{"lo"}})
	if err != nil {
		println("listen with interfaces:", err.Error())
		return 1
	}
	defer li.Close()
	lst := li.Stats()
	info := lst.Steering
	if info.BPF || info.Fallback == "" || len(info.Interfaces) != 1 || info.Interfaces[0].XDP || info.Interfaces[0].TC ||
		info.Interfaces[0].Reason == "" || e.Stats().Steering.AttachFallbacks != 1 || e.Stats().Steering.Fallbacks != 2 {
		println("interface fallback not visible:", lst.SteeringSummary)
		return 1
	}
	println("interfaces:", lst.SteeringSummary)
	if _, err := e.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return HandlerFuncs{} }, ListenOptions{SteerInterfaces: []string{"zcnope0"}}); !errors.Is(err, ErrInvalid) {
		println("unknown interface without BPF:", err)
		return 1
	}
	e2, err := New(Config{Queues: 2, NoPin: true, Steering: SteerBPF, SendBufs: 16, RecvBufs: 16, SendBufSize: 16 << 10, RecvBufSize: 16 << 10})
	if err != nil {
		println("new:", err.Error())
		return 1
	}
	defer e2.Close()
	_, err = e2.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return HandlerFuncs{} })
	if !errors.Is(err, bpf.ErrPermission) {
		println("SteerBPF without privileges:", err)
		return 1
	}
	println("forbidden fallback:", err.Error())
	println("STEER-FALLBACK-OK")
	return 0
}

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{
		"0-3\n":       {0, 1, 2, 3},
		"0":           {0},
		"0-1,8,10-11": {0, 1, 8, 10, 11},
		"":            nil,
		"2,4-5\n":     {2, 4, 5},
	} {
		got, err := parseCPUList(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"a", "3-1", "-1", "1-", "0-99999999", "1,,2"} {
		if got, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) = %v, want an error", bad, got)
		}
	}
}

func TestCPUQueueMap(t *testing.T) {
	topo := func(n int, levels ...map[int]int) cpuTopology { return cpuTopology{ncpu: n, levels: levels} }
	// 16 CPUs, nothing known about them; 4 queues on CPUs 0..3: the queues' CPUs map to
	// them, every other CPU to none (the hash places its SYNs: mapping CPUs to "nearby"
	// queues sent every connection of a one-CPU client to one queue).
	m := cpuQueueMap([]int{0, 1, 2, 3}, topo(16))
	want := []int{0, 1, 2, 3, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}
	if !slices.Equal(m, want) {
		t.Errorf("flat 16/4: %v, want %v", m, want)
	}
	// Two NUMA nodes (0-3, 4-7) and an L3 each, queues on CPUs 1 and 6: only those CPUs.
	node := map[int]int{}
	for c := 0; c < 8; c++ {
		node[c] = c / 4
	}
	if got, want := cpuQueueMap([]int{1, 6}, topo(8, map[int]int{}, node, node)), []int{-1, 0, -1, -1, -1, -1, 1, -1}; !slices.Equal(got, want) {
		t.Errorf("two nodes: %v, want %v", got, want)
	}
	// SMT siblings (c, c+4): queues on CPUs 0 and 1: CPU 4 → queue 0 (its sibling), 5 →
	// queue 1, CPUs 2, 3, 6, 7 (no queue on their core) none.
	smt, l3 := map[int]int{}, map[int]int{}
	for c := 0; c < 4; c++ {
		smt[c], smt[c+4] = c, c
		l3[c], l3[c+4] = 0, 0
	}
	if got, want := cpuQueueMap([]int{0, 1}, topo(8, smt, l3)), []int{0, 1, -1, -1, 0, 1, -1, -1}; !slices.Equal(got, want) {
		t.Errorf("smt: %v, want %v", got, want)
	}
	// Two queues on one core's two threads, a third thread of that core (SMT4): the least
	// loaded sibling queue, then the lowest index.
	smt4 := map[int]int{0: 0, 1: 0, 2: 0, 3: 0}
	if got, want := cpuQueueMap([]int{0, 1}, topo(4, smt4)), []int{0, 1, 0, 1}; !slices.Equal(got, want) {
		t.Errorf("smt4: %v, want %v", got, want)
	}
	// Queues sharing a CPU: the lowest queue owns it; the other queue gets nothing.
	if got, want := cpuQueueMap([]int{0, 0, 1}, topo(2)), []int{0, 2}; !slices.Equal(got, want) {
		t.Errorf("shared: %v, want %v", got, want)
	}
	// A queue CPU beyond the possible CPUs is ignored; no queue at all maps nothing.
	if got, want := cpuQueueMap([]int{5}, topo(2)), []int{-1, -1}; !slices.Equal(got, want) {
		t.Errorf("out of range: %v, want %v", got, want)
	}
	// This machine: CPU 0 and its SMT siblings map to the queue, no other CPU.
	if tp := readTopology(); tp.ncpu > 0 {
		for c, q := range cpuQueueMap([]int{0}, tp) {
			sib := c == 0
			if g, ok := tp.levels[0][c]; ok && c != 0 {
				h, ok0 := tp.levels[0][0]
				sib = ok0 && g == h
			}
			if want := map[bool]int{true: 0, false: -1}[sib]; q != want {
				t.Errorf("this machine: CPU %d → %d, want %d", c, q, want)
			}
		}
	}
}

func TestChoosePolicy(t *testing.T) {
	for _, c := range []struct {
		name          string
		asked         bpf.Policy
		pinned        []int
		noPin         bool
		want          bpf.Policy
		exact         bool
		reasonContain string
	}{
		{"auto pinned", bpf.PolicyAuto, []int{0, 1}, false, bpf.PolicyCPU, true, "auto"},
		{"auto nopin", bpf.PolicyAuto, []int{-1, -1}, true, bpf.PolicyHash, false, "NoPin"},
		{"auto refused", bpf.PolicyAuto, []int{0, -1}, false, bpf.PolicyHash, false, "not pinned"},
		{"auto shared", bpf.PolicyAuto, []int{0, 1, 0}, false, bpf.PolicyHash, false, "share CPU 0"},
		{"auto one queue", bpf.PolicyAuto, []int{0}, false, bpf.PolicyHash, false, "one queue"},
		{"cpu nopin", bpf.PolicyCPU, []int{-1, -1}, true, bpf.PolicyCPU, false, "cannot be exact"},
		{"cpu pinned", bpf.PolicyCPU, []int{0, 1}, false, bpf.PolicyCPU, true, "asked"},
		{"hash", bpf.PolicyHash, []int{0, 1}, false, bpf.PolicyHash, false, "PolicyHash"},
		{"dscp", bpf.PolicyDSCP, []int{0, 1}, false, bpf.PolicyDSCP, false, "asked"},
	} {
		nominal := []int{0, 1, 0}[:len(c.pinned)]
		p, exact, why := choosePolicy(c.asked, c.pinned, nominal, c.noPin)
		if p != c.want || exact != c.exact || !strings.Contains(why, c.reasonContain) {
			t.Errorf("%s: %v exact=%v %q; want %v exact=%v containing %q", c.name, p, exact, why, c.want, c.exact, c.reasonContain)
		}
	}
}

func TestSteerPolicyConfig(t *testing.T) {
	for _, p := range []bpf.Policy{bpf.PolicyHash | bpf.PolicyCPU, 8, bpf.PolicyHash | bpf.PolicyDSCP} {
		_, err := New(Config{Queues: 1, NoPin: true, SteerPolicy: p})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "SteerPolicy" || !errors.Is(err, ErrInvalid) {
			t.Errorf("SteerPolicy %v: %v", p, err)
		}
	}
}

func TestSteerInterfacesBadInput(t *testing.T) {
	e := newEngine(t, Config{Queues: 2, NoPin: true})
	eh := newEngine(t, Config{Queues: 2, NoPin: true, Steering: SteerReuseportHash})
	nop := func(*Conn) Handler { return HandlerFuncs{} }
	cases := map[string]struct {
		e     *Engine
		names []string
	}{
		"hash mode":     {eh, []string{"lo"}},
		"empty name":    {e, []string{""}},
		"twice":         {e, []string{"lo", "lo"}},
		"slash":         {e, []string{"a/b"}},
		"too long":      {e, []string{"abcdefghijklmnopq"}},
		"no such iface": {e, []string{"zcnope0"}},
	}
	before := openFDCount(t)
	for name, c := range cases {
		l, err := c.e.Listen("tcp", "127.0.0.1:0", nop, ListenOptions{SteerInterfaces: c.names})
		if err == nil {
			l.Close()
			t.Errorf("%s: Listen succeeded", name)
			continue
		}
		var oe *OpError
		if !errors.As(err, &oe) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want an *OpError matching ErrInvalid", name, err)
		}
	}
	if after := openFDCount(t); after != before {
		t.Errorf("fds: %d before, %d after refused listens", before, after)
	}
}

func openFDCount(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// pinnedCPUs returns the first n CPUs this process may use, skipping the test when there
// are fewer.
func pinnedCPUs(t *testing.T, n int) []int {
	cpus := allowedCPUs()
	if len(cpus) < n {
		t.Skipf("needs %d CPUs, this process may use %v", n, cpus)
	}
	return cpus[:n]
}

// onCPU runs fn on a thread pinned to cpu (in the current network namespace).
func onCPU(cpu int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// TestSteeringDefaultCPUPolicy: with pinned queues and the zero SteerPolicy, a connection
// lands on the queue of the CPU that sent its SYN (on loopback the SYN is processed on the
// sending CPU), the map covers every possible CPU, and the report and counters say so.
func TestSteeringDefaultCPUPolicy(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.SkipIfNotSupported(t, bpf.Probe(), "6.6")
	cpus := pinnedCPUs(t, 2)
	e := newEngine(t, Config{Queues: 2})
	l, ev := listenEvents(t, e)
	info := l.Stats().Steering
	t.Logf("steering: %v", info)
	if l.Steering() == nil || !info.BPF || info.Policy != bpf.PolicyCPU || !info.Exact {
		t.Fatalf("default policy: %+v", info)
	}
	if !slices.Equal(info.QueueCPUs, cpus) {
		t.Fatalf("queue CPUs %v, want %v", info.QueueCPUs, cpus)
	}
	topo := readTopology()
	if len(info.CPUQueues) != topo.ncpu {
		t.Fatalf("CPU map has %d entries, %d possible CPUs", len(info.CPUQueues), topo.ncpu)
	}
	for c, q := range info.CPUQueues {
		if q < -1 || q > 1 || q == -1 && slices.Contains(cpus, c) {
			t.Fatalf("CPU %d maps to queue %d", c, q)
		}
	}
	for q, c := range cpus {
		if info.CPUQueues[c] != q {
			t.Fatalf("CPU %d of queue %d maps to queue %d", c, q, info.CPUQueues[c])
		}
	}
	if st := e.Stats(); st.Steering.CPU != 1 || st.Steering.PolicyFallbacks != 0 || st.Steering.Fallbacks != 0 {
		t.Fatalf("stats: cpu %d, policy fallbacks %d, fallbacks %d", st.Steering.CPU, st.Steering.PolicyFallbacks, st.Steering.Fallbacks)
	}
	srv := l.Addr().(*net.TCPAddr).AddrPort()
	s0, _ := l.Steering().Stats()
	for round := 0; round < 3; round++ {
		for q, cpu := range cpus {
			var s *tcpglue.Socket
			err := onCPU(cpu, func() error {
				var err error
				s, err = tcpglue.DialAddrPort(srv, tcpglue.DialOptions{})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			if got := recvEvent(t, ev.conn, "accept").q.idx; got != q {
				t.Fatalf("SYN sent from CPU %d landed on queue %d, want %d (the queue pinned there)", cpu, got, q)
			}
		}
	}
	s1, _ := l.Steering().Stats()
	if d := s1.ReuseportCPU - s0.ReuseportCPU; d != 6 {
		t.Errorf("ReuseportCPU grew by %d, want 6", d)
	}
}

// TestSteeringPolicyReport: what each policy choice reports and counts when it cannot be
// exact, and an explicit PolicyHash.
func TestSteeringPolicyReport(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.SkipIfNotSupported(t, bpf.Probe(), "6.6")
	// NoPin + auto: the hash, visibly.
	e := newEngine(t, Config{Queues: 2, NoPin: true})
	l, _ := listenEvents(t, e)
	info := l.Stats().Steering
	if !info.BPF || info.Policy != bpf.PolicyHash || info.Exact || !strings.Contains(info.PolicyReason, "NoPin") || info.CPUQueues != nil {
		t.Errorf("NoPin, auto: %+v", info)
	}
	if !slices.Equal(info.QueueCPUs, []int{-1, -1}) {
		t.Errorf("NoPin queue CPUs %v", info.QueueCPUs)
	}
	if st := e.Stats(); st.Steering.PolicyFallbacks != 1 || st.Steering.CPU != 0 {
		t.Errorf("NoPin, auto: policy fallbacks %d, cpu %d", st.Steering.PolicyFallbacks, st.Steering.CPU)
	}
	if s := l.Stats().SteeringSummary; !strings.Contains(s, "policy hash") || !strings.Contains(s, "NoPin") {
		t.Errorf("report %q", s)
	}
	// NoPin + PolicyCPU asked: used, not exact, and the map names the nominal CPUs.
	e2 := newEngine(t, Config{Queues: 2, NoPin: true, SteerPolicy: bpf.PolicyCPU})
	l2, _ := listenEvents(t, e2)
	info = l2.Stats().Steering
	if info.Policy != bpf.PolicyCPU || info.Exact || !strings.Contains(info.PolicyReason, "cannot be exact") || len(info.CPUQueues) == 0 {
		t.Errorf("NoPin, PolicyCPU: %+v", info)
	}
	if s := l2.Stats().SteeringSummary; !strings.Contains(s, "not exact") {
		t.Errorf("report %q", s)
	}
	if st := e2.Stats(); st.Steering.CPU != 1 || st.Steering.PolicyFallbacks != 0 {
		t.Errorf("NoPin, PolicyCPU: cpu %d, policy fallbacks %d", st.Steering.CPU, st.Steering.PolicyFallbacks)
	}
	// PolicyHash asked: the hash, nothing counted as a fallback.
	e3 := newEngine(t, Config{Queues: 2, SteerPolicy: bpf.PolicyHash})
	l3, _ := listenEvents(t, e3)
	info = l3.Stats().Steering
	if info.Policy != bpf.PolicyHash || !strings.Contains(info.PolicyReason, "PolicyHash") {
		t.Errorf("PolicyHash: %+v", info)
	}
	if st := e3.Stats(); st.Steering.CPU != 0 || st.Steering.PolicyFallbacks != 0 {
		t.Errorf("PolicyHash: cpu %d, policy fallbacks %d", st.Steering.CPU, st.Steering.PolicyFallbacks)
	}
	// Not asked at all.
	e4 := newEngine(t, Config{Queues: 2, NoPin: true, Steering: SteerReuseportHash})
	l4, _ := listenEvents(t, e4)
	if st := l4.Stats(); st.Steering.BPF || st.Steering.Mode != SteerReuseportHash || !strings.Contains(st.SteeringSummary, "reuseport hash") {
		t.Errorf("SteerReuseportHash: %+v", info)
	}
}

const steerNSPrefix = "zcsteer"

// steerVeth is two namespaces created for one test, joined by a veth pair with two queues
// each way: the server end srvIf (10.213.7.1) and the client end cliIf (10.213.7.2).
type steerVeth struct {
	srv, cli       *netns.NS
	srvIdx, cliIdx int
}

// The ends' names, as testutil.NewVethPair gives them.
const (
	steerSrvIf = "zveth-s"
	steerCliIf = "zveth-c"
)

// newSteerVeth joins two fresh namespaces with a 2-queue veth pair (10.213.7.1 server, .2
// client). The client keeps veth's TX checksum offload (the default): zc's generic-mode XDP
// on veth must keep the checksum state of what it redirects.
func newSteerVeth(t *testing.T) *steerVeth {
	t.Helper()
	p := testutil.NewVethPair(t, testutil.VethConfig{Prefix: steerNSPrefix, Queues: 2,
		Server: netip.MustParsePrefix("10.213.7.1/24"), Client: netip.MustParsePrefix("10.213.7.2/24")})
	if p.SrvIf != steerSrvIf || p.CliIf != steerCliIf {
		t.Fatalf("veth ends %s/%s, want %s/%s", p.SrvIf, p.CliIf, steerSrvIf, steerCliIf)
	}
	return &steerVeth{srv: p.Srv, cli: p.Cli, srvIdx: p.SrvIdx, cliIdx: p.CliIdx}
}

// xdpAttached reports whether the interface in ns has an XDP program (ip -d link show).
func xdpAttached(t *testing.T, ns *netns.NS, ifname string) bool {
	t.Helper()
	out, err := exec.Command("ip", "-n", ns.Name, "-d", "link", "show", "dev", ifname).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show: %v: %s", err, out)
	}
	return strings.Contains(string(out), "xdp")
}

// tcxEgressPrograms counts the tcx egress programs on the interface in ns.
func tcxEgressPrograms(t *testing.T, ns *netns.NS, idx int) int {
	t.Helper()
	n := 0
	err := netns.Do(ns.Fd(), func() error {
		r, err := link.QueryPrograms(link.QueryOptions{Target: idx, Attach: ebpf.AttachTCXEgress})
		if err != nil {
			return err
		}
		n = len(r.Programs)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// echoRoundTrip writes n random bytes to c and reads them back (the server echoes).
func echoRoundTrip(c net.Conn, n int) error {
	c.SetDeadline(time.Now().Add(20 * time.Second))
	p := make([]byte, n)
	rand.Read(p)
	errc := make(chan error, 1)
	go func() {
		got := make([]byte, n)
		if _, err := io.ReadFull(c, got); err != nil {
			errc <- err
			return
		}
		if !bytes.Equal(got, p) {
			errc <- errors.New("echo differs from what was sent")
			return
		}
		errc <- nil
	}()
	if _, err := c.Write(p); err != nil {
		return err
	}
	return <-errc
}

// TestSteerInterfacesVeth: a listener that attaches XDP and tc egress to its veth steers
// each flow end to end: the SYN lands on the queue of the CPU that sent it (CPU policy),
// every later packet is redirected to the CPU of the queue that owns the flow (also when
// the flow table names another queue than the receiving CPU's), and the answers leave on
// the TX queue of that queue (the client's RX queue of the same number). A second listener
// cannot take the interface's XDP hook: SteerBPF fails, SteerAuto reports and counts it.
// Close (and Engine.Close) detach everything.
func TestSteerInterfacesVeth(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.SkipIfNotSupported(t, bpf.Probe(), "6.6")
	cpus := pinnedCPUs(t, 2)
	v := newSteerVeth(t)
	e := newEngine(t, Config{Queues: 2})
	accepted := make(chan *Conn, 64)
	accept := func(c *Conn) Handler {
		accepted <- c
		return echoAccept(c)
	}
	listen := func(e *Engine) (*Listener, error) {
		var l *Listener
		err := netns.Do(v.srv.Fd(), func() error {
			var err error
			l, err = e.Listen("tcp", "10.213.7.1:0", accept, ListenOptions{SteerInterfaces: []string{steerSrvIf}})
			return err
		})
		return l, err
	}
	l, err := listen(e)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	info := l.Stats().Steering
	t.Logf("steering: %v", info)
	if len(info.Interfaces) != 1 {
		t.Fatalf("interfaces %+v", info.Interfaces)
	}
	is := info.Interfaces[0]
	if !is.XDP || !is.XDPRedirect || !is.TC || is.XPS || is.Reason != "" || is.Index != v.srvIdx {
		t.Fatalf("interface %+v", is)
	}
	if !strings.Contains(is.Note, "generic") {
		t.Errorf("no veth note: %+v", is)
	}
	if info.Policy != bpf.PolicyCPU || !info.Exact {
		t.Fatalf("policy %v exact %v", info.Policy, info.Exact)
	}
	if st := e.Stats(); st.Steering.AttachFallbacks != 0 {
		t.Fatalf("attach fallbacks %d", st.Steering.AttachFallbacks)
	}
	if !xdpAttached(t, v.srv, steerSrvIf) || tcxEgressPrograms(t, v.srv, v.srvIdx) != 1 {
		t.Fatal("XDP or tc egress not attached")
	}

	// The client counts its packets per RX queue with an XDP program of its own.
	var cli *bpf.Steering
	err = netns.Do(v.cli.Fd(), func() error {
		var err error
		if cli, err = bpf.NewSteering(nil, &bpf.Options{Queues: 2}); err != nil {
			return err
		}
		return cli.AttachXDP(v.cliIdx, bpf.XDPDriver)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	srvSt := l.Steering()
	server := "10.213.7.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	// flow connects from a client thread pinned on fromCPU, echoes 256 KiB and checks the
	// connection was owned by queue wantQ and its packets went to wantQ's CPU and TX queue.
	flow := func(fromCPU, wantQ int) {
		t.Helper()
		s0, _ := srvSt.Stats()
		c0, _ := cli.Stats()
		err := netns.Do(v.cli.Fd(), func() error {
			var set unix.CPUSet
			set.Set(fromCPU)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				return err
			}
			d := net.Dialer{Timeout: 5 * time.Second}
			d.SetMultipathTCP(false)
			c, err := d.Dial("tcp", server)
			if err != nil {
				return err
			}
			defer c.Close()
			return echoRoundTrip(c, 256<<10)
		})
		if err != nil {
			st, _ := srvSt.Stats()
			t.Fatalf("flow from CPU %d: %v\nserver %+v", fromCPU, err, st)
		}
		if q := recvEvent(t, accepted, "accept").q.idx; q != wantQ {
			t.Fatalf("flow from CPU %d accepted on queue %d, want %d", fromCPU, q, wantQ)
		}
		time.Sleep(50 * time.Millisecond) // let the FIN/ACKs pass
		s1, _ := srvSt.Stats()
		c1, _ := cli.Stats()
		cpu := cpus[wantQ]
		redirected := s1.Queues[wantQ].XDPRedirected - s0.Queues[wantQ].XDPRedirected
		onCPU := s1.CPUPackets[cpu] - s0.CPUPackets[cpu]
		tcMapped := s1.Queues[wantQ].TCMapped - s0.Queues[wantQ].TCMapped
		var rx [2]uint64
		for i := range rx {
			rx[i] = c1.RxQueuePackets[i] - c0.RxQueuePackets[i]
		}
		t.Logf("from CPU %d: queue %d (CPU %d): XDP redirected %d, delivered on CPU %d: %d; tc mapped %d; client RX queues %v",
			fromCPU, wantQ, cpu, redirected, cpu, onCPU, tcMapped, rx)
		if redirected < 20 {
			t.Errorf("only %d packets redirected to queue %d's CPU", redirected, wantQ)
		}
		if onCPU < redirected*9/10 {
			t.Errorf("%d packets redirected to CPU %d, %d arrived there", redirected, cpu, onCPU)
		}
		// The server's side of a 256 KiB echo is a couple of dozen GSO packets (19–23 seen:
		// their count follows the segment sizes the stack picks): a handful proves the map.
		if tcMapped < 8 {
			t.Errorf("tc mapped only %d packets to TX queue %d", tcMapped, wantQ)
		}
		// What the server sent for this flow left on TX queue wantQ, i.e. arrived on the
		// client's RX queue wantQ (veth pairs TX queue i with the peer's RX queue i). A
		// stray ARP may land elsewhere.
		if rx[wantQ] < tcMapped*9/10 || rx[1-wantQ] > 4 {
			t.Errorf("client RX queues %v for %d packets mapped to TX queue %d", rx, tcMapped, wantQ)
		}
	}
	// CPU policy: each CPU's SYN goes to the queue pinned there.
	for q, cpu := range cpus {
		flow(cpu, q)
	}
	// Flow table: every connection of the client goes to queue 1, even from queue 0's CPU:
	// XDP moves its packets over to CPU 1.
	peer := bpf.FlowKey{Remote: netip.MustParseAddrPort("10.213.7.2:0"), Local: l.Addr().(*net.TCPAddr).AddrPort()}
	if err := srvSt.SetFlow(peer, 1); err != nil {
		t.Fatal(err)
	}
	flow(cpus[0], 1)
	if err := srvSt.DeleteFlow(peer); err != nil {
		t.Fatal(err)
	}

	// A second listener wants the same interface: the XDP hook is taken.
	eb := newEngine(t, Config{Queues: 2, Steering: SteerBPF})
	if lb, err := listen(eb); err == nil {
		lb.Close()
		t.Fatal("SteerBPF listener took an interface whose XDP hook is in use")
	} else if oe := (*OpError)(nil); !errors.As(err, &oe) || !strings.Contains(err.Error(), "attach xdp") {
		t.Fatalf("SteerBPF on a busy interface: %v", err)
	} else {
		t.Logf("SteerBPF on a busy interface: %v", err)
	}
	ea := newEngine(t, Config{Queues: 2})
	la, err := listen(ea)
	if err != nil {
		t.Fatal(err)
	}
	ia := la.Stats().Steering.Interfaces[0]
	if ia.XDP || ia.XDPRedirect || !ia.TC || !strings.Contains(ia.Reason, "attach xdp") {
		t.Fatalf("SteerAuto on a busy interface: %+v", ia)
	}
	if st := ea.Stats(); st.Steering.AttachFallbacks != 1 {
		t.Fatalf("SteerAuto on a busy interface: %d attach fallbacks", st.Steering.AttachFallbacks)
	}
	if n := tcxEgressPrograms(t, v.srv, v.srvIdx); n != 2 {
		t.Fatalf("%d tcx egress programs with two listeners", n)
	}
	la.Close()
	<-la.Done()
	if n := tcxEgressPrograms(t, v.srv, v.srvIdx); n != 1 || !xdpAttached(t, v.srv, steerSrvIf) {
		t.Fatalf("after closing the second listener: %d tcx programs, xdp %v", n, xdpAttached(t, v.srv, steerSrvIf))
	}
	l.Close()
	<-l.Done()
	if n := tcxEgressPrograms(t, v.srv, v.srvIdx); n != 0 || xdpAttached(t, v.srv, steerSrvIf) {
		t.Fatalf("after Close: %d tcx programs, xdp %v", n, xdpAttached(t, v.srv, steerSrvIf))
	}
	// Engine.Close detaches what its listeners attached.
	if _, err := listen(ea); err != nil {
		t.Fatal(err)
	}
	if !xdpAttached(t, v.srv, steerSrvIf) {
		t.Fatal("XDP not attached")
	}
	ea.Close()
	if n := tcxEgressPrograms(t, v.srv, v.srvIdx); n != 0 || xdpAttached(t, v.srv, steerSrvIf) {
		t.Fatalf("after Engine.Close: %d tcx programs, xdp %v", n, xdpAttached(t, v.srv, steerSrvIf))
	}
}

// TestQueuePlacementIgnoresThreadPinning: an engine created on a thread that another
// goroutine pinned to one CPU still spreads its queues over every CPU the process has.
func TestQueuePlacementIgnoresThreadPinning(t *testing.T) {
	cpus := pinnedCPUs(t, 2)
	var e *Engine
	err := onCPU(cpus[1], func() error {
		var err error
		e, err = New(Config{Queues: 2, SendBufs: 16, RecvBufs: 16})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if got := e.queueCPUs(); !slices.Equal(got, cpus) {
		t.Fatalf("queues pinned on %v, want %v", got, cpus)
	}
}
