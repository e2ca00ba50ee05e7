package tcpglue

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strconv"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

// zcSender sends with MSG_ZEROCOPY and tracks the completion notifications
// on the socket's error queue.
type zcSender struct {
	s         *Socket
	sent      uint32 // sends that will produce a notification
	completed uint32
	copied    uint32 // notifications flagged SO_EE_CODE_ZEROCOPY_COPIED
}

// drain reads every queued notification without blocking (SendZeroCopy's own reader).
func (z *zcSender) drain() error {
	var r ZeroCopyTXReport
	if err := z.s.zcDrain(&r); err != nil {
		return err
	}
	z.completed += uint32(r.Notified)
	z.copied += uint32(r.Copied)
	return nil
}

// send writes all of p with MSG_ZEROCOPY. p must not change until wait returns.
func (z *zcSender) send(p []byte) error {
	for len(p) > 0 {
		n, err := z.s.Send(p, unix.MSG_ZEROCOPY)
		if errors.Is(err, unix.ENOBUFS) {
			// Too many notifications outstanding (optmem): collect some.
			if err := z.drain(); err != nil {
				return err
			}
			if err := z.waitErr(); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		z.sent++
		p = p[n:]
	}
	return z.drain()
}

func (z *zcSender) waitErr() error {
	return z.s.Control(func(fd int) error {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: 0}} // POLLERR is always reported
		_, err := unix.Poll(pfd, 100)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		return nil
	})
}

// wait collects notifications until every send has one.
func (z *zcSender) wait() error {
	for tries := 0; z.completed < z.sent; tries++ {
		if tries > 600 {
			return fmt.Errorf("only %d of %d zerocopy notifications arrived", z.completed, z.sent)
		}
		if err := z.waitErr(); err != nil {
			return err
		}
		if err := z.drain(); err != nil {
			return err
		}
	}
	return nil
}

// pageBuf returns n bytes of page-aligned, deterministic pseudo-random data
// in an anonymous mapping, and its unmapper.
func pageBuf(t *testing.T, n int, seed uint64) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	r.Read(b)
	return b
}

// residentPages counts the window pages present in the page tables.
func residentPages(w *RecvWindow) (int, error) {
	vec := make([]byte, len(w.mem)/w.page)
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&w.mem[0])), uintptr(len(w.mem)), uintptr(unsafe.Pointer(&vec[0])))
	if e != 0 {
		return 0, e
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n, nil
}

type zcResult struct {
	sum    [32]byte
	stats  RecvStats
	err    error
	nbytes int
}

