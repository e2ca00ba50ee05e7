package uring

import (
	"errors"
	"github.com/zcnet/zcnet/internal/leakcheck"
	"github.com/zcnet/zcnet/internal/testutil"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	os.Exit(leakcheck.Main(m, 0,
		leakcheck.Check{Name: "rings", Open: OpenRings},
		leakcheck.Check{Name: "buffer rings", Open: OpenBufRings},
		leakcheck.Check{Name: "zcrx queues", Open: openZcrx.Load},
	))
}

// mmapBuf returns anonymous mapped memory (never Go heap) released at test end.
func mmapBuf(t testing.TB, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// filledBufRing registers a buffer ring of nbufs buffers of bufSize bytes for group, backed
// by mapped memory, with every buffer added (buffer i has ID i). It skips where the kernel
// lacks the ring's flags; the ring is closed, then the memory unmapped, at test end.
func filledBufRing(t testing.TB, r *Ring, nbufs, bufSize int, group uint16, flags uint16) (*BufRing, []byte) {
	t.Helper()
	bufs := mmapBuf(t, nbufs*bufSize)
	br, err := r.RegisterBufRing(uint32(nbufs), group, flags)
	if errors.Is(err, ErrNotSupported) {
		// Only the incremental flag (PbufRingInc) is refused as unsupported.
		testutil.SkipIfNotSupported(t, err, "6.12")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { br.Close() })
	for i := range nbufs {
		br.Add(addr(bufs)+uintptr(i*bufSize), uint32(bufSize), uint16(i), i)
	}
	br.Advance(nbufs)
	return br, bufs
}

func newRing(t testing.TB, entries uint32, opt *Options) *Ring {
	t.Helper()
	r, err := New(entries, opt)
	if err != nil {
		t.Fatalf("New(%d, %+v): %v", entries, opt, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func closeFD(t testing.TB, fd int) { t.Cleanup(func() { unix.Close(fd) }) }

func socketpair(t testing.TB) (int, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	closeFD(t, fds[0])
	closeFD(t, fds[1])
	return fds[0], fds[1]
}

// tcpListener returns a plain IPPROTO_TCP listener on 127.0.0.1 and its port.
func tcpListener(t testing.TB) (int, int) {
	t.Helper()
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	closeFD(t, lfd)
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(lfd, 128); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(lfd)
	if err != nil {
		t.Fatal(err)
	}
	return lfd, sa.(*unix.SockaddrInet4).Port
}

// tcpPair returns a connected loopback TCP pair (client, server).
func tcpPair(t testing.TB) (int, int) {
	t.Helper()
	lfd, port := tcpListener(t)
	cfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	closeFD(t, cfd)
	if err := unix.Connect(cfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: port}); err != nil {
		t.Fatal(err)
	}
	sfd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	closeFD(t, sfd)
	return cfd, sfd
}

// fill writes a deterministic pattern derived from seed.
func fill(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

func mustSubmit(t testing.TB, r *Ring) {
	t.Helper()
	if _, err := r.Submit(); err != nil {
		t.Fatal(err)
	}
}
