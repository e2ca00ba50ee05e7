package hwq

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/memreg"
)

// rawEnv is a veth pair between two namespaces made for one raw-queue test.
type rawEnv struct {
	*testutil.VethPair
	srvMAC, cliMAC net.HardwareAddr
}

func newRawEnv(t *testing.T, queues int) *rawEnv {
	t.Helper()
	v := testutil.NewVethPair(t, testutil.VethConfig{Prefix: nsPrefix, Queues: queues,
		Server: netip.MustParsePrefix("10.219.7.1/24"), Client: netip.MustParsePrefix("10.219.7.2/24")})
	e := &rawEnv{VethPair: v}
	e.srvMAC = e.mac(t, v.Srv, v.SrvIf)
	e.cliMAC = e.mac(t, v.Cli, v.CliIf)
	return e
}

func (e *rawEnv) mac(t *testing.T, ns *netns.NS, name string) net.HardwareAddr {
	var mac net.HardwareAddr
	e.In(t, ns, func() error {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		mac = ifi.HardwareAddr
		return nil
	})
	return mac
}

// newRegion maps a region for a raw queue and closes it at the end of the test (after the
// queue: cleanups run last-in first-out).
func newRegion(t *testing.T, count int) *memreg.Region {
	t.Helper()
	r, err := memreg.New(memreg.Options{BufSize: 2048, Count: count})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("region close: %v", err)
		}
	})
	return r
}

// openRaw opens a raw queue on the server end, closed at the end of the test.
func (e *rawEnv) openRaw(t *testing.T, queue int, r *memreg.Region, o *RawQueueOptions) *RawQueue {
	t.Helper()
	var opts RawQueueOptions
	if o != nil {
		opts = *o
	}
	opts.NetNS = e.Srv.Fd()
	q, err := OpenRawQueue(e.SrvIf, queue, r, &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := q.Close(); err != nil {
			t.Errorf("raw queue close: %v", err)
		}
	})
	return q
}

// udpSender is a UDP socket in a namespace that sends multicast out of one interface.
type udpSender struct {
	fd int
}

func newUDPSender(t *testing.T, ns *netns.NS, ifname string, v6 bool) *udpSender {
	t.Helper()
	s := &udpSender{fd: -1}
	if err := netns.Do(ns.Fd(), func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		fam := unix.AF_INET
		if v6 {
			fam = unix.AF_INET6
		}
		fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		s.fd = fd
		if v6 {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, ifi.Index); err != nil {
				return err
			}
			return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_LOOP, 0)
		}
		if err := unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, &unix.IPMreqn{Ifindex: int32(ifi.Index)}); err != nil {
			return err
		}
		return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP, 0)
	}); err != nil {
		if s.fd >= 0 {
			unix.Close(s.fd)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(s.fd) })
	return s
}

func (s *udpSender) send(t *testing.T, dst netip.AddrPort, payload []byte) {
	t.Helper()
	var sa unix.Sockaddr
	if dst.Addr().Is4() {
		sa = &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	} else {
		sa = &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()}
	}
	for {
		err := unix.Sendto(s.fd, payload, 0, sa)
		if err == unix.ENOBUFS || err == unix.EAGAIN {
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("sendto %v: %v", dst, err)
		}
		return
	}
}

// groupMember is a UDP socket in a namespace, bound to a port and joined to a group on an
// interface: the kernel stack's receiver.
type groupMember struct {
	fd int
}

func joinGroup(t *testing.T, ns *netns.NS, ifname string, group netip.Addr, port int) *groupMember {
	t.Helper()
	m := &groupMember{fd: -1}
	if err := netns.Do(ns.Fd(), func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		fam := unix.AF_INET
		if group.Is6() {
			fam = unix.AF_INET6
		}
		fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			return err
		}
		m.fd = fd
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
		if group.Is6() {
			if err := unix.Bind(fd, &unix.SockaddrInet6{Port: port, Addr: group.As16()}); err != nil {
				return err
			}
			return unix.SetsockoptIPv6Mreq(fd, unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, &unix.IPv6Mreq{Multiaddr: group.As16(), Interface: uint32(ifi.Index)})
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: group.As4()}); err != nil {
			return err
		}
		return unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, &unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(ifi.Index)})
	}); err != nil {
		if m.fd >= 0 {
			unix.Close(m.fd)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(m.fd) })
	return m
}