// receiveAll drains a connection through a RecvWindow until EOF.
func receiveAll(s *Socket, window, copyLen int) zcResult {
	w, err := NewRecvWindow(s, window)
	if err != nil {
		return zcResult{err: err}
	}
	defer w.Close()
	h := sha256.New()
	copyBuf := make([]byte, copyLen)
	total, calls := 0, 0
	for {
		res, err := w.Recv(copyBuf)
		h.Write(res.Mapped)
		h.Write(copyBuf[:res.Copied])
		total += res.Len()
		// Exactly the pages of this call are mapped: stale ones from earlier
		// calls were released.
		if n, merr := residentPages(w); merr != nil || n != len(res.Mapped)/w.page {
			return zcResult{err: fmt.Errorf("after Recv mapping %d bytes, %d pages resident (%v)", len(res.Mapped), n, merr)}
		}
		if calls++; calls%5 == 0 && len(res.Mapped) > 0 {
			if err := w.Release(); err != nil {
				return zcResult{err: err}
			}
			if n, _ := residentPages(w); n != 0 {
				return zcResult{err: fmt.Errorf("%d pages resident after Release", n)}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return zcResult{err: err, stats: w.Stats(), nbytes: total}
		}
	}
	var r zcResult
	copy(r.sum[:], h.Sum(nil))
	r.stats = w.Stats()
	r.nbytes = total
	return r
}

func mssPair(t testing.TB, mss int) (*Socket, *Socket) {
	t.Helper()
	ctl := func(s *Socket) error {
		if mss == 0 {
			return nil
		}
		return s.SetMaxSeg(mss)
	}
	return pair(t, "tcp4", "127.0.0.1:0", ListenOptions{Control: ctl}, DialOptions{Control: ctl})
}

func ratio(st RecvStats) string {
	tot := st.MappedBytes + st.CopiedBytes
	if tot == 0 {
		return "no data"
	}
	return fmt.Sprintf("mapped %d (%.1f%%) copied %d in %d calls",
		st.MappedBytes, 100*float64(st.MappedBytes)/float64(tot), st.CopiedBytes, st.Calls)
}

const zcTotal = 32 << 20

func TestRecvWindowPlainSender(t *testing.T) {
	for _, mss := range []int{0, 4108} {
		t.Run("mss="+strconv.Itoa(mss), func(t *testing.T) {
			c, s := mssPair(t, mss)
			data := pageBuf(t, zcTotal, 1)
			want := sha256.Sum256(data)
			done := make(chan zcResult, 1)
			go func() { done <- receiveAll(s, 1<<20, 256<<10) }()
			// Odd write sizes, from the middle of pages.
			rng := rand.New(rand.NewPCG(1, 2))
			for off := 0; off < len(data); {
				n := min(1+rng.IntN(300<<10), len(data)-off)
				if _, err := c.Write(data[off : off+n]); err != nil {
					t.Fatal(err)
				}
				off += n
			}
			c.Shutdown(unix.SHUT_WR)
			r := <-done
			if r.err != nil {
				t.Fatalf("receive: %v after %d bytes", r.err, r.nbytes)
			}
			if r.nbytes != zcTotal || r.sum != want {
				t.Fatalf("received %d bytes, checksum match %v", r.nbytes, r.sum == want)
			}
			t.Logf("plain sender, MSS option %d: %s", mss, ratio(r.stats))
		})
	}
}

func TestRecvWindowZeroCopySender(t *testing.T) {
	c, s := mssPair(t, 4108)
	if err := c.SetZeroCopy(true); err != nil {
		t.Fatal(err)
	}
	data := pageBuf(t, zcTotal, 2)
	want := sha256.Sum256(data)
	done := make(chan zcResult, 1)
	go func() { done <- receiveAll(s, 1<<20, 256<<10) }()
	z := &zcSender{s: c}
	const chunk = 256 << 10
	for off := 0; off < len(data); off += chunk {
		if err := z.send(data[off:min(off+chunk, len(data))]); err != nil {
			t.Fatal(err)
		}
	}
	c.Shutdown(unix.SHUT_WR)
	r := <-done
	if err := z.wait(); err != nil {
		t.Error(err)
	}
	if r.err != nil {
		t.Fatalf("receive: %v after %d bytes", r.err, r.nbytes)
	}
	if r.nbytes != zcTotal || r.sum != want {
		t.Fatalf("received %d bytes, checksum match %v", r.nbytes, r.sum == want)
	}
	t.Logf("MSG_ZEROCOPY sender, TCP_MAXSEG 4108: %s; %d sends, %d notifications flagged COPIED",
		ratio(r.stats), z.sent, z.copied)
	if r.stats.MappedBytes == 0 {
		t.Errorf("no page was mapped: %s", ratio(r.stats))
	}
}

func TestRecvWindowSmallAndEOF(t *testing.T) {
	c, s := pair(t, "tcp6", "[::1]:0", ListenOptions{}, DialOptions{})
	w, err := NewRecvWindow(s, 1) // rounded up to a page
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Size() != unix.Getpagesize() {
		t.Errorf("window size %d", w.Size())
	}
	if _, err := c.Write([]byte("short message")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	var got []byte
	for len(got) < 13 {
		res, err := w.Recv(buf)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Mapped) != 0 {
			t.Error("13 bytes cannot be mapped")
		}
		got = append(got, buf[:res.Copied]...)
	}
	if string(got) != "short message" {
		t.Fatalf("got %q", got)
	}
	c.Shutdown(unix.SHUT_WR)
	res, err := w.Recv(buf)
	if err != io.EOF || res.Len() != 0 {
		t.Fatalf("after FIN: %+v, %v; want io.EOF", res, err)
	}
	// Still EOF, and Release with nothing mapped is fine.
	if _, err := w.Recv(buf); err != io.EOF {
		t.Errorf("second Recv at EOF: %v", err)
	}
	if err := w.Release(); err != nil {
		t.Error(err)
	}
}

func TestRecvWindowErrors(t *testing.T) {
	c, s := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{})
	for _, n := range []int{0, -4096, 2 << 30} {
		if _, err := NewRecvWindow(s, n); !asValueError(err) {
			t.Errorf("NewRecvWindow(%d): %v", n, err)
		}
	}
	w, err := NewRecvWindow(s, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(nil); !asValueError(err) {
		t.Errorf("Recv(nil): %v", err)
	}
	// Non-blocking and idle: EAGAIN.
	s.SetNonblocking(true)
	if _, err := w.Recv(make([]byte, 16)); !errors.Is(err, unix.EAGAIN) {
		t.Errorf("idle non-blocking Recv: %v, want EAGAIN", err)
	}
	s.SetNonblocking(false)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
	if _, err := w.Recv(make([]byte, 16)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Recv after Close: %v", err)
	}
	if err := w.Release(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Release after Close: %v", err)
	}

	// A reset is an error, not end of stream.
	w2, err := NewRecvWindow(c, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	s.SetLinger(0)
	s.Close()
	_, err = w2.Recv(make([]byte, 16))
	if !errors.Is(err, unix.ECONNRESET) {
		t.Errorf("Recv after peer reset: %v, want ECONNRESET", err)
	}
	var oe *OpError
	if !errors.As(err, &oe) {
		t.Errorf("reset error %T is not *OpError", err)
	}

	// Closed socket.
	if _, err := NewRecvWindow(s, 4096); !errors.Is(err, net.ErrClosed) {
		t.Errorf("NewRecvWindow on closed socket: %v", err)
	}
	// Listening socket: the kernel says ENOTCONN.
	ln, err := Listen("tcp4", "127.0.0.1:0", ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	wl, err := NewRecvWindow(ln, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer wl.Close()
	if _, err := wl.Recv(make([]byte, 16)); !errors.Is(err, unix.ENOTCONN) {
		t.Errorf("Recv on listener: %v, want ENOTCONN", err)
	}
}

func TestRecvWindowCloseWakes(t *testing.T) {
	_, s := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{})
	w, err := NewRecvWindow(s, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	err = closeWhileBlocked(s, func() error {
		_, err := w.Recv(make([]byte, 64))
		return err
	})
	if !errors.Is(err, net.ErrClosed) {
		t.Fatalf("blocked Recv after Close: %v, want net.ErrClosed", err)
	}
}

// TestZeroCopyReceiveLayoutC checks zcReceive against <linux/tcp.h>.
func TestZeroCopyReceiveLayoutC(t *testing.T) {
	if _, err := os.Stat("/usr/include/linux/tcp.h"); err != nil {
		t.Skip("no /usr/include/linux/tcp.h")
	}
	fields := []struct {
		c   string
		off uintptr
		sz  uintptr
	}{
		{"address", unsafe.Offsetof(zcReceive{}.Address), 8},
		{"length", unsafe.Offsetof(zcReceive{}.Length), 4},
		{"recv_skip_hint", unsafe.Offsetof(zcReceive{}.RecvSkipHint), 4},
		{"inq", unsafe.Offsetof(zcReceive{}.Inq), 4},
		{"err", unsafe.Offsetof(zcReceive{}.Err), 4},
		{"copybuf_address", unsafe.Offsetof(zcReceive{}.CopybufAddr), 8},
		{"copybuf_len", unsafe.Offsetof(zcReceive{}.CopybufLen), 4},
		{"flags", unsafe.Offsetof(zcReceive{}.Flags), 4},
		{"msg_control", unsafe.Offsetof(zcReceive{}.MsgControl), 8},
		{"msg_controllen", unsafe.Offsetof(zcReceive{}.MsgControllen), 8},
		{"msg_flags", unsafe.Offsetof(zcReceive{}.MsgFlags), 4},
		{"reserved", unsafe.Offsetof(zcReceive{}.Reserved), 4},
	}
	checks := map[string]uint64{
		"sizeof(struct tcp_zerocopy_receive)":      uint64(unsafe.Sizeof(zcReceive{})),
		"TCP_RECEIVE_ZEROCOPY_FLAG_TLB_CLEAN_HINT": tcpReceiveZerocopyFlagTLBCleanHint,
	}
	for _, f := range fields {
		checks["offsetof(struct tcp_zerocopy_receive, "+f.c+")"] = uint64(f.off)
		checks["sizeof(((struct tcp_zerocopy_receive *)0)->"+f.c+")"] = uint64(f.sz)
	}
	testutil.CompareWithC(t, []string{"linux/tcp.h"}, nil, checks)
}

// TestRecvWindowRealigns queues an unaligned plain write in front of
// page-aligned zero-copy data: Recv must copy exactly the unmappable bytes
// and then map the rest (copying more would misalign the stream for good).
func TestRecvWindowRealigns(t *testing.T) {
	c, s := mssPair(t, 4108)
	if err := c.SetZeroCopy(true); err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 5000)
	for i := range head {
		head[i] = byte(i * 7)
	}
	bulk := pageBuf(t, 64<<10, 3) // fits the initial receive window
	if _, err := c.Write(head); err != nil {
		t.Fatal(err)
	}
	z := &zcSender{s: c}
	if err := z.send(bulk); err != nil {
		t.Fatal(err)
	}
	want := len(head) + len(bulk)
	for i := 0; ; i++ {
		n, err := s.InQueue()
		if err != nil {
			t.Fatal(err)
		}
		if n == want {
			break
		}
		if i > 10000 {
			t.Fatalf("only %d of %d bytes queued", n, want)
		}
		runtime.Gosched()
		if i%100 == 99 {
			z.waitErr()
		}
	}
	w, err := NewRecvWindow(s, 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	copyBuf := make([]byte, 256<<10)
	var got []byte
	for len(got) < want {
		res, err := w.Recv(copyBuf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, res.Mapped...)
		got = append(got, copyBuf[:res.Copied]...)
	}
	if string(got[:len(head)]) != string(head) || string(got[len(head):]) != string(bulk) {
		t.Fatal("data mismatch")
	}
	st := w.Stats()
	t.Logf("unaligned head + zero-copy bulk: %s", ratio(st))
	if st.MappedBytes < uint64(len(bulk))/2 {
		t.Errorf("after a %d-byte unaligned head only %s", len(head), ratio(st))
	}
	if err := z.wait(); err != nil {
		t.Error(err)
	}
}

func TestProbeZeroCopyReceive(t *testing.T) {
	err := ProbeZeroCopyReceive()
	if err == nil {
		return
	}
	// Missing is acceptable only on kernels older than 4.18.
	var u unix.Utsname
	unix.Uname(&u)
	var major, minor int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor)
	if errors.Is(err, ErrNotSupported) && (major < 4 || major == 4 && minor < 18) {
		t.Skipf("kernel %d.%d: %v", major, minor, err)
	}
	t.Fatalf("kernel %d.%d: %v", major, minor, err)
}
