package bpf

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/netns"
)

// nsPrefix names the network namespaces the tests create (testutil.NewVethPair).
const nsPrefix = "zcbpf"

// ourProgs are the names of the programs this package loads; the leak check
// looks for them (other engineers may run their own BPF on this machine).
var ourProgs = map[string]bool{
	"zc_reuseport": true, "zc_sockops": true, "zc_xdp": true, "zc_cpumap": true,
	"zc_tc_egress": true, "zc_fault": true,
}

// ourMaps are this package's map names as the kernel stores them.
var ourMaps = map[string]bool{
	"flows": true, "conns": true, "settings": true, "cpu_queue": true, "dscp_queue": true,
	"queue_cpu": true, "sockets": true, "cpus": true, "cc_policies": true, "flowstats": true,
	"queuestats": true, "stats": true, "fault_settings": true, "fault_stats": true,
}

// liveObjects lists loaded programs, maps and links that belong to us.
func liveObjects() ([]string, error) {
	var out []string
	ourProgIDs := map[ebpf.ProgramID]bool{}
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			break
		} else if err != nil {
			return nil, err
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := p.Info()
		p.Close()
		if err == nil && ourProgs[info.Name] {
			ourProgIDs[id] = true
			out = append(out, fmt.Sprintf("program %d %s", id, info.Name))
		}
	}
	for id := ebpf.MapID(0); ; {
		next, err := ebpf.MapGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			break
		} else if err != nil {
			return nil, err
		}
		id = next
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		info, err := m.Info()
		m.Close()
		if err == nil && ourMaps[info.Name] {
			out = append(out, fmt.Sprintf("map %d %s", id, info.Name))
		}
	}
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err == nil && ourProgIDs[info.Program] {
			out = append(out, fmt.Sprintf("link %d type %d", info.ID, info.Type))
		}
	}
	return out, it.Err()
}

// heldByOthers returns the BPF program, map and link IDs that some other
// process holds an fd to (so a concurrent test run elsewhere is not
// mistaken for our leak).
func heldByOthers() map[string]bool {
	held := map[string]bool{}
	self := fmt.Sprint(os.Getpid())
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if p.Name() == self || p.Name()[0] < '0' || p.Name()[0] > '9' {
			continue
		}
		fds, _ := os.ReadDir("/proc/" + p.Name() + "/fd")
		for _, fd := range fds {
			target, err := os.Readlink("/proc/" + p.Name() + "/fd/" + fd.Name())
			if err != nil || !strings.HasPrefix(target, "anon_inode:bpf-") {
				continue
			}
			info, err := os.ReadFile("/proc/" + p.Name() + "/fdinfo/" + fd.Name())
			if err != nil {
				continue
			}
			for _, l := range strings.Split(string(info), "\n") {
				for _, k := range []string{"prog_id:", "map_id:", "link_id:"} {
					if strings.HasPrefix(l, k) {
						held[strings.TrimSuffix(k, "_id:")+" "+strings.TrimSpace(strings.TrimPrefix(l, k))] = true
					}
				}
			}
		}
	}
	return held
}

// notHeldByOthers drops from liveObjects' list what another process holds
// an fd to (another package's tests run at the same time: go test ./...).
func notHeldByOthers(live []string) []string {
	held := heldByOthers()
	var out []string
	for _, o := range live {
		f := strings.Fields(o) // "program 12 zc_xdp", "map 3 flows", "link 7 type 2"
		kind := map[string]string{"program": "prog", "map": "map", "link": "link"}[f[0]]
		if !held[kind+" "+f[1]] {
			out = append(out, o)
		}
	}
	return out
}

// ownBPFFDs lists this process's open BPF fds (programs, maps, links).
func ownBPFFDs() []string {
	var out []string
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		target, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err == nil && strings.HasPrefix(target, "anon_inode:bpf-") {
			out = append(out, fd.Name()+" "+target)
		}
	}
	return out
}

