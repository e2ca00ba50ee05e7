package tcpglue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestSockaddrRoundTrip(t *testing.T) {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		in     string
		family int
		want   string // after decoding
		wantF  int
	}{
		{"127.0.0.1:80", 0, "127.0.0.1:80", unix.AF_INET},
		{"127.0.0.1:80", unix.AF_INET6, "127.0.0.1:80", unix.AF_INET6}, // v4-mapped on the wire
		{"[::ffff:10.1.2.3]:443", unix.AF_INET, "10.1.2.3:443", unix.AF_INET},
		{"[::1]:65535", 0, "[::1]:65535", unix.AF_INET6},
		{"[fe80::1%lo]:1", 0, "[fe80::1%lo]:1", unix.AF_INET6},
		{fmt.Sprintf("[fe80::1%%%d]:1", lo.Index), 0, "[fe80::1%lo]:1", unix.AF_INET6},
	}
	for _, tc := range cases {
		ap := netip.MustParseAddrPort(tc.in)
		sa, err := Sockaddr(ap, tc.family)
		if err != nil {
			t.Errorf("Sockaddr(%s, %d): %v", tc.in, tc.family, err)
			continue
		}
		back, err := AddrPortFromSockaddr(sa)
		if err != nil || back.String() != tc.want {
			t.Errorf("%s: round trip %v, %v; want %s", tc.in, back, err, tc.want)
		}
		raw, err := NewRawSockaddr(ap, tc.family)
		if err != nil {
			t.Fatal(err)
		}
		if got := int(*(*uint16)(raw.Pointer())); got != tc.wantF {
			t.Errorf("%s: raw family %d, want %d", tc.in, got, tc.wantF)
		}
		rb, err := raw.AddrPort()
		if err != nil || rb.String() != tc.want {
			t.Errorf("%s: raw round trip %v, %v", tc.in, rb, err)
		}
		rsa, err := raw.Sockaddr()
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := AddrPortFromSockaddr(rsa); got.String() != tc.want {
			t.Errorf("%s: raw Sockaddr %v", tc.in, got)
		}
		if ta := TCPAddrFromSockaddr(sa); ta == nil {
			t.Errorf("%s: no TCPAddr", tc.in)
		} else if p, err := AddrPortFromNetAddr(ta); err != nil || p.String() != tc.want {
			t.Errorf("%s: via *net.TCPAddr %v, %v", tc.in, p, err)
		}
	}
	if _, err := Sockaddr(netip.MustParseAddrPort("[::1]:1"), unix.AF_INET); err == nil {
		t.Error("IPv6 address accepted for AF_INET")
	}
	if _, err := Sockaddr(netip.AddrPort{}, 0); err == nil {
		t.Error("zero address accepted")
	}
	if _, err := Sockaddr(netip.MustParseAddrPort("1.2.3.4:5"), unix.AF_UNIX); !errors.As(err, new(*ValueError)) {
		t.Errorf("AF_UNIX: %v", err)
	}
	if _, err := AddrPortFromSockaddr(&unix.SockaddrUnix{Name: "/x"}); err == nil {
		t.Error("unix sockaddr accepted")
	}
	if _, err := AddrPortFromSockaddr(nil); err == nil {
		t.Error("nil sockaddr accepted")
	}
	if _, err := AddrPortFromNetAddr(&net.UnixAddr{Name: "/x", Net: "unix"}); err == nil {
		t.Error("unix net.Addr accepted")
	}
	if got := AddrFamily(netip.MustParseAddrPort("[::ffff:1.2.3.4]:1")); got != unix.AF_INET {
		t.Errorf("AddrFamily(mapped) = %d", got)
	}
	if got := AddrFamily(netip.AddrPort{}); got != 0 {
		t.Errorf("AddrFamily(zero) = %d", got)
	}
}

// rawConnect and rawAccept make the system calls the way io_uring CONNECT and
// ACCEPT receive them: a pointer and a length.
func rawConnect(fd int, r *RawSockaddr) error {
	_, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(r.Pointer()), uintptr(r.Len()))
	runtime.KeepAlive(r)
	if e != 0 {
		return e
	}
	return nil
}

