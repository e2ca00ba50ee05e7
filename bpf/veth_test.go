package bpf

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

const vethQueues = 4

// vethConfig makes the multi-queue veth pair the tests below steer across.
var vethConfig = testutil.VethConfig{
	Prefix: nsPrefix,
	Queues: vethQueues,
	Server: netip.MustParsePrefix("10.213.6.1/24"),
	Client: netip.MustParsePrefix("10.213.6.2/24"),
}

// txChecksumOff turns off TX checksum offload on a device (ETHTOOL_STXCSUM
// through SIOCETHTOOL), in the calling thread's namespace. Needed before
// XDP redirects a veth's packets through a cpumap: the frame loses the
// skb's CHECKSUM_PARTIAL state, so a sender that left the checksum to
// "hardware" would have its segments dropped as corrupt on the far side.
func txChecksumOff(ifname string) error {
	const ethtoolSTXCSUM = 0x17
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	val := &struct{ Cmd, Data uint32 }{Cmd: ethtoolSTXCSUM, Data: 0}
	var ifr [40]byte
	copy(ifr[:unix.IFNAMSIZ-1], ifname)
	*(*uintptr)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = uintptr(unsafe.Pointer(val))
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr[0])))
	runtime.KeepAlive(val)
	if e != 0 {
		return os.NewSyscallError("ioctl SIOCETHTOOL ETHTOOL_STXCSUM", e)
	}
	return nil
}

// ethtoolRxXDP reads veth's per-RX-queue XDP packet counters with ethtool,
// if it is installed; nil otherwise.
func ethtoolRxXDP(ns, ifname string) map[int]uint64 {
	out, err := exec.Command("ip", "netns", "exec", ns, "ethtool", "-S", ifname).Output()
	if err != nil {
		return nil
	}
	re := regexp.MustCompile(`rx_queue_(\d+)_xdp_packets:\s+(\d+)`)
	m := map[int]uint64{}
	for _, g := range re.FindAllStringSubmatch(string(out), -1) {
		q, _ := strconv.Atoi(g[1])
		n, _ := strconv.ParseUint(g[2], 10, 64)
		m[q] = n
	}
	return m
}

// exchange sends n random bytes each way over a and b at once and checks
// both arrive intact (SHA-256).
func exchange(a, b net.Conn, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	a.SetDeadline(deadline)
	b.SetDeadline(deadline)
	pa, pb := make([]byte, n), make([]byte, n)
	rand.Read(pa)
	rand.Read(pb)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	send := func(c net.Conn, p []byte) {
		defer wg.Done()
		if _, err := c.Write(p); err != nil {
			errs <- err
		}
	}
	recv := func(c net.Conn, want []byte) {
		defer wg.Done()
		h := sha256.New()
		if _, err := io.CopyN(h, c, int64(len(want))); err != nil {
			errs <- err
			return
		}
		if w := sha256.Sum256(want); !bytes.Equal(h.Sum(nil), w[:]) {
			errs <- fmt.Errorf("checksum mismatch after %d bytes", len(want))
		}
	}
	wg.Add(4)
	go send(a, pa)
	go send(b, pb)
	go recv(b, pa)
	go recv(a, pb)
	wg.Wait()
	close(errs)
	return <-errs
}

