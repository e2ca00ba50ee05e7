package bpf

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

// The committed objects must come from the committed C sources: gen.sh
// records the sources' SHA-256 next to the objects. (make bpf-check also
// recompiles and compares byte for byte; this test needs no clang.)
func TestGeneratedUpToDate(t *testing.T) {
	b, err := os.ReadFile("sources.sha256")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("bad line %q", line)
		}
		src, err := os.ReadFile(filepath.Join("c", f[1]))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(src)
		if hex.EncodeToString(sum[:]) != f[0] {
			t.Errorf("c/%s changed since the objects were generated: run make bpf and commit", f[1])
		}
		n++
	}
	cs, _ := filepath.Glob("c/*")
	if n != len(cs) {
		t.Errorf("sources.sha256 lists %d files, c/ has %d: run make bpf", n, len(cs))
	}
}

// The Go structs are generated from zcnet.h; check the sizes the maps were
// declared with and the constants mirrored by hand.
func TestLayout(t *testing.T) {
	spec, err := loadSteer()
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, got int, want uint32) {
		t.Helper()
		if uint32(got) != want {
			t.Errorf("%s: Go size %d, C size %d", name, got, want)
		}
	}
	check("flow_key", binary.Size(steerFlowKey{}), spec.Maps[steerMapFlows].KeySize)
	check("flow_key (conns)", binary.Size(steerFlowKey{}), spec.Maps[steerMapConns].KeySize)
	check("conn", binary.Size(steerConn{}), spec.Maps[steerMapConns].ValueSize)
	check("config", binary.Size(steerConfig{}), spec.Maps[steerMapSettings].ValueSize)
	check("cc_key", binary.Size(steerCcKey{}), spec.Maps[steerMapCcPolicies].KeySize)
	check("cc_policy", binary.Size(steerCcPolicy{}), spec.Maps[steerMapCcPolicies].ValueSize)
	check("flow_stats", binary.Size(steerFlowStats{}), spec.Maps[steerMapFlowstats].ValueSize)
	check("queue_stats", binary.Size(steerQueueStats{}), spec.Maps[steerMapQueuestats].ValueSize)
	check("bpf_cpumap_val", binary.Size(cpumapVal{}), spec.Maps[steerMapCpus].ValueSize)
	if binary.Size(steerFlowKey{}) != 40 {
		t.Errorf("flow_key is %d bytes, want 40", binary.Size(steerFlowKey{}))
	}
	if got := spec.Maps[steerMapStats].MaxEntries; got != zcCounters {
		t.Errorf("ZC_COUNTERS %d, Go zcCounters %d", got, zcCounters)
	}
	if got := spec.Maps[steerMapSockets].MaxEntries; got != MaxQueues {
		t.Errorf("ZC_MAX_QUEUES %d, Go MaxQueues %d", got, MaxQueues)
	}
	if got := spec.Maps[steerMapCpuQueue].MaxEntries; got != MaxCPUs {
		t.Errorf("ZC_MAX_CPUS %d, Go MaxCPUs %d", got, MaxCPUs)
	}
	fspec, err := loadFault()
	if err != nil {
		t.Fatal(err)
	}
	check("fault_config", binary.Size(faultFaultConfig{}), fspec.Maps["fault_settings"].ValueSize)
}

