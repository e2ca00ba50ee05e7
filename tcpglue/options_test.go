package tcpglue

import (
	"errors"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestBoolOptions(t *testing.T) {
	c, _ := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{})
	for _, on := range []bool{true, false} {
		if err := c.SetNoDelay(on); err != nil {
			t.Fatal(err)
		}
		if v, err := c.NoDelay(); err != nil || v != on {
			t.Errorf("NoDelay = %v, %v; want %v", v, err, on)
		}
		if err := c.SetZeroCopy(on); err != nil {
			t.Fatal(err)
		}
		if v, err := c.ZeroCopy(); err != nil || v != on {
			t.Errorf("ZeroCopy = %v, %v; want %v", v, err, on)
		}
	}
}

func TestBufferSizes(t *testing.T) {
	c, _ := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{})
	eff, err := c.SetSendBuffer(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel doubles the request (and may clamp it to wmem_max).
	if eff < 64<<10 {
		t.Errorf("effective SO_SNDBUF %d < requested", eff)
	}
	if got, _ := c.SendBuffer(); got != eff {
		t.Errorf("SendBuffer %d != effective %d", got, eff)
	}
	eff, err = c.SetRecvBuffer(32 << 10)
	if err != nil {
		t.Fatal(err)
	}
	if eff < 32<<10 {
		t.Errorf("effective SO_RCVBUF %d < requested", eff)
	}
	for _, n := range []int{0, -1, 1 << 31} {
		if _, err := c.SetSendBuffer(n); !asValueError(err) {
			t.Errorf("SetSendBuffer(%d): %v, want ValueError", n, err)
		}
		if _, err := c.SetRecvBuffer(n); !asValueError(err) {
			t.Errorf("SetRecvBuffer(%d): %v, want ValueError", n, err)
		}
	}
}

func TestCongestion(t *testing.T) {
	c, _ := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{})
	avail, err := AvailableCongestion()
	if err != nil {
		t.Fatal(err)
	}
	if len(avail) == 0 {
		t.Fatal("no congestion control algorithms listed")
	}
	for _, name := range avail {
		if err := c.SetCongestion(name); err != nil {
			t.Errorf("SetCongestion(%s): %v", name, err)
			continue
		}
		if got, err := c.Congestion(); err != nil || got != name {
			t.Errorf("Congestion = %q, %v; want %q", got, err, name)
		}
	}
	err = c.SetCongestion("nosuchcc")
	var ce *CongestionError
	var oe *OpError
	if !errors.As(err, &ce) || !errors.As(err, &oe) {
		t.Fatalf("unknown algorithm: %v (%T), want *OpError with *CongestionError", err, err)
	}
	if !errors.Is(err, unix.ENOENT) {
		t.Errorf("unknown algorithm error %v does not match ENOENT", err)
	}
	if !slices.Equal(ce.Available, avail) {
		t.Errorf("error lists %v, want %v", ce.Available, avail)
	}
	var se *os.SyscallError
	if !errors.As(err, &se) {
		t.Errorf("errno not wrapped in *os.SyscallError: %v", err)
	}
	for _, bad := range []string{"", "a-name-that-is-too-long", "cu\x00bic"} {
		if err := c.SetCongestion(bad); !asValueError(err) {
			t.Errorf("SetCongestion(%q): %v, want ValueError", bad, err)
		}
	}
}

func TestPacingAndTimeouts(t *testing.T) {
	c, _ := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{})
	if err := c.SetMaxPacingRate(125_000_000); err != nil {
		t.Fatal(err)
	}
	if v, err := c.MaxPacingRate(); err != nil || v != 125_000_000 {
		t.Errorf("MaxPacingRate = %d, %v", v, err)
	}
	if err := c.SetMaxPacingRate(UnlimitedPacing); err != nil {
		t.Fatal(err)
	}
	if v, err := c.MaxPacingRate(); err != nil || v != UnlimitedPacing {
		t.Errorf("MaxPacingRate = %d, %v; want unlimited", v, err)
	}
	info, err := c.TCPInfo()
	if err != nil {
		t.Fatal(err)
	}
	if info.MaxPacingRate != UnlimitedPacing {
		t.Errorf("TCP_INFO max pacing rate %d", info.MaxPacingRate)
	}

	if err := c.SetUserTimeout(1500 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if v, err := c.UserTimeout(); err != nil || v != 1500*time.Millisecond {
		t.Errorf("UserTimeout = %v, %v", v, err)
	}
	if err := c.SetUserTimeout(-time.Second); !asValueError(err) {
		t.Errorf("negative user timeout: %v", err)
	}
	if err := c.SetUserTimeout(1 << 62); !asValueError(err) {
		t.Errorf("huge user timeout: %v", err)
	}

	if err := c.SetNotSentLowat(16 << 10); err != nil {
		t.Fatal(err)
	}
	if v, err := c.NotSentLowat(); err != nil || v != 16<<10 {
		t.Errorf("NotSentLowat = %d, %v", v, err)
	}
	if err := c.SetNotSentLowat(0); !asValueError(err) {
		t.Errorf("SetNotSentLowat(0): %v", err)
	}
}

