package main

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

// TestRawmcast runs the example on a two-queue veth pair: two senders stream to the group
// and a third to another group; the example counts exactly the group's frames per source,
// and the other group's frames go to the kernel (its socket gets them all).
func TestRawmcast(t *testing.T) {
	v := testutil.NewVethPair(t, testutil.VethConfig{Prefix: "zcrawmcast", Queues: 2,
		Server: netip.MustParsePrefix("10.219.10.1/24"), Client: netip.MustParsePrefix("10.219.10.2/24")})
	group, other := netip.MustParseAddr("239.10.0.1"), netip.MustParseAddr("239.10.0.2")
	// The kernel's member of the other group, in the receiving namespace.
	var member int
	v.In(t, v.Srv, func() error {
		ifi, err := net.InterfaceByName(v.SrvIf)
		if err != nil {
			return err
		}
		member, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			return err
		}
		unix.SetsockoptInt(member, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
		if err := unix.Bind(member, &unix.SockaddrInet4{Port: 5000, Addr: other.As4()}); err != nil {
			return err
		}
		return unix.SetsockoptIPMreqn(member, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, &unix.IPMreqn{Multiaddr: other.As4(), Ifindex: int32(ifi.Index)})
	})
	defer unix.Close(member)
	// Three senders in the other namespace: two to the group (ports 7001, 7002), one to the
	// other group.
	var senders []int
	defer func() {
		for _, s := range senders {
			unix.Close(s)
		}
	}()
	for port := 7001; port <= 7003; port++ {
		v.In(t, v.Cli, func() error {
			ifi, err := net.InterfaceByName(v.CliIf)
			if err != nil {
				return err
			}
			s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			senders = append(senders, s)
			if err := unix.Bind(s, &unix.SockaddrInet4{Port: port, Addr: v.CliAddr.As4()}); err != nil {
				return err
			}
			return unix.SetsockoptIPMreqn(s, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, &unix.IPMreqn{Ifindex: int32(ifi.Index)})
		})
	}
	const perSender = 300
	runErr := make(chan error, 1)
	var out strings.Builder
	ready := make(chan struct{})
	go func() {
		c := config{Iface: v.SrvIf, NetNS: v.Srv.Name, Group: group, Port: 5000, Interval: 0, Count: 2 * perSender, Frames: 1024, stop: make(chan struct{})}
		close(ready)
		runErr <- run(c, &out)
	}()
	<-ready
	// Send until the example has counted its frames (it opens its queues first: frames sent
	// before that go to the kernel, which is why the loop keeps sending). Each round waits
	// for the kernel's socket to get the other group's datagram, so nothing is lost to a
	// flood and the kernel's count can be exact.
	otherSent := 0
	buf := make([]byte, 2048)
	for i := 0; ; i++ {
		select {
		case err := <-runErr:
			if err != nil {
				t.Fatal(err)
			}
			report := out.String()
			t.Log(report)
			for _, port := range []int{7001, 7002} {
				if !strings.Contains(report, fmt.Sprintf("total %s:%d: ", v.CliAddr, port)) {
					t.Fatalf("no total for sender port %d in:\n%s", port, report)
				}
			}
			if strings.Contains(report, fmt.Sprintf("%s:7003", v.CliAddr)) {
				t.Fatalf("the other group's sender shows up in:\n%s", report)
			}
			if !strings.Contains(report, "raw queue(s)") || !strings.Contains(report, "copy mode") {
				t.Fatalf("no mode line in:\n%s", report)
			}
			return
		default:
		}
		for k, s := range senders {
			dst := group
			if k == 2 {
				dst = other
				otherSent++
			}
			if err := unix.Sendto(s, []byte(fmt.Sprintf("datagram %d", i)), 0, &unix.SockaddrInet4{Port: 5000, Addr: dst.As4()}); err != nil {
				t.Fatal(err)
			}
		}
		got := false
		for deadline := time.Now().Add(10 * time.Second); !got && time.Now().Before(deadline); {
			n, _, err := unix.Recvfrom(member, buf, unix.MSG_DONTWAIT)
			if err != nil {
				time.Sleep(100 * time.Microsecond)
				continue
			}
			if string(buf[:n]) != fmt.Sprintf("datagram %d", i) {
				t.Fatalf("kernel socket of the other group: %q, want datagram %d", buf[:n], i)
			}
			got = true
		}
		if !got {
			t.Fatalf("the kernel socket of the other group lost datagram %d of %d", i, otherSent)
		}
	}
}