func TestVethXDPAndTCEgress(t *testing.T) {
	v := testutil.NewVethPair(t, vethConfig)
	ncpu := runtime.NumCPU()
	if ncpu > MaxQueues {
		ncpu = MaxQueues
	}
	// Server side: 4 queue listeners, XDP (cpumap) and tc egress on the veth.
	var fds []int
	var port int
	var srv, cli *Steering
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	v.In(t, v.Srv, func() error {
		var err error
		if fds, port, err = reuseportListeners(vethQueues, v.SrvAddr, 0); err != nil {
			return err
		}
		if srv, err = NewSteering(fds, nil); err != nil {
			return err
		}
		if err := srv.AttachXDP(v.SrvIdx, XDPDriver); err != nil {
			return err
		}
		xps, err := srv.AttachTCEgress(v.SrvIdx)
		if xps {
			t.Log("XPS configured on the server veth: it overrides the tc choice")
		}
		return err
	})
	defer srv.Close()
	// Client side: XDP only, to count packets per RX queue (= the server's
	// TX queue: veth delivers TX queue i to the peer's RX queue i).
	v.In(t, v.Cli, func() error {
		var err error
		if err := txChecksumOff(v.CliIf); err != nil {
			return err
		}
		if cli, err = NewSteering(nil, &Options{Queues: vethQueues}); err != nil {
			return err
		}
		return cli.AttachXDP(v.CliIdx, XDPDriver)
	})
	defer cli.Close()
	for q := 0; q < vethQueues; q++ {
		if err := srv.SetQueueCPU(q, q%ncpu); err != nil {
			t.Fatal(err)
		}
	}
	ch, stop := acceptAll(t, fds)
	defer stop()
	pending := map[int]accepted{}
	server := netip.AddrPortFrom(v.SrvAddr, uint16(port))

	for q := 0; q < vethQueues; q++ {
		cpu := q % ncpu
		s0, _ := srv.Stats()
		c0, _ := cli.Stats()
		e0 := ethtoolRxXDP(v.Cli.Name, v.CliIf)

		var fd, cport int
		v.In(t, v.Cli, func() error {
			var err error
			fd, cport, err = boundClient(v.CliAddr)
			return err
		})
		key := FlowKey{Remote: netip.AddrPortFrom(v.CliAddr, uint16(cport)), Local: server}
		if err := srv.SetFlow(key, q); err != nil {
			t.Fatal(err)
		}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 3})
		c, err := connectFD(fd, server)
		if err != nil {
			st, _ := srv.Stats()
			cst, _ := cli.Stats()
			t.Fatalf("connect %v: %v\nserver %+v\nclient %+v", key, err, st, cst)
		}
		a, ok := waitAccepted(ch, pending, cport, 3*time.Second)
		if !ok {
			c.Close()
			t.Fatalf("flow %v not accepted", key)
		}
		if a.queue != q {
			t.Errorf("flow %v accepted on queue %d, want %d", key, a.queue, q)
		}
		if err := exchange(c, a.conn, 256<<10, 20*time.Second); err != nil {
			t.Fatalf("queue %d: %v", q, err)
		}
		c.Close()
		a.conn.Close()
		time.Sleep(50 * time.Millisecond) // let the FIN/ACKs pass

		s1, _ := srv.Stats()
		c1, _ := cli.Stats()
		e1 := ethtoolRxXDP(v.Cli.Name, v.CliIf)
		redirected := s1.Queues[q].XDPRedirected - s0.Queues[q].XDPRedirected
		onCPU := s1.CPUPackets[cpu] - s0.CPUPackets[cpu]
		tcMapped := s1.Queues[q].TCMapped - s0.Queues[q].TCMapped
		var rx [vethQueues]uint64
		var others uint64
		for i := range rx {
			rx[i] = c1.RxQueuePackets[i] - c0.RxQueuePackets[i]
			if i != q {
				others += rx[i]
			}
		}
		t.Logf("queue %d (cpu %d): xdp redirected %d, delivered on cpu %d: %d; tc mapped %d; client rx per queue %v; ethtool rx xdp %v -> %v",
			q, cpu, redirected, cpu, onCPU, tcMapped, rx, e0, e1)
		if redirected < 20 {
			t.Errorf("queue %d: only %d packets redirected by XDP", q, redirected)
		}
		if onCPU < redirected*9/10 {
			t.Errorf("queue %d: %d redirected but %d arrived on CPU %d", q, redirected, onCPU, cpu)
		}
		if tcMapped < 20 {
			t.Errorf("queue %d: tc mapped only %d packets", q, tcMapped)
		}
		// Everything the server sent for this flow arrived on RX queue q
		// of the peer, i.e. left on TX queue q. A stray ARP may land elsewhere.
		if rx[q] < tcMapped*9/10 || others > 4 {
			t.Errorf("queue %d: client rx per queue %v for %d mapped packets", q, rx, tcMapped)
		}
		if e0 != nil && e1 != nil && e1[q]-e0[q] < rx[q]*9/10 {
			t.Errorf("queue %d: ethtool rx_queue_%d_xdp_packets grew by %d, XDP counted %d", q, q, e1[q]-e0[q], rx[q])
		}
	}
	st, _ := srv.Stats()
	if st.XDPRedirect == 0 || st.TCMapped == 0 {
		t.Errorf("server stats %+v", st)
	}
}