func rawAccept(fd int, r *RawSockaddr) (int, error) {
	r.PrepareAccept()
	nfd, _, e := unix.Syscall6(unix.SYS_ACCEPT4, uintptr(fd), uintptr(r.Pointer()), uintptr(unsafe.Pointer(r.LenPointer())), unix.SOCK_CLOEXEC, 0, 0)
	runtime.KeepAlive(r)
	if e != 0 {
		return -1, e
	}
	return int(nfd), nil
}

func TestRawSockaddrWithKernel(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		ln, err := Listen("tcp", addr, ListenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		la, _ := ln.LocalAddr()
		c, err := NewSocket(AddrFamily(la), false)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := NewRawSockaddr(la, c.Family())
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Control(func(fd int) error { return rawConnect(fd, raw) }); err != nil {
			t.Fatalf("raw connect to %v: %v", la, err)
		}
		var peer RawSockaddr
		var nfd int
		if err := ln.Control(func(fd int) (err error) { nfd, err = rawAccept(fd, &peer); return }); err != nil {
			t.Fatal(err)
		}
		s, err := FromAcceptedFD(nfd, ln.Family(), false)
		if err != nil {
			unix.Close(nfd)
			t.Fatal(err)
		}
		got, err := peer.AddrPort()
		cl, _ := c.LocalAddr()
		if err != nil || got != cl {
			t.Errorf("accepted peer %v, %v; want %v", got, err, cl)
		}
		if len(peer.Bytes()) != int(peer.Len()) {
			t.Error("Bytes length")
		}
		s.Close()
		c.Close()
		ln.Close()
	}
	if _, err := FromAcceptedFD(-1, unix.AF_INET, false); !asValueError(err) {
		t.Errorf("FromAcceptedFD(-1): %v", err)
	}
	if _, err := FromAcceptedFD(0, unix.AF_UNIX, false); !asValueError(err) {
		t.Errorf("FromAcceptedFD(AF_UNIX): %v", err)
	}
}

func FuzzRawSockaddr(f *testing.F) {
	r4, _ := NewRawSockaddr(netip.MustParseAddrPort("10.0.0.1:80"), 0)
	r6, _ := NewRawSockaddr(netip.MustParseAddrPort("[2001:db8::1]:443"), 0)
	f.Add(r4.Bytes(), uint32(r4.Len()))
	f.Add(r6.Bytes(), uint32(r6.Len()))
	f.Add([]byte{}, uint32(200))
	f.Fuzz(func(t *testing.T, b []byte, l uint32) {
		var r RawSockaddr
		copy((*[unix.SizeofSockaddrAny]byte)(unsafe.Pointer(&r.buf))[:], b)
		r.len = l
		_ = r.Bytes()
		ap, err := r.AddrPort()
		if err != nil {
			return
		}
		// Whatever decodes re-encodes to the same address.
		var r2 RawSockaddr
		if err := r2.Set(ap, 0); err != nil {
			if ap.Addr().Zone() != "" { // unknown interface names cannot be encoded
				return
			}
			t.Fatalf("decoded %v does not re-encode: %v", ap, err)
		}
		back, err := r2.AddrPort()
		if err != nil || back.Addr().WithZone("") != ap.Addr().WithZone("") || back.Port() != ap.Port() {
			t.Fatalf("%v -> %v, %v", ap, back, err)
		}
	})
}

func ExampleResolve() {
	for _, a := range []struct{ network, addr string }{
		{"tcp", "127.0.0.1:8080"},
		{"tcp4", ":0"},
		{"tcp6", "[::1]:443"},
		{"tcp", "[::ffff:192.0.2.1]:80"},
		{"tcp4", "[::1]:80"},
	} {
		ap, err := Resolve(a.network, a.addr)
		if err != nil {
			fmt.Println(a.network, a.addr, "->", err)
			continue
		}
		fmt.Println(a.network, a.addr, "->", ap)
	}
	// Output:
	// tcp 127.0.0.1:8080 -> 127.0.0.1:8080
	// tcp4 :0 -> 0.0.0.0:0
	// tcp6 [::1]:443 -> [::1]:443
	// tcp [::ffff:192.0.2.1]:80 -> 192.0.2.1:80
	// tcp4 [::1]:80 -> address "[::1]:80": IPv6 address for network tcp4
}

