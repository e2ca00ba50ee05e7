package bpf

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary run a helper (runHelper) instead of the
// tests; the subprocess tests re-execute themselves with it.
const helperEnv = "ZCNET_BPF_TEST_HELPER"

func runHelper(mode string) int {
	var err error
	switch mode {
	case "nopriv":
		err = helperNoPriv()
	case "cgclient":
		err = helperCgroupClient(os.Getenv("ZCNET_BPF_TARGET"))
	default:
		err = fmt.Errorf("unknown helper %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	return 0
}

// helperNoPriv runs without CAP_BPF/CAP_SYS_ADMIN/CAP_NET_ADMIN: loading
// must fail with ErrPermission, and the listener group must still accept
// connections with the kernel's own reuseport hashing (the fallback).
func helperNoPriv() error {
	fds, port, err := reuseportListeners(2, loopback, 0)
	if err != nil {
		return err
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	s, err := NewSteering(fds, nil)
	if err == nil {
		s.Close()
		return errors.New("NewSteering succeeded without privileges")
	}
	if !errors.Is(err, ErrPermission) {
		return fmt.Errorf("NewSteering: %v, want ErrPermission", err)
	}
	var oe *OpError
	if !errors.As(err, &oe) {
		return fmt.Errorf("NewSteering error %T is not *OpError", err)
	}
	fmt.Println("steering:", err)
	f, err := NewFault(1, false)
	if err == nil {
		f.Close()
		return errors.New("NewFault succeeded without privileges")
	}
	if !errors.Is(err, ErrPermission) {
		return fmt.Errorf("NewFault: %v, want ErrPermission", err)
	}
	fmt.Println("fault:", err)
	if err := Probe(); !errors.Is(err, ErrPermission) {
		return fmt.Errorf("Probe: %v, want ErrPermission", err)
	}
	// Fallback: plain reuseport hashing still serves connections.
	to := netip.AddrPortFrom(loopback, uint16(port))
	for i := 0; i < 4; i++ {
		c, err := net.DialTimeout("tcp", to.String(), 2*time.Second)
		if err != nil {
			return fmt.Errorf("fallback connect: %w", err)
		}
		c.Close()
	}
	fmt.Println("fallback: 4 connections served by kernel reuseport hashing")
	return nil
}

func TestMissingPrivileges(t *testing.T) {
	requireRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	// Dropping the capabilities from the bounding set means the exec'd
	// test binary, though uid 0, starts without them.
	for _, c := range []struct{ drop, missing string }{
		{"-bpf,-sys_admin,-net_admin,-perfmon", "missing CAP_BPF and CAP_NET_ADMIN"},
		{"-sys_admin,-net_admin", "missing CAP_NET_ADMIN"},
	} {
		cmd := exec.Command(setpriv, "--bounding-set", c.drop, "--inh-caps", "-all", "--", os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=nopriv")
		out, err := cmd.CombinedOutput()
		t.Logf("helper with %s:\n%s", c.drop, out)
		if err != nil {
			t.Fatalf("helper with %s: %v", c.drop, err)
		}
		if !strings.Contains(string(out), c.missing) {
			t.Errorf("with %s the error does not say %q", c.drop, c.missing)
		}
	}
}

// helperCgroupClient connects to target from inside the test cgroup,
// reports the socket's congestion control and TCP_NODELAY, and keeps the
// connection open until stdin closes.
func helperCgroupClient(target string) error {
	to, err := netip.ParseAddrPort(target)
	if err != nil {
		return err
	}
	fd, port, err := boundClient(loopback)
	if err != nil {
		return err
	}
	if err := unix.Connect(fd, sockaddr(to)); err != nil {
		return err
	}
	defer unix.Close(fd)
	cc, err := unix.GetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	if err != nil {
		return err
	}
	nd, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY)
	if err != nil {
		return err
	}
	// Some traffic so RTT callbacks fire.
	for i := 0; i < 20; i++ {
		if _, err := unix.Write(fd, []byte("ping")); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
	fmt.Printf("%d %s %d\n", port, strings.TrimRight(cc, "\x00"), nd)
	bufio.NewReader(os.Stdin).ReadString('\n')
	return nil
}

// testCgroup creates a child of the cgroup v2 hierarchy and removes it at
// cleanup; processes and sockets must be gone by then.
func testCgroup(t *testing.T) string {
	t.Helper()
	root := "/sys/fs/cgroup/unified"
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil || fs.Type != unix.CGROUP2_SUPER_MAGIC {
		root = "/sys/fs/cgroup"
		if err := unix.Statfs(root, &fs); err != nil || fs.Type != unix.CGROUP2_SUPER_MAGIC {
			t.Skip("no cgroup v2 hierarchy mounted")
		}
	}
	dir := filepath.Join(root, fmt.Sprintf("zcnet-bpf-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// rmdir fails with EBUSY while a process is inside; retry briefly.
		for i := 0; i < 50; i++ {
			if err := unix.Rmdir(dir); err == nil || errors.Is(err, unix.ENOENT) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("cgroup %s left behind", dir)
	})
	return dir
}

// otherCC picks an available congestion control that is not the default.
func otherCC(t *testing.T) (cc, def string) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		t.Fatal(err)
	}
	def = strings.TrimSpace(string(b))
	avail, err := availableCC()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"cubic", "reno", "bbr"} {
		if avail[c] && c != def {
			return c, def
		}
	}
	t.Skipf("only %q available", def)
	return "", ""
}

func TestSockopsCgroup(t *testing.T) {
	requireRoot(t)
	cc, def := otherCC(t)
	cg := testCgroup(t)

	// The listener (and so the accepted sockets) live outside the cgroup.
	fds, port, err := reuseportListeners(1, loopback, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	s, err := NewSteering(nil, &Options{Queues: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.AttachCgroup(cg); err != nil {
		t.Fatal(err)
	}
	// Longest prefix wins: the /8 covering 127.0.0.1 beats the default
	// route, and an unrelated /8 is not used.
	for _, p := range []struct {
		prefix  string
		cc      string
		nodelay bool
	}{{"0.0.0.0/0", def, false}, {"127.0.0.0/8", cc, true}, {"10.0.0.0/8", def, false}} {
		if err := s.SetCongestion(netip.MustParsePrefix(p.prefix), p.cc, p.nodelay); err != nil {
			t.Fatal(err)
		}
	}
	ch, stop := acceptAll(t, fds)
	defer stop()

	// A child process created inside the cgroup connects.
	cgf, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer cgf.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=cgclient",
		"ZCNET_BPF_TARGET="+netip.AddrPortFrom(loopback, uint16(port)).String())
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgf.Fd())}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	var cport, nodelay int
	var childCC string
	if _, err := fmt.Sscanf(line, "%d %s %d", &cport, &childCC, &nodelay); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
	if childCC != cc || nodelay == 0 {
		t.Errorf("inside the cgroup: congestion %q nodelay %d, want %q and 1", childCC, nodelay, cc)
	}

	// The accepted end (outside the cgroup) is untouched.
	a, ok := waitAccepted(ch, map[int]accepted{}, cport, 2*time.Second)
	if !ok {
		t.Fatal("child's connection not accepted")
	}
	defer a.conn.Close()
	raw, _ := a.conn.(*net.TCPConn).SyscallConn()
	raw.Control(func(fd uintptr) {
		got, _ := unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
		if strings.TrimRight(got, "\x00") != def {
			t.Errorf("accepted socket outside the cgroup has %q, want default %q", got, def)
		}
	})
	// So is a connection this (outside) process makes.
	oc, err := net.Dial("tcp", netip.AddrPortFrom(loopback, uint16(port)).String())
	if err != nil {
		t.Fatal(err)
	}
	orc, _ := oc.(*net.TCPConn).SyscallConn()
	orc.Control(func(fd uintptr) {
		got, _ := unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
		if strings.TrimRight(got, "\x00") != def {
			t.Errorf("outside connection has %q, want default %q", got, def)
		}
	})
	oc.Close()

	// Statistics for the child's flow.
	key := FlowKey{Remote: netip.AddrPortFrom(loopback, uint16(port)), Local: netip.AddrPortFrom(loopback, uint16(cport))}
	fs, err := s.FlowStats(key)
	if err != nil {
		t.Fatalf("FlowStats(%v): %v", key, err)
	}
	t.Logf("flow stats: %+v", fs)
	if !fs.CCSet || !fs.NoDelay || fs.Passive || fs.RTTSamples == 0 || fs.SRTT <= 0 {
		t.Errorf("flow stats %+v", fs)
	}
	// Close: the entry leaves.
	stdin.Close()
	cmd.Wait()
	deadline := time.Now().Add(3 * time.Second)
	for {
		_, err := s.FlowStats(key)
		if errors.Is(err, ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("flow stats still present after close: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats: established %d cc set %d nodelay %d rtt %d closed %d", st.Established, st.CCSet, st.NoDelaySet, st.RTTSamples, st.Closed)
	if st.Established != 1 || st.CCSet != 1 || st.NoDelaySet != 1 || st.Closed != 1 || st.RTTSamples == 0 {
		t.Errorf("stats %+v", st)
	}
}

// moveSelf moves this whole process into cgroup dir (and back at cleanup).
func moveSelf(t *testing.T, dir string) func() {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	orig := ""
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "0::") {
			orig = strings.TrimPrefix(l, "0::")
		}
	}
	root := filepath.Dir(dir)
	back := filepath.Join(root, orig)
	pid := []byte(fmt.Sprint(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.WriteFile(filepath.Join(back, "cgroup.procs"), pid, 0); err != nil {
			t.Errorf("moving back to %s: %v", back, err)
		}
	}
}

// With the listeners inside the sockops cgroup, closed connections leave
// the learned table: no stale entries after churn.
func TestChurnLeavesNoStaleEntries(t *testing.T) {
	requireRoot(t)
	cg := testCgroup(t)
	back := moveSelf(t, cg)
	fds, port, err := reuseportListeners(4, loopback, 0)
	back()
	if err != nil {
		t.Fatal(err)
	}
	f := &steerFixture{t: t, fds: fds, port: port, pending: map[int]accepted{}}
	defer func() {
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
	if err := s.AttachCgroup(cg); err != nil {
		t.Fatal(err)
	}
	ch, stop := acceptAll(t, fds)
	defer stop()
	f.ch = ch
	const n = 300
	for round := 0; round < 3; round++ {
		for i := 0; i < n/3; i++ {
			if q, _ := f.dial(loopback, 2*time.Second, nil); q < 0 {
				t.Fatal("connection not accepted")
			}
		}
		l, _ := s.Learned()
		if len(l) < n/3 {
			t.Fatalf("round %d: %d learned entries while %d connections are open", round, len(l), n/3)
		}
		// Close both ends, alternating which side closes first.
		for i := 0; i+1 < len(f.conns); i += 2 {
			if i%4 == 0 {
				f.conns[i].Close()
				f.conns[i+1].Close()
			} else {
				f.conns[i+1].Close()
				f.conns[i].Close()
			}
		}
		f.conns = nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := s.Learned()
		if err != nil {
			t.Fatal(err)
		}
		if len(l) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d stale learned entries after all connections closed", len(l))
		}
		time.Sleep(50 * time.Millisecond)
	}
	st, _ := s.Stats()
	var est, closed uint64
	for _, q := range st.Queues {
		est += q.Established
		closed += q.Closed
	}
	t.Logf("per queue: %+v", st.Queues)
	if est != n || closed != n {
		t.Errorf("queue counters: established %d closed %d, want %d", est, closed, n)
	}
}