func TestTOSByFamily(t *testing.T) {
	for _, tc := range []struct{ network, addr string }{{"tcp4", "127.0.0.1:0"}, {"tcp6", "[::1]:0"}} {
		c, _ := pair(t, tc.network, tc.addr, ListenOptions{}, DialOptions{})
		if err := c.SetTOS(0xb8); err != nil { // DSCP EF
			t.Fatalf("%s: %v", tc.network, err)
		}
		if v, err := c.TOS(); err != nil || v != 0xb8 {
			t.Errorf("%s: TOS = %#x, %v", tc.network, v, err)
		}
		for _, bad := range []int{-1, 256} {
			err := c.SetTOS(bad)
			if !asValueError(err) {
				t.Errorf("%s: SetTOS(%d): %v", tc.network, bad, err)
			}
		}
	}
	// A dual-stack listener's IPv4 peer arrives on an AF_INET6 socket: the
	// IPv4 packets use IP_TOS, which SetTOS sets too.
	ds, err := Listen("tcp", ":0", ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	dla, _ := ds.LocalAddr()
	c4, err := DialAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), dla.Port()), DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c4.Close()
	s6, _, err := ds.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s6.Close()
	if s6.Family() != unix.AF_INET6 {
		t.Fatalf("dual-stack accept family %d", s6.Family())
	}
	if err := s6.SetTOS(0x28); err != nil {
		t.Fatal(err)
	}
	s6.Control(func(fd int) error {
		v, err := unix.GetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TOS)
		if err != nil || v != 0x28 {
			t.Errorf("IP_TOS on v4-mapped AF_INET6 socket = %#x, %v", v, err)
		}
		return nil
	})
	// The option used follows the family.
	c6, _ := pair(t, "tcp6", "[::1]:0", ListenOptions{}, DialOptions{})
	c6.SetTOS(0x20)
	c6.Control(func(fd int) error {
		v, err := unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_TCLASS)
		if err != nil || v != 0x20 {
			t.Errorf("IPV6_TCLASS = %#x, %v", v, err)
		}
		return nil
	})
}

func TestMaxSegAndLinger(t *testing.T) {
	ln, err := Listen("tcp4", "127.0.0.1:0", ListenOptions{Control: func(s *Socket) error { return s.SetMaxSeg(4108) }})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	la, _ := ln.LocalAddr()
	c, err := DialAddrPort(la, DialOptions{Control: func(s *Socket) error { return s.SetMaxSeg(4108) }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, _, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mss, err := c.MaxSeg()
	if err != nil {
		t.Fatal(err)
	}
	// 4108 minus 12 bytes of timestamp option.
	if mss != 4096 {
		t.Errorf("MaxSeg = %d, want 4096", mss)
	}
	for _, bad := range []int{0, 87, 65536, -5} {
		if err := c.SetMaxSeg(bad); !asValueError(err) {
			t.Errorf("SetMaxSeg(%d): %v", bad, err)
		}
	}

	// SO_LINGER 0 makes Close send a reset: the peer sees ECONNRESET.
	if err := c.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	c.Control(func(fd int) error {
		l, err := unix.GetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER)
		if err != nil || l.Onoff != 1 || l.Linger != 0 {
			t.Errorf("SO_LINGER = %+v, %v", l, err)
		}
		return nil
	})
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	buf := make([]byte, 16)
	var rerr error
	for rerr == nil {
		_, rerr = s.Read(buf)
	}
	if !errors.Is(rerr, unix.ECONNRESET) {
		t.Errorf("peer read after linger-0 close: %v, want ECONNRESET", rerr)
	}
	if err := s.SetLinger(-1); err != nil {
		t.Errorf("SetLinger(-1): %v", err)
	}
}

func TestIncomingCPUAndNAPI(t *testing.T) {
	c, s := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{})
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := s.Read(buf); err != nil {
		t.Fatal(err)
	}
	cpu, err := s.IncomingCPU()
	if err != nil {
		t.Fatal(err)
	}
	if cpu < -1 || cpu >= 4096 {
		t.Errorf("IncomingCPU = %d", cpu)
	}
	if _, err := s.IncomingNAPIID(); err != nil {
		t.Fatal(err)
	}
	if n, err := s.InQueue(); err != nil || n != 0 {
		t.Errorf("InQueue = %d, %v", n, err)
	}
}

func TestKeepAlive(t *testing.T) {
	c, _ := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{})
	if err := c.SetKeepAlive(true); err != nil {
		t.Fatal(err)
	}
	if err := c.SetKeepAliveParams(30*time.Second, 5*time.Second, 4); err != nil {
		t.Fatal(err)
	}
	for opt, want := range map[int]int{unix.TCP_KEEPIDLE: 30, unix.TCP_KEEPINTVL: 5, unix.TCP_KEEPCNT: 4} {
		if v, err := c.getInt("", unix.IPPROTO_TCP, opt); err != nil || v != want {
			t.Errorf("option %d = %d, %v; want %d", opt, v, err, want)
		}
	}
	if v, _ := c.getInt("", unix.SOL_SOCKET, unix.SO_KEEPALIVE); v != 1 {
		t.Error("SO_KEEPALIVE off")
	}
	for _, bad := range []struct {
		idle, intvl time.Duration
		n           int
	}{{0, time.Second, 1}, {time.Second, 40000 * time.Second, 1}, {time.Second, time.Second, 0}, {time.Second, time.Second, 128}} {
		if err := c.SetKeepAliveParams(bad.idle, bad.intvl, bad.n); !asValueError(err) {
			t.Errorf("SetKeepAliveParams(%v, %v, %d): %v", bad.idle, bad.intvl, bad.n, err)
		}
	}
}