func ExampleNewRawSockaddr() {
	// The kernel-layout sockaddr for io_uring CONNECT: pass Pointer() and
	// Len() in the SQE and keep r alive until the completion.
	r, err := NewRawSockaddr(netip.MustParseAddrPort("192.0.2.7:443"), 0)
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Len(), r.Bytes()[2:8]) // port and address, network order
	r6, _ := NewRawSockaddr(netip.MustParseAddrPort("192.0.2.7:443"), unix.AF_INET6)
	fmt.Println(r6.Len())
	// Output:
	// 16 [1 187 192 0 2 7]
	// 28
}

func ExampleParseTCPInfo() {
	// A struct tcp_info as an old kernel would return it: 104 bytes.
	b := make([]byte, 104)
	b[0] = byte(StateEstablished)
	binary.NativeEndian.PutUint32(b[68:], 100) // tcpi_rtt, in µs
	info := ParseTCPInfo(b)
	fmt.Println(info.State, info.RTT, info.Valid("RTT"), info.Valid("BytesRetrans"))
	// Output:
	// ESTABLISHED 100µs true false
}

func ExampleListenGroup() {
	// One listener per queue in a SO_REUSEPORT group, non-blocking for
	// io_uring ACCEPT; each zc queue owns group[i].
	group, err := ListenGroup("tcp", "127.0.0.1:0", 2, ListenOptions{Nonblock: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		for _, s := range group {
			s.Close()
		}
	}()
	a0, _ := group[0].LocalAddr()
	a1, _ := group[1].LocalAddr()
	fmt.Println(len(group), a0 == a1)
	// Output:
	// 2 true
}

func ExampleRecvWindow() {
	ln, _ := Listen("tcp4", "127.0.0.1:0", ListenOptions{Control: func(s *Socket) error { return s.SetMaxSeg(4108) }})
	defer ln.Close()
	la, _ := ln.LocalAddr()
	c, _ := DialAddrPort(la, DialOptions{})
	defer c.Close()
	s, _, _ := ln.Accept()
	defer s.Close()
	c.Write([]byte("hello, window"))
	c.Shutdown(unix.SHUT_WR)

	w, err := NewRecvWindow(s, 1<<20)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Close()
	copyBuf := make([]byte, 64<<10)
	var got []byte
	for {
		res, err := w.Recv(copyBuf)
		got = append(got, res.Mapped...) // valid until the next Recv
		got = append(got, copyBuf[:res.Copied]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	st := w.Stats()
	fmt.Printf("%s (mapped %d, copied %d)\n", got, st.MappedBytes, st.CopiedBytes)
	// Output:
	// hello, window (mapped 0, copied 13)
}

// TestSocketAddrsNoAlloc: LocalAddr and RemoteAddr of a connected socket agree with the
// other end, unmap IPv4 peers of a dual-stack listener, and do not allocate (zc reads both
// for every accepted connection).
func TestSocketAddrsNoAlloc(t *testing.T) {
	for _, tc := range []struct{ listen, dial string }{
		{"127.0.0.1:0", "127.0.0.1"},
		{"[::1]:0", "::1"},
		{"[::]:0", "127.0.0.1"}, // dual stack: the kernel reports ::ffff:127.0.0.1
	} {
		ln, err := Listen("tcp", tc.listen, ListenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		la, _ := ln.LocalAddr()
		c, err := DialAddrPort(netip.AddrPortFrom(netip.MustParseAddr(tc.dial), la.Port()), DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s, peer, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		cl, err1 := c.LocalAddr()
		cr, err2 := c.RemoteAddr()
		sl, err3 := s.LocalAddr()
		sr, err4 := s.RemoteAddr()
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			t.Fatal(err)
		}
		if sr != cl || sl != cr || sr != peer || sr.Addr().String() != tc.dial {
			t.Errorf("%s: server sees %v->%v (accept said %v), client %v->%v", tc.listen, sr, sl, peer, cl, cr)
		}
		if n := testing.AllocsPerRun(100, func() { s.LocalAddr(); s.RemoteAddr() }); n != 0 {
			t.Errorf("%s: %.0f allocations per LocalAddr+RemoteAddr", tc.listen, n)
		}
		s.Close()
		c.Close()
		ln.Close()
		if _, err := s.RemoteAddr(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("RemoteAddr after Close: %v", err)
		}
	}
}