// TestMain fails the run if BPF objects are left behind: any BPF fd still
// open in this process, and any of our programs, maps or links still
// loaded that no other process holds (attachments without an fd, such as
// a reuseport group's program or an XDP link kept by the interface).
func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		os.Exit(runHelper(h))
	}
	netns.RemoveStale(nsPrefix)
	code := m.Run()
	if fds := ownBPFFDs(); len(fds) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: BPF fds still open after tests:\n  %s\n", strings.Join(fds, "\n  "))
		code = 1
	}
	// Objects are freed when their last reference goes, but programs drop
	// their maps, and reuseport groups their program, after an RCU grace
	// period: poll for a while.
	var left []string
	for i := 0; i < 50; i++ {
		live, err := liveObjects()
		if err != nil {
			// An object torn down while we look (EAGAIN): look again.
			if i == 49 {
				fmt.Fprintln(os.Stderr, "leak check unavailable:", err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if left = notHeldByOthers(live); len(left) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: BPF objects left behind after tests:\n  %s\n", strings.Join(left, "\n  "))
		code = 1
	}
	if ns := netns.Own(nsPrefix); len(ns) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: network namespaces left behind: %v\n", ns)
		code = 1
	}
	os.Exit(code)
}

// requireRoot skips tests that need root when not root; as root, a missing
// feature fails the test (the kernel on this machine has all of them).
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF, CAP_NET_ADMIN)")
	}
}

// tcpSocket makes a plain IPPROTO_TCP socket (never MPTCP).
func tcpSocket(addr netip.Addr) (int, error) {
	fam := unix.AF_INET
	if !addr.Unmap().Is4() {
		fam = unix.AF_INET6
	}
	return unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	a := ap.Addr().Unmap()
	if a.Is4() {
		return &unix.SockaddrInet4{Addr: a.As4(), Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: a.As16(), Port: int(ap.Port())}
}

func localPort(fd int) int {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return a.Port
	case *unix.SockaddrInet6:
		return a.Port
	}
	return 0
}

// reuseportListeners makes n listening sockets in one SO_REUSEPORT group on
// addr (port 0 = pick one). Call in the wanted network namespace.
func reuseportListeners(n int, addr netip.Addr, port int) (fds []int, _ int, err error) {
	defer func() {
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			fds = nil
		}
	}()
	for i := 0; i < n; i++ {
		fd, err := tcpSocket(addr)
		if err != nil {
			return fds, 0, err
		}
		fds = append(fds, fd)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			return fds, 0, err
		}
		if err := unix.Bind(fd, sockaddr(netip.AddrPortFrom(addr, uint16(port)))); err != nil {
			return fds, 0, err
		}
		if err := unix.Listen(fd, 1024); err != nil {
			return fds, 0, err
		}
		port = localPort(fd)
	}
	return fds, port, nil
}

// boundClient makes a TCP socket bound to addr with an ephemeral port, so
// the 4-tuple is known before connect.
func boundClient(addr netip.Addr) (fd int, port int, err error) {
	fd, err = tcpSocket(addr)
	if err != nil {
		return -1, 0, err
	}
	if err := unix.Bind(fd, sockaddr(netip.AddrPortFrom(addr, 0))); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, localPort(fd), nil
}

// connectFD connects a socket made by boundClient and hands it to a
// net.Conn; fd is consumed (net.FileConn keeps a duplicate).
func connectFD(fd int, to netip.AddrPort) (net.Conn, error) {
	if err := unix.Connect(fd, sockaddr(to)); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "client")
	c, err := net.FileConn(f)
	f.Close()
	return c, err
}

// accepted is a connection one of the queue listeners accepted.
type accepted struct {
	queue int
	conn  net.Conn
}

// acceptAll accepts on every listener fd (dup'd into net.Listeners) and
// sends what arrives on the returned channel until stop is called.
func acceptAll(t *testing.T, fds []int) (<-chan accepted, func()) {
	t.Helper()
	ch := make(chan accepted, 1024)
	var lns []net.Listener
	for _, fd := range fds {
		d, err := unix.Dup(fd)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(d), "listener")
		ln, err := net.FileListener(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
	}
	for q, ln := range lns {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				ch <- accepted{queue: q, conn: c}
			}
		}()
	}
	return ch, func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
}

// waitAccepted waits for the accepted connection whose peer port is port;
// other arrivals are returned in the map for later lookups.
func waitAccepted(ch <-chan accepted, pending map[int]accepted, port int, timeout time.Duration) (accepted, bool) {
	if a, ok := pending[port]; ok {
		delete(pending, port)
		return a, true
	}
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	for {
		select {
		case a := <-ch:
			p := a.conn.RemoteAddr().(*net.TCPAddr).Port
			if p == port {
				return a, true
			}
			pending[p] = a
		case <-tm.C:
			return accepted{}, false
		}
	}
}
