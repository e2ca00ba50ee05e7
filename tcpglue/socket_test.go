package tcpglue

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// pair returns a connected (client, server) pair over loopback on network.
func pair(t testing.TB, network, addr string, lopts ListenOptions, dopts DialOptions) (*Socket, *Socket) {
	t.Helper()
	ln, err := Listen(network, addr, lopts)
	if err != nil {
		t.Fatalf("Listen(%s, %s): %v", network, addr, err)
	}
	defer ln.Close()
	la, err := ln.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	c, err := DialAddrPort(la, dopts)
	if err != nil {
		t.Fatalf("Dial %v: %v", la, err)
	}
	s, _, err := ln.Accept()
	if err != nil {
		c.Close()
		t.Fatalf("Accept: %v", err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

func mustProto(t *testing.T, s *Socket) {
	t.Helper()
	err := s.Control(func(fd int) error {
		p, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
		if err != nil {
			return err
		}
		if p != unix.IPPROTO_TCP {
			t.Errorf("SO_PROTOCOL = %d, want IPPROTO_TCP (not MPTCP)", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestListenDialFamilies(t *testing.T) {
	cases := []struct {
		network, addr string
		family        int
	}{
		{"tcp4", "127.0.0.1:0", unix.AF_INET},
		{"tcp", "127.0.0.1:0", unix.AF_INET},
		{"tcp6", "[::1]:0", unix.AF_INET6},
		{"tcp", "[::1]:0", unix.AF_INET6},
		{"tcp", "localhost:0", unix.AF_INET},
		{"tcp6", "[::ffff:127.0.0.1]:0", unix.AF_INET6},
	}
	for _, tc := range cases {
		t.Run(tc.network+"/"+tc.addr, func(t *testing.T) {
			c, s := pair(t, tc.network, tc.addr, ListenOptions{}, DialOptions{})
			// The listener's address is reported unmapped, so the client of
			// the v4-mapped case is AF_INET.
			if s.Family() != tc.family {
				t.Errorf("server family %d, want %d", s.Family(), tc.family)
			}
			mustProto(t, c)
			mustProto(t, s)
			msg := []byte("hello over plain tcp")
			if n, err := c.Write(msg); err != nil || n != len(msg) {
				t.Fatalf("Write = %d, %v", n, err)
			}
			if err := c.Shutdown(unix.SHUT_WR); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(s)
			if err != nil {
				t.Fatalf("ReadAll: %v", err)
			}
			if !bytes.Equal(got, msg) {
				t.Fatalf("got %q", got)
			}
			ra, err := s.RemoteAddr()
			if err != nil {
				t.Fatal(err)
			}
			la, err := c.LocalAddr()
			if err != nil {
				t.Fatal(err)
			}
			if ra != la {
				t.Errorf("server's peer %v != client's local %v", ra, la)
			}
		})
	}
}

func TestDualStackWildcard(t *testing.T) {
	ln, err := Listen("tcp", ":0", ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	la, _ := ln.LocalAddr()
	for _, host := range []string{"127.0.0.1", "::1"} {
		c, err := DialAddrPort(netip.AddrPortFrom(netip.MustParseAddr(host), la.Port()), DialOptions{})
		if err != nil {
			t.Fatalf("dial %s: %v", host, err)
		}
		s, peer, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if peer.Addr().String() != host {
			t.Errorf("peer %v, want host %s", peer, host)
		}
		c.Close()
		s.Close()
	}
}

func TestListenGroup(t *testing.T) {
	g, err := ListenGroup("tcp4", "127.0.0.1:0", 4, ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, s := range g {
			s.Close()
		}
	}()
	if len(g) != 4 {
		t.Fatalf("got %d listeners", len(g))
	}
	port := uint16(0)
	for i, s := range g {
		la, err := s.LocalAddr()
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			port = la.Port()
		} else if la.Port() != port {
			t.Errorf("listener %d on port %d, want %d", i, la.Port(), port)
		}
		v, err := s.getInt("", unix.SOL_SOCKET, unix.SO_REUSEPORT)
		if err != nil || v != 1 {
			t.Errorf("listener %d SO_REUSEPORT=%d %v", i, v, err)
		}
	}
	// Without SO_REUSEPORT another listener on the port is refused.
	_, err = Listen("tcp4", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port).String(), ListenOptions{})
	if !errors.Is(err, unix.EADDRINUSE) {
		t.Errorf("plain listen on group port: %v, want EADDRINUSE", err)
	}
	// Connections are spread over the group; every one is accepted by one member.
	for _, s := range g {
		if err := s.SetNonblocking(true); err != nil {
			t.Fatal(err)
		}
	}
	const conns = 16
	var clients []*Socket
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for i := 0; i < conns; i++ {
		c, err := DialAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	accepted := 0
	for _, s := range g {
		for {
			a, _, err := s.Accept()
			if errors.Is(err, unix.EAGAIN) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if !a.Nonblocking() {
				t.Error("accepted socket of a non-blocking listener is blocking")
			}
			a.Close()
			accepted++
		}
	}
	if accepted != conns {
		t.Errorf("accepted %d of %d", accepted, conns)
	}
	if _, err := ListenGroup("tcp4", "127.0.0.1:0", 0, ListenOptions{}); !asValueError(err) {
		t.Errorf("group of 0: %v", err)
	}
}

func asValueError(err error) bool {
	var ve *ValueError
	var oe *OpError
	return errors.As(err, &ve) && errors.As(err, &oe)
}

func TestCloseSemantics(t *testing.T) {
	s, err := NewSocket(unix.AF_INET, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	err = s.Close()
	if !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v, want net.ErrClosed", err)
	}
	var oe *OpError
	if !errors.As(err, &oe) {
		t.Fatalf("second Close error %T is not *OpError", err)
	}
	if s.Fd() != -1 {
		t.Error("Fd after Close != -1")
	}
	ops := map[string]error{
		"SetNoDelay": s.SetNoDelay(true),
		"Bind":       s.Bind(netip.MustParseAddrPort("127.0.0.1:0")),
		"Listen":     s.Listen(0),
		"Connect":    s.Connect(netip.MustParseAddrPort("127.0.0.1:1")),
		"Control":    s.Control(func(int) error { return nil }),
		"Shutdown":   s.Shutdown(unix.SHUT_RDWR),
	}
	_, ops["TCPInfo"] = s.TCPInfo()
	_, ops["Read"] = s.Read(make([]byte, 1))
	_, ops["Write"] = s.Write([]byte{1})
	_, _, ops["Accept"] = s.Accept()
	_, ops["LocalAddr"] = s.LocalAddr()
	_, ops["Disown"] = s.Disown()
	_, ops["SetSendBuffer"] = s.SetSendBuffer(4096)
	for name, err := range ops {
		if !errors.Is(err, net.ErrClosed) || !errors.As(err, &oe) {
			t.Errorf("%s after Close: %v, want *OpError wrapping net.ErrClosed", name, err)
		}
	}
	var nilSock *Socket
	if err := nilSock.Close(); err != nil {
		t.Errorf("nil Close: %v", err)
	}
	if err := nilSock.SetNoDelay(true); !errors.Is(err, net.ErrClosed) {
		t.Errorf("nil SetNoDelay: %v", err)
	}
}

func TestCloseUnblocksAccept(t *testing.T) {
	ln, err := Listen("tcp4", "127.0.0.1:0", ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		close(started)
		_, _, err := ln.Accept()
		done <- err
	}()
	<-started
	// Wait until the goroutine is inside accept (holding a reference).
	for {
		ln.mu.Lock()
		r := ln.refs
		ln.mu.Unlock()
		if r > 0 {
			break
		}
		runtime.Gosched()
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("blocked Accept returned %v, want net.ErrClosed", err)
	}
	// The last reference closed the descriptor.
	ln.mu.Lock()
	fd := ln.fd
	ln.mu.Unlock()
	if fd != -1 {
		t.Errorf("fd %d still owned after Close and Accept returned", fd)
	}
}

func TestConcurrentClose(t *testing.T) {
	c, s := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{})
	_ = s
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				if err := c.SetNoDelay(true); err != nil {
					if !errors.Is(err, net.ErrClosed) {
						t.Errorf("SetNoDelay: %v", err)
					}
					return
				}
			}
		}()
	}
	c.Close()
	wg.Wait()
}

func TestFromFDAndDisown(t *testing.T) {
	s, err := NewSocket(unix.AF_INET6, true)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := s.Disown()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Close after Disown: %v", err)
	}
	s2, err := FromFD(fd)
	if err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	if s2.Family() != unix.AF_INET6 || !s2.Nonblocking() {
		t.Errorf("FromFD: family %d nonblock %v", s2.Family(), s2.Nonblocking())
	}
	s2.Close()

	// Wrong kinds of descriptors are refused and stay owned by the caller.
	udp, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(udp)
	if _, err := FromFD(udp); !asValueError(err) {
		t.Errorf("FromFD(udp): %v, want ValueError", err)
	}
	ux, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ux)
	if _, err := FromFD(ux); !asValueError(err) {
		t.Errorf("FromFD(unix): %v, want ValueError", err)
	}
	if _, err := FromFD(-1); !asValueError(err) {
		t.Errorf("FromFD(-1): %v", err)
	}
	if _, err := FromFD(1 << 20); !errors.Is(err, unix.EBADF) {
		t.Errorf("FromFD(bad): %v, want EBADF", err)
	}
	if _, err := NewSocket(unix.AF_UNIX, false); !asValueError(err) {
		t.Errorf("NewSocket(AF_UNIX): %v", err)
	}
}

func TestBadAddresses(t *testing.T) {
	cases := []struct{ network, addr string }{
		{"tcp4", "[::1]:0"},
		{"tcp6", "127.0.0.1:0"},
		{"udp", "127.0.0.1:0"},
		{"tcp", "127.0.0.1"},
		{"tcp", "127.0.0.1:99999"},
		{"tcp", "no-such-host.invalid:0"},
		{"tcp", "[fe80::1%nosuchif0]:0"},
	}
	for _, tc := range cases {
		_, err := Listen(tc.network, tc.addr, ListenOptions{})
		var ae *AddrError
		var oe *OpError
		if !errors.As(err, &ae) || !errors.As(err, &oe) {
			t.Errorf("Listen(%s, %s) = %v, want *OpError with *AddrError", tc.network, tc.addr, err)
		}
	}
	s, err := NewSocket(unix.AF_INET, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var ae *AddrError
	if err := s.Bind(netip.MustParseAddrPort("[::1]:0")); !errors.As(err, &ae) {
		t.Errorf("IPv6 bind on AF_INET: %v", err)
	}
	if err := s.Connect(netip.AddrPort{}); !errors.As(err, &ae) {
		t.Errorf("connect to zero address: %v", err)
	}
	if err := s.Shutdown(7); !asValueError(err) {
		t.Errorf("Shutdown(7): %v", err)
	}
	// Connection refused is an errno wrapped in *os.SyscallError in *OpError.
	ln, _ := Listen("tcp4", "127.0.0.1:0", ListenOptions{})
	la, _ := ln.LocalAddr()
	ln.Close()
	_, err = DialAddrPort(la, DialOptions{})
	if !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("dial closed port: %v", err)
	}
}

func TestNonblockingAccept(t *testing.T) {
	ln, err := Listen("tcp4", "127.0.0.1:0", ListenOptions{Nonblock: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, _, err := ln.Accept(); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("Accept on idle non-blocking listener: %v, want EAGAIN", err)
	}
	// Non-blocking connect reports EINPROGRESS, then SocketError nil.
	c, err := NewSocket(unix.AF_INET, true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	la, _ := ln.LocalAddr()
	err = c.Connect(la)
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		t.Fatal(err)
	}
	if err := c.Control(func(fd int) error { return waitFd(fd, unix.POLLOUT) }); err != nil {
		t.Fatal(err)
	}
	if err := c.SocketError(); err != nil {
		t.Fatal(err)
	}
}

// closeWhileBlocked runs op in a goroutine, waits until it is inside s (holding a
// reference), closes s and returns op's error.
func closeWhileBlocked(s *Socket, op func() error) error {
	done := make(chan error, 1)
	go func() { done <- op() }()
	for s.refCount() == 0 {
		runtime.Gosched()
	}
	s.Close()
	return <-done
}

func TestCloseUnblocksRead(t *testing.T) {
	_, s := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{})
	err := closeWhileBlocked(s, func() error {
		_, err := s.Read(make([]byte, 16))
		return err
	})
	if !errors.Is(err, net.ErrClosed) {
		t.Fatalf("blocked Read after Close: %v, want net.ErrClosed", err)
	}
}

func TestErrorMessages(t *testing.T) {
	ln, err := Listen("tcp4", "127.0.0.1:0", ListenOptions{NoReuseAddr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	la, _ := ln.LocalAddr()
	_, err = ListenAddrPort("tcp4", la, ListenOptions{})
	if !errors.Is(err, unix.EADDRINUSE) {
		t.Fatalf("second listener: %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"tcpglue: bind", la.String(), "address already in use", "SO_REUSEPORT"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	var oe *OpError
	if !errors.As(err, &oe) || oe.Op != "bind" || oe.Fd < 0 || oe.Addr == nil || oe.Timeout() || oe.Temporary() {
		t.Errorf("OpError fields %+v", oe)
	}
	var se *os.SyscallError
	if !errors.As(err, &se) {
		t.Error("errno not in *os.SyscallError")
	}
	if _, err := ListenAddrPort("tcp4", netip.MustParseAddrPort("[::1]:0"), ListenOptions{}); !errors.As(err, new(*AddrError)) {
		t.Errorf("IPv6 AddrPort for tcp4: %v", err)
	}
	if _, err := ListenAddrPort("sctp", la, ListenOptions{}); !errors.As(err, new(*AddrError)) {
		t.Errorf("sctp: %v", err)
	}
	ve := &ValueError{Name: "IP_TOS", Value: 300, Reason: "want 0..255"}
	if got := ve.Error(); got != "invalid IP_TOS 300: want 0..255" {
		t.Errorf("ValueError message %q", got)
	}
	ce := &CongestionError{Name: "x", Available: []string{"reno", "cubic"}, Err: unix.EPERM}
	if m := ce.Error(); !strings.Contains(m, "reno cubic") || !strings.Contains(m, "tcp_allowed_congestion_control") {
		t.Errorf("CongestionError message %q", m)
	}
	if (*OpError)(nil).Error() != "<nil>" {
		t.Error("nil OpError")
	}
	if TCPState(99).String() != "TCPState(99)" || CAState(9).String() != "CAState(9)" || CALoss.String() != "Loss" {
		t.Error("state names")
	}
	// A failing Control hook closes the socket and reports the hook's error.
	boom := errors.New("boom")
	if _, err := Listen("tcp4", "127.0.0.1:0", ListenOptions{Control: func(*Socket) error { return boom }}); !errors.Is(err, boom) {
		t.Errorf("Control error: %v", err)
	}
	if _, err := Dial("tcp", la.String(), DialOptions{Control: func(*Socket) error { return boom }}); !errors.Is(err, boom) {
		t.Errorf("dial Control error: %v", err)
	}
}

func TestDial(t *testing.T) {
	ln, err := Listen("tcp", ":0", ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	la, _ := ln.LocalAddr()
	port := strconv.Itoa(int(la.Port()))
	for _, addr := range []string{"localhost:" + port, ":" + port, "[::1]:" + port} {
		c, err := Dial("tcp", addr, DialOptions{Nonblock: true, LocalAddr: netip.MustParseAddrPort("[::]:0")})
		if addr == "localhost:"+port {
			// localhost prefers 127.0.0.1, and an IPv6 local address
			// cannot be bound for an IPv4 connection.
			if err == nil {
				c.Close()
				t.Errorf("Dial(%s) with an IPv6 local address succeeded", addr)
			}
			c, err = Dial("tcp", addr, DialOptions{Nonblock: true})
		}
		if err != nil {
			t.Fatalf("Dial(%s): %v", addr, err)
		}
		if !c.Nonblocking() {
			t.Errorf("Dial(%s): not non-blocking", addr)
		}
		s, _, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		c.Close()
	}
}