// drain reads every datagram queued now and returns them.
func (m *groupMember) drain() [][]byte {
	var out [][]byte
	buf := make([]byte, 65536)
	for {
		n, _, err := unix.Recvfrom(m.fd, buf, unix.MSG_DONTWAIT)
		if err != nil {
			return out
		}
		out = append(out, append([]byte(nil), buf[:n]...))
	}
}

// payload makes datagram i of stream tag: a header naming them, then bytes derived from both.
func payload(tag string, i, size int) []byte {
	p := make([]byte, size)
	h := fmt.Sprintf("%s#%08d#", tag, i)
	copy(p, h)
	for j := len(h); j < size; j++ {
		p[j] = byte(i*131 + j*7 + len(tag))
	}
	return p
}

// udpOf parses an Ethernet frame carrying IPv4 or IPv6 UDP: source and destination, and
// the UDP payload. ok is false for anything else.
func udpOf(f []byte) (src, dst netip.AddrPort, pl []byte, ok bool) {
	if len(f) < 14 {
		return
	}
	et := binary.BigEndian.Uint16(f[12:])
	l3 := f[14:]
	var l4 []byte
	var s, d netip.Addr
	switch et {
	case 0x0800:
		if len(l3) < 20 || l3[9] != unix.IPPROTO_UDP {
			return
		}
		ihl := int(l3[0]&15) * 4
		tot := int(binary.BigEndian.Uint16(l3[2:]))
		if tot > len(l3) || ihl > tot {
			return
		}
		s, d = netip.AddrFrom4([4]byte(l3[12:16])), netip.AddrFrom4([4]byte(l3[16:20]))
		l4 = l3[ihl:tot]
	case 0x86dd:
		if len(l3) < 40 || l3[6] != unix.IPPROTO_UDP {
			return
		}
		plen := int(binary.BigEndian.Uint16(l3[4:]))
		if 40+plen > len(l3) {
			return
		}
		s, d = netip.AddrFrom16([16]byte(l3[8:24])), netip.AddrFrom16([16]byte(l3[24:40]))
		l4 = l3[40 : 40+plen]
	default:
		return
	}
	if len(l4) < 8 || int(binary.BigEndian.Uint16(l4[4:])) != len(l4) {
		return
	}
	return netip.AddrPortFrom(s, binary.BigEndian.Uint16(l4[0:])), netip.AddrPortFrom(d, binary.BigEndian.Uint16(l4[2:])), l4[8:], true
}

// collect receives frames from the raw queues until want frames arrived or the deadline
// passes (a safety net against a hang, not an assertion), releasing each after fn.
func collect(t *testing.T, qs []*RawQueue, want int, fn func(q int, f []byte)) int {
	t.Helper()
	got := 0
	frames := make([]Frame, 64)
	deadline := time.Now().Add(10 * time.Second)
	for got < want && time.Now().Before(deadline) {
		progress := false
		for qi, q := range qs {
			n, err := q.TryReceive(frames)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range frames[:n] {
				fn(qi, f.Bytes())
				if err := f.Buf.Release(); err != nil {
					t.Fatal(err)
				}
			}
			got += n
			progress = progress || n > 0
		}
		if !progress {
			time.Sleep(time.Millisecond)
		}
	}
	return got
}

// packetSock is an AF_PACKET socket bound to one interface in a namespace: it sends crafted
// frames and receives every frame the interface gets.
type packetSock struct {
	fd      int
	ifindex int
}

func newPacketSock(t *testing.T, ns *netns.NS, ifname string) *packetSock {
	t.Helper()
	p := &packetSock{fd: -1}
	if err := netns.Do(ns.Fd(), func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		p.ifindex = ifi.Index
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		p.fd = fd
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index})
	}); err != nil {
		if p.fd >= 0 {
			unix.Close(p.fd)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p.fd) })
	return p
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (p *packetSock) send(t *testing.T, f []byte) {
	t.Helper()
	for {
		err := unix.Sendto(p.fd, f, 0, &unix.SockaddrLinklayer{Ifindex: p.ifindex})
		if err == unix.ENOBUFS || err == unix.EAGAIN {
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("AF_PACKET send: %v", err)
		}
		return
	}
}