func TestFlowKeyRoundTrip(t *testing.T) {
	for _, k := range []FlowKey{
		{Remote: netip.MustParseAddrPort("10.1.2.3:40000"), Local: netip.MustParseAddrPort("10.9.9.9:80")},
		{Remote: netip.MustParseAddrPort("[2001:db8::1]:1"), Local: netip.MustParseAddrPort("[2001:db8::2]:443")},
		{Remote: netip.MustParseAddrPort("10.1.2.3:0"), Local: netip.MustParseAddrPort("10.9.9.9:80")},
	} {
		r, err := k.raw()
		if err != nil {
			t.Fatalf("%v: %v", k, err)
		}
		if back := keyFromRaw(r); back != k {
			t.Errorf("%v -> %v", k, back)
		}
	}
	// v4-mapped input means the same flow as plain IPv4.
	a, _ := FlowKey{Remote: netip.MustParseAddrPort("[::ffff:10.1.2.3]:5"), Local: netip.MustParseAddrPort("10.9.9.9:80")}.raw()
	b, _ := FlowKey{Remote: netip.MustParseAddrPort("10.1.2.3:5"), Local: netip.MustParseAddrPort("10.9.9.9:80")}.raw()
	if a != b {
		t.Error("v4-mapped and plain IPv4 keys differ")
	}
	for _, bad := range []FlowKey{
		{},
		{Remote: netip.MustParseAddrPort("10.1.2.3:5")},
		{Remote: netip.MustParseAddrPort("10.1.2.3:5"), Local: netip.MustParseAddrPort("[2001:db8::2]:443")},
		{Remote: netip.MustParseAddrPort("10.1.2.3:5"), Local: netip.MustParseAddrPort("10.9.9.9:0")},
		{Remote: netip.MustParseAddrPort("[fe80::1%eth0]:5"), Local: netip.MustParseAddrPort("[fe80::2]:80")},
	} {
		if _, err := bad.raw(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%v: %v, want ErrInvalid", bad, err)
		}
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// Bad input gives ErrInvalid, never a panic, and leaks no fd or BPF object.
func TestBadInput(t *testing.T) {
	requireRoot(t)
	good, port, err := reuseportListeners(2, loopback, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, fd := range good {
			unix.Close(fd)
		}
	}()
	mk := func(typ, proto int, reuse, listen bool, p int) int {
		fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			t.Fatalf("socket(%d, %d): %v", typ, proto, err)
		}
		if reuse {
			unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}
		unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: p})
		if listen {
			unix.Listen(fd, 8)
		}
		return fd
	}
	udp := mk(unix.SOCK_DGRAM, 0, true, false, 0)
	defer unix.Close(udp)
	notListening := mk(unix.SOCK_STREAM, unix.IPPROTO_TCP, true, false, 0)
	defer unix.Close(notListening)
	noReuse := mk(unix.SOCK_STREAM, unix.IPPROTO_TCP, false, true, 0)
	defer unix.Close(noReuse)
	otherPort := mk(unix.SOCK_STREAM, unix.IPPROTO_TCP, true, true, 0)
	defer unix.Close(otherPort)
	var pipe [2]int
	unix.Pipe2(pipe[:], unix.O_CLOEXEC)
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])
	cases := map[string][]int{
		"udp":           {good[0], udp},
		"not listening": {good[0], notListening},
		"no reuseport":  {noReuse},
		"other port":    {good[0], otherPort},
		"pipe":          {pipe[0]},
		"negative":      {-1},
		"closed fd":     {999999},
		"same socket":   {good[0], good[0]},
		"too many":      make([]int, MaxQueues+1),
	}
	const mptcp = 262 // IPPROTO_MPTCP
	if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, mptcp); err == nil {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: port})
		unix.Listen(fd, 8)
		defer unix.Close(fd)
		cases["mptcp"] = []int{good[0], fd}
	}
	before := openFDs(t)
	for name, fds := range cases {
		s, err := NewSteering(fds, nil)
		if err == nil {
			s.Close()
			t.Errorf("%s: NewSteering succeeded", name)
			continue
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	for name, o := range map[string]*Options{
		"queues mismatch": {Queues: 3},
		"queues negative": {Queues: -1},
		"policy bits":     {Policy: 8},
		"policy hash+cpu": {Policy: PolicyHash | PolicyCPU},
		"pin not dir":     {PinPath: "/nonexistent/zcnet"},
		"pin not bpffs":   {PinPath: t.TempDir()},
	} {
		if s, err := NewSteering(good, o); !errors.Is(err, ErrInvalid) {
			if s != nil {
				s.Close()
			}
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if after := openFDs(t); after != before {
		t.Errorf("fds: %d before, %d after failed constructors", before, after)
	}

	s, err := NewSteering(good, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A second Steering on the same group fails and leaves the first intact.
	if s2, err := NewSteering(good, nil); !errors.Is(err, ErrInvalid) {
		if s2 != nil {
			s2.Close()
		}
		t.Errorf("second Steering on one group: %v, want ErrInvalid", err)
	}
	cfd, cport, err := boundClient(loopback)
	if err != nil {
		t.Fatal(err)
	}
	ck := FlowKey{Remote: netip.AddrPortFrom(loopback, uint16(cport)), Local: netip.AddrPortFrom(loopback, uint16(port))}
	if err := s.SetFlow(ck, 1); err != nil {
		t.Fatal(err)
	}
	if c, err := connectFD(cfd, ck.Local); err == nil {
		c.Close()
	}
	if st, _ := s.Stats(); st.ReuseportFlow != 1 || st.Queues[1].Steered != 1 {
		t.Errorf("first Steering no longer steers after a failed second one: %+v", st)
	}
	k := FlowKey{Remote: netip.MustParseAddrPort("127.0.0.1:1234"), Local: netip.AddrPortFrom(loopback, uint16(port))}
	for name, err := range map[string]error{
		"flow queue -1":       s.SetFlow(k, -1),
		"flow queue 2":        s.SetFlow(k, 2),
		"flow bad key":        s.SetFlow(FlowKey{}, 0),
		"drain 5":             s.Drain(5, true),
		"cpu -1":              s.SetCPUQueue(-1, 0),
		"cpu queue 9":         s.SetCPUQueue(0, 9),
		"dscp 64":             s.SetDSCPQueue(64, 0),
		"policy":              s.SetPolicy(99),
		"policy hash+dscp":    s.SetPolicy(PolicyHash | PolicyDSCP),
		"queue cpu 99999":     s.SetQueueCPU(0, 99999),
		"cc unknown":          s.SetCongestion(netip.MustParsePrefix("0.0.0.0/0"), "nosuchcc", false),
		"cc long":             s.SetCongestion(netip.MustParsePrefix("0.0.0.0/0"), "averyveryverylongname", false),
		"cc prefix":           s.SetCongestion(netip.Prefix{}, "reno", false),
		"xdp ifindex 0":       s.AttachXDP(0, XDPAuto),
		"xdp no such ifindex": s.AttachXDP(1<<30, XDPAuto),
		"xdp mode":            s.AttachXDP(1, XDPMode(7)),
		"cgroup not cgroup":   s.AttachCgroup(t.TempDir()),
		"cgroup missing":      s.AttachCgroup("/nonexistent"),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := s.AttachTCEgress(-3); !errors.Is(err, ErrInvalid) {
		t.Errorf("tc ifindex -3: %v", err)
	}
	if _, err := s.AttachTCEgress(1 << 30); !errors.Is(err, ErrInvalid) {
		t.Errorf("tc no such ifindex: %v", err)
	}
	if _, err := s.FlowStats(k); !errors.Is(err, ErrNotFound) {
		t.Errorf("FlowStats unknown: %v", err)
	}
	if _, _, err := s.Lookup(k); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup unknown: %v", err)
	}
	if f, err := NewFault(0, false); !errors.Is(err, ErrInvalid) || f != nil {
		t.Errorf("NewFault(0): %v", err)
	}
	var nf *Fault
	if err := nf.Set(0.5, 0, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("nil Fault: %v", err)
	}
}

// Pinned maps survive a restart: a second Steering with the same PinPath
// sees the first one's flow table.
func TestPinning(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	fds, port, err := reuseportListeners(2, loopback, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	k := FlowKey{Remote: netip.MustParseAddrPort("127.0.0.9:0"), Local: netip.AddrPortFrom(loopback, uint16(port))}
	s1, err := NewSteering(fds, &Options{PinPath: dir, KeepPinned: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s1.SetFlow(k, 1); err != nil {
		t.Fatal(err)
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "flows")); err != nil {
		t.Fatalf("flows not pinned after Close with KeepPinned: %v", err)
	}
	// A restart that fails (bad listener) must not wipe the pinned state.
	if s, err := NewSteering([]int{fds[0], fds[0]}, &Options{PinPath: dir}); err == nil {
		s.Close()
		t.Fatal("NewSteering with a duplicate listener succeeded")
	}
	// Failing after the maps were loaded from the pins: another live
	// Steering owns the group.
	other, _, err := reuseportListeners(1, loopback, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(other[0])
	owner, err := NewSteering(other, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := NewSteering(other, &Options{PinPath: dir}); !errors.Is(err, ErrInvalid) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("NewSteering on an owned group: %v", err)
	}
	owner.Close()
	s2, err := NewSteering(fds, &Options{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	if q, learned, err := s2.Lookup(k); err != nil || q != 1 || learned {
		t.Errorf("after restart Lookup = %d, %v, %v; want 1 from the flow table", q, learned, err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".debug") { // bpffs' own iterators
			t.Errorf("pin left after Close: %s", e.Name())
		}
	}
}

func TestReuseportIPv6(t *testing.T) {
	requireRoot(t)
	lo6 := netip.MustParseAddr("::1")
	testutil.RequireIPv6Loopback(t)
	fds, port, err := reuseportListeners(3, lo6, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := &steerFixture{t: t, fds: fds, port: port, pending: map[int]accepted{}}
	defer func() {
		for _, c := range f.conns {
			c.Close()
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	s, err := NewSteering(fds, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f.s = s
	ch, stop := acceptAll(t, fds)
	defer stop()
	f.ch = ch
	server := netip.AddrPortFrom(lo6, uint16(port))
	for i := 0; i < 6; i++ {
		fd, cport, err := boundClient(lo6)
		if err != nil {
			t.Fatal(err)
		}
		k := FlowKey{Remote: netip.AddrPortFrom(lo6, uint16(cport)), Local: server}
		if err := s.SetFlow(k, i%3); err != nil {
			t.Fatal(err)
		}
		c, err := connectFD(fd, server)
		if err != nil {
			t.Fatal(err)
		}
		f.conns = append(f.conns, c)
		a, ok := waitAccepted(ch, f.pending, cport, 2*time.Second)
		if !ok {
			t.Fatal("not accepted")
		}
		f.conns = append(f.conns, a.conn)
		if a.queue != i%3 {
			t.Errorf("IPv6 flow %v on queue %d, want %d", k, a.queue, i%3)
		}
	}
}

// The fault injector's drop decision, checked without a network through
// BPF_PROG_TEST_RUN on a synthetic UDP frame.
func TestFaultTestRun(t *testing.T) {
	requireRoot(t)
	var objs faultObjects
	if err := loadFaultObjects(&objs, nil); err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	frame := make([]byte, 14+20+8+18)
	binary.BigEndian.PutUint16(frame[12:], 0x0800)
	ip := frame[14:]
	ip[0], ip[9] = 0x45, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	binary.BigEndian.PutUint16(ip[20:], 5000)
	binary.BigEndian.PutUint16(ip[22:], 7)
	run := func() uint32 {
		ret, err := objs.ZcFault.Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}
	set := func(th uint32, port uint16, proto uint8) {
		c := faultFaultConfig{Threshold: th, Port: port, Proto: proto}
		if err := objs.FaultSettings.Update(uint32(0), &c, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	const drop, next = 2, 0xffffffff
	set(0xffffffff, 7, 17)
	if r := run(); r != drop {
		t.Errorf("matching packet, always drop: ret %d", r)
	}
	set(0xffffffff, 8, 17)
	if r := run(); r != next {
		t.Errorf("other port: ret %d", r)
	}
	set(0xffffffff, 0, 6)
	if r := run(); r != next {
		t.Errorf("other protocol: ret %d", r)
	}
	set(0, 0, 0)
	if r := run(); r != next {
		t.Errorf("off: ret %d", r)
	}
}

// The leak check in TestMain really sees our objects, and Close removes
// them (program, maps and the cgroup link).
func TestLeakCheckSeesObjects(t *testing.T) {
	requireRoot(t)
	cg := testCgroup(t)
	before, err := liveObjects()
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSteering(nil, &Options{Queues: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AttachCgroup(cg); err != nil {
		s.Close()
		t.Fatal(err)
	}
	live, err := liveObjects()
	if err != nil {
		t.Fatal(err)
	}
	// Ours: what appeared since (other tests, in this process or another, load the same
	// programs at the same time).
	ours := map[string]bool{}
	for _, o := range live {
		if !slices.Contains(before, o) {
			ours[o] = true
		}
	}
	var progs, links, maps int
	for o := range ours {
		switch {
		case strings.HasPrefix(o, "program "):
			progs++
		case strings.HasPrefix(o, "link "):
			links++
		case strings.HasPrefix(o, "map "):
			maps++
		}
	}
	if progs < 5 || links < 1 || maps < 12 {
		t.Errorf("live objects while open: %v", live)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Programs release their maps after an RCU grace period.
	for i := 0; ; i++ {
		live, _ := liveObjects()
		var left []string
		for _, o := range notHeldByOthers(live) {
			if ours[o] {
				left = append(left, o)
			}
		}
		if len(left) == 0 {
			break
		}
		if i == 50 {
			t.Fatalf("left after Close: %v", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A flow key names one peer (remote port 0: every port of it): an unspecified, multicast or
// broadcast address can never match a connection and is refused.
func TestFlowKeyRefusesWildcards(t *testing.T) {
	local := netip.MustParseAddrPort("10.0.0.1:80")
	for _, k := range []FlowKey{
		{Remote: netip.MustParseAddrPort("0.0.0.0:1234"), Local: local},
		{Remote: netip.MustParseAddrPort("[::]:1234"), Local: netip.MustParseAddrPort("[fd00::1]:80")},
		{Remote: netip.MustParseAddrPort("10.0.0.2:1234"), Local: netip.MustParseAddrPort("0.0.0.0:80")},
		{Remote: netip.MustParseAddrPort("224.0.0.1:1234"), Local: local},
		{Remote: netip.MustParseAddrPort("255.255.255.255:1234"), Local: local},
	} {
		if _, err := k.raw(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%v: %v, want ErrInvalid", k, err)
		}
	}
	if _, err := (FlowKey{Remote: netip.MustParseAddrPort("10.0.0.2:0"), Local: local}).raw(); err != nil {
		t.Errorf("peer-wide key refused: %v", err)
	}
}