func TestVethFaultInjector(t *testing.T) {
	v := testutil.NewVethPair(t, vethConfig)
	const udpPort = 9
	// A UDP sink on the server side.
	var sink int
	v.In(t, v.Srv, func() error {
		var err error
		sink, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			return err
		}
		unix.SetsockoptInt(sink, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
		return unix.Bind(sink, sockaddr(netip.AddrPortFrom(v.SrvAddr, udpPort)))
	})
	defer unix.Close(sink)
	var cf, sf *Fault
	var usock int
	v.In(t, v.Cli, func() error {
		var err error
		if cf, err = NewFault(v.CliIdx, true); err != nil {
			return err
		}
		usock, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		return err
	})
	defer cf.Close()
	defer unix.Close(usock)
	v.In(t, v.Srv, func() error {
		var err error
		sf, err = NewFault(v.SrvIdx, true)
		return err
	})
	defer sf.Close()

	// 1. The configured fraction: 20000 datagrams, 25% dropped.
	const frac, n = 0.25, 20000
	if err := sf.Set(frac, unix.IPPROTO_UDP, udpPort); err != nil {
		t.Fatal(err)
	}
	to := sockaddr(netip.AddrPortFrom(v.SrvAddr, udpPort))
	sent, received := 0, 0
	payload := make([]byte, 64)
	drain := make([]byte, 2048)
	for i := 0; i < n; i++ {
		if err := unix.Sendto(usock, payload, 0, to); err == nil {
			sent++
		}
		if i%256 == 0 {
			for {
				if _, _, err := unix.Recvfrom(sink, drain, 0); err != nil {
					break
				}
				received++
			}
		}
	}
	seen, dropped, err := sf.Stats()
	if err != nil {
		t.Fatal(err)
	}
	got := float64(dropped) / float64(seen)
	t.Logf("UDP: sent %d, server ingress injector saw %d, dropped %d (%.4f, configured %.2f)", sent, seen, dropped, got, frac)
	if int(seen) != sent {
		t.Errorf("injector saw %d of %d datagrams", seen, sent)
	}
	if got < frac-0.02 || got > frac+0.02 {
		t.Errorf("dropped fraction %.4f, configured %.2f", got, frac)
	}
	// The sink got exactly what was not dropped.
	time.Sleep(50 * time.Millisecond)
	for {
		if _, _, err := unix.Recvfrom(sink, drain, 0); err != nil {
			break
		}
		received++
	}
	if received != sent-int(dropped) {
		t.Errorf("sink received %d, want %d sent - %d dropped", received, sent, dropped)
	}
	// Turned off: nothing more is dropped.
	sf.Set(0, 0, 0)
	unix.Sendto(usock, payload, 0, to)
	if _, d2, _ := sf.Stats(); d2 != dropped {
		t.Errorf("dropping continued after Set(0)")
	}

	// 2. TCP through 5% loss each way delivers every byte. The drops are at
	// each side's ingress: a drop at the sender's own egress is reported
	// to its TCP as a local transmit failure and resent without counting
	// as a loss, which would not exercise recovery.
	var lfd int
	var port int
	v.In(t, v.Srv, func() error {
		fds, p, err := reuseportListeners(1, v.SrvAddr, 0)
		if err != nil {
			return err
		}
		lfd, port = fds[0], p
		return nil
	})
	defer unix.Close(lfd)
	ch, stop := acceptAll(t, []int{lfd})
	defer stop()
	cs0, cd0, _ := cf.Stats()
	ss0, sd0, _ := sf.Stats()
	if err := cf.Set(0.05, unix.IPPROTO_TCP, uint16(port)); err != nil {
		t.Fatal(err)
	}
	if err := sf.Set(0.05, unix.IPPROTO_TCP, uint16(port)); err != nil {
		t.Fatal(err)
	}
	var fd, cport int
	v.In(t, v.Cli, func() error {
		var err error
		fd, cport, err = boundClient(v.CliAddr)
		return err
	})
	server := netip.AddrPortFrom(v.SrvAddr, uint16(port))
	// The SYN itself may be dropped: connect retries.
	c, err := connectFD(fd, server)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, ok := waitAccepted(ch, map[int]accepted{}, cport, 10*time.Second)
	if !ok {
		t.Fatal("not accepted")
	}
	defer a.conn.Close()
	start := time.Now()
	const size = 4 << 20
	if err := exchange(c, a.conn, size, 60*time.Second); err != nil {
		t.Fatalf("exchange through loss: %v", err)
	}
	var retrans uint32
	for _, conn := range []net.Conn{c, a.conn} {
		rc, _ := conn.(*net.TCPConn).SyscallConn()
		rc.Control(func(fd uintptr) {
			if ti, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				retrans += ti.Total_retrans
			}
		})
	}
	cs, cd, _ := cf.Stats()
	cs, cd = cs-cs0, cd-cd0
	ss, sd, _ := sf.Stats()
	ss, sd = ss-ss0, sd-sd0
	t.Logf("TCP: %d MiB each way intact in %v; client ingress dropped %d/%d, server ingress dropped %d/%d; retransmitted segments %d",
		size>>20, time.Since(start).Round(time.Millisecond), cd, cs, sd, ss, retrans)
	if cd == 0 || sd == 0 || retrans == 0 {
		t.Errorf("no loss happened: client %d/%d server %d/%d retrans %d", cd, cs, sd, ss, retrans)
	}
	cf.Set(0, 0, 0)
	sf.Set(0, 0, 0)
}