// recv returns the frames the socket got that pass keep, until want of them arrived (or
// a 10 s safety net).
func (p *packetSock) recv(want int, keep func([]byte) bool) [][]byte {
	var out [][]byte
	buf := make([]byte, 65536)
	deadline := time.Now().Add(10 * time.Second)
	for len(out) < want && time.Now().Before(deadline) {
		n, from, err := unix.Recvfrom(p.fd, buf, unix.MSG_DONTWAIT)
		if err != nil {
			time.Sleep(time.Millisecond)
			continue
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		if keep(buf[:n]) {
			out = append(out, append([]byte(nil), buf[:n]...))
		}
	}
	return out
}

// frameSpec describes a crafted Ethernet frame carrying UDP (or TCP) over IPv4 or IPv6.
type frameSpec struct {
	dstMAC, srcMAC net.HardwareAddr
	src, dst       netip.Addr
	proto          uint8 // UDP when 0
	sport, dport   uint16
	tos            uint8  // ToS / traffic class
	flow           uint32 // IPv6 flow label
	payload        []byte
}

func csumAdd(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func csumFold(sum uint32) uint16 {
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// build makes the frame with correct IPv4 header and UDP/TCP checksums.
func (s frameSpec) build() []byte {
	proto := s.proto
	if proto == 0 {
		proto = unix.IPPROTO_UDP
	}
	var l4 []byte
	if proto == unix.IPPROTO_TCP {
		l4 = make([]byte, 20+len(s.payload))
		binary.BigEndian.PutUint16(l4[0:], s.sport)
		binary.BigEndian.PutUint16(l4[2:], s.dport)
		binary.BigEndian.PutUint32(l4[4:], 1)
		l4[12] = 5 << 4
		l4[13] = 0x18 // PSH|ACK
		binary.BigEndian.PutUint16(l4[14:], 65535)
		copy(l4[20:], s.payload)
	} else {
		l4 = make([]byte, 8+len(s.payload))
		binary.BigEndian.PutUint16(l4[0:], s.sport)
		binary.BigEndian.PutUint16(l4[2:], s.dport)
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
		copy(l4[8:], s.payload)
	}
	ck := 6
	if proto == unix.IPPROTO_TCP {
		ck = 16
	}
	f := make([]byte, 14)
	copy(f[0:], s.dstMAC)
	copy(f[6:], s.srcMAC)
	var pseudo []byte
	if s.dst.Is4() {
		binary.BigEndian.PutUint16(f[12:], 0x0800)
		ip := make([]byte, 20)
		ip[0] = 0x45
		ip[1] = s.tos
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		ip[8] = 64
		ip[9] = proto
		a, b := s.src.As4(), s.dst.As4()
		copy(ip[12:], a[:])
		copy(ip[16:], b[:])
		binary.BigEndian.PutUint16(ip[10:], csumFold(csumAdd(0, ip)))
		pseudo = append(append(append([]byte{}, a[:]...), b[:]...), 0, proto, byte(len(l4)>>8), byte(len(l4)))
		f = append(f, ip...)
	} else {
		binary.BigEndian.PutUint16(f[12:], 0x86dd)
		ip := make([]byte, 40)
		binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(s.tos)<<20|s.flow&0xfffff)
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6] = proto
		ip[7] = 64
		a, b := s.src.As16(), s.dst.As16()
		copy(ip[8:], a[:])
		copy(ip[24:], b[:])
		pseudo = append(append(append([]byte{}, a[:]...), b[:]...), 0, 0, byte(len(l4)>>8), byte(len(l4)), 0, 0, 0, proto)
		f = append(f, ip...)
	}
	c := csumFold(csumAdd(csumAdd(0, pseudo), l4))
	if c == 0 && proto == unix.IPPROTO_UDP {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(l4[ck:], c)
	return append(f, l4...)
}

// vxlan is a VXLAN header (I flag set) with vni, then an inner frame.
func vxlan(vni uint32, inner []byte) []byte {
	h := []byte{0x08, 0, 0, 0, byte(vni >> 16), byte(vni >> 8), byte(vni), 0}
	return append(h, inner...)
}
