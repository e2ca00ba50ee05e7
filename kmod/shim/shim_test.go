package shim

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/kmod"
	"github.com/zcnet/zcnet/kmod/internal/abi"
	"golang.org/x/sys/unix"
)

// inVM is set by the VM harness: there the module must work, so nothing
// may skip for lack of it.
var inVM = os.Getenv("ZCSHIM_VM") == "1"

func countFds() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// waitIdle waits until the module holds nothing but (optionally) one
// context: every region unpinned, every notification delivered.
func waitIdle(contexts uint64, d time.Duration) (Stats, error) {
	deadline := time.Now().Add(d)
	for {
		st, err := ReadStats()
		if err != nil {
			return st, err
		}
		// ReadStats' own open counts as one context.
		if st.Contexts <= contexts+1 && st.Regions == 0 && st.PinnedPages == 0 && st.Socks == 0 && st.Notifs == 0 && st.Ops == 0 {
			return st, nil
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("module not idle after %v: %+v", d, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestMain(m *testing.M) {
	if helperMain() {
		return
	}
	if _, err := os.Stat(DevicePath); err != nil && inVM {
		if err := kmod.Load(os.Getenv("ZCSHIM_KO")); err != nil && !errors.Is(err, kmod.ErrAlreadyLoaded) {
			fmt.Fprintln(os.Stderr, "load:", err)
			os.Exit(1)
		}
	}
	time.Sleep(time.Millisecond) // the first timer sets up the runtime poller's fds
	fds := countFds()
	rc := m.Run()
	if _, err := os.Stat(DevicePath); err == nil {
		if st, err := waitIdle(0, 20*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, "LEAK CHECK FAILED:", err)
			rc = 1
		} else {
			fmt.Printf("leak check: module idle: %+v\n", st)
		}
	}
	if after := countFds(); after != fds {
		fmt.Fprintf(os.Stderr, "LEAK CHECK FAILED: %d fds before the tests, %d after\n", fds, after)
		rc = 1
	}
	os.Exit(rc)
}

// open opens a queue or skips when the module is truly absent (host).
func open(t testing.TB, cfg Config) *Queue {
	t.Helper()
	q, err := Open(cfg)
	if err != nil {
		if errors.Is(err, ErrNotSupported) && !inVM {
			if _, lerr := kmod.Loaded(); errors.Is(lerr, kmod.ErrNotSupported) {
				t.Skipf("%v (this kernel cannot load modules: %v); run make vmtest", err, lerr)
			}
			t.Skipf("%v; run make vmtest", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	if inVM {
		markKlog()
		t.Cleanup(func() { checkKlog(t) })
	}
	return q
}

// tcpPair returns a connected pair of plain TCP (not MPTCP) sockets on
// loopback, closed at cleanup.
func tcpPair(t testing.TB) (int, int) {
	t.Helper()
	c, s := tcpPairRaw(t)
	t.Cleanup(func() { unix.Close(c); unix.Close(s) })
	return c, s
}

// tcpPairRaw is tcpPair without the cleanup: the caller closes both.
func tcpPairRaw(t testing.TB) (int, int) {
	t.Helper()
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ln)
	if err := unix.Bind(ln, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 1); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(ln)
	if err != nil {
		t.Fatal(err)
	}
	c, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(c, sa); err != nil {
		t.Fatal(err)
	}
	s, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

func mmap(t testing.TB, size int) []byte {
	t.Helper()
	b, err := Mmap(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Munmap(b) })
	return b
}

// reap submits what is prepared and collects n completions.
func reap(t testing.TB, q *Queue, n int, timeout time.Duration) []Completion {
	t.Helper()
	out := make([]Completion, 0, n)
	buf := make([]Completion, 64)
	deadline := time.Now().Add(timeout)
	for len(out) < n {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("got %d of %d completions: %v", len(out), n, out)
		}
		want := n - len(out)
		if want > len(buf) {
			want = len(buf)
		}
		if _, err := q.Submit(-1, want, left); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("submit: %v", err)
		}
		k := q.Completions(buf[:want])
		out = append(out, buf[:k]...)
	}
	return out
}

func TestOpenClose(t *testing.T) {
	q := open(t, Config{Entries: 8})
	sq, cq := q.Entries()
	if sq != 8 || cq != 16 {
		t.Fatalf("entries %d/%d, want 8/16", sq, cq)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v, want ErrClosed", err)
	}
	if err := q.PrepNop(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("PrepNop after Close: %v", err)
	}
	if _, err := q.Submit(-1, 0, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
	if _, err := q.Attach(0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Attach after Close: %v", err)
	}
}

func TestNop(t *testing.T) {
	q := open(t, Config{Entries: 16})
	for round := 0; round < 50; round++ {
		for i := 0; i < 16; i++ {
			if err := q.PrepNop(uint64(round*100 + i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := q.PrepNop(0); !errors.Is(err, ErrSQFull) {
			t.Fatalf("17th prep: %v, want ErrSQFull", err)
		}
		cs := reap(t, q, 16, 5*time.Second)
		for i, c := range cs {
			if c.UserData != uint64(round*100+i) || c.Res != 0 || c.Flags != 0 {
				t.Fatalf("cqe %d: %v", i, c)
			}
		}
	}
}

// TestWaitTimeout: a wait with nothing to complete ends with os.ErrDeadlineExceeded; a wait
// whose timeout has not passed sleeps in ENTER (seen in /proc) until a completion arrives,
// and returns it rather than the deadline.
func TestWaitTimeout(t *testing.T) {
	q := open(t, Config{Entries: 4})
	if _, err := q.Submit(0, 1, 50*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("wait on empty CQ: %v, want deadline exceeded", err)
	}
	a, b := tcpPair(t)
	id, err := q.Attach(b)
	if err != nil {
		t.Fatal(err)
	}
	k, err := q.RegisterBytes(mmap(t, 4096), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.PrepRecv(id, k, 0, 100, 9); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   int
		err error
	}
	tid, done := make(chan int, 1), make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		n, err := q.Submit(-1, 1, time.Hour)
		done <- result{n, err}
	}()
	waitInEnter(t, os.Getpid(), <-tid, done)
	if err := testutil.WriteAll(a, []byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.n != 1 {
			t.Fatalf("wait ended by a completion: %d, %v; want 1, nil", r.n, r.err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a completion did not end the wait")
	}
	if c := reap(t, q, 1, 5*time.Second)[0]; c.UserData != 9 || c.Res != 1 {
		t.Fatalf("recv: %v, want 1 byte", c)
	}
}

// waitInEnter waits until thread tid of process pid (tid 0: any of its threads) sleeps in
// the module's ENTER ioctl, read from /proc/PID/task/TID/syscall ("16 0xFD 0xCMD ..." on
// x86-64 while a thread is blocked in ioctl). It fails if done delivers first or if the
// thread is not seen there within a minute (a hang bound, not a timing claim).
func waitInEnter[T any](t *testing.T, pid, tid int, done <-chan T) {
	t.Helper()
	cmd := fmt.Sprintf("%#x", abi.IocEnter)
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		tasks := []string{fmt.Sprint(tid)}
		if tid == 0 {
			ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
			if err != nil {
				t.Fatal(err)
			}
			tasks = tasks[:0]
			for _, e := range ents {
				tasks = append(tasks, e.Name())
			}
		}
		for _, task := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/syscall", pid, task))
			if err != nil {
				t.Fatal(err)
			}
			f := strings.Fields(string(b))
			if len(f) > 2 && f[0] == fmt.Sprint(unix.SYS_IOCTL) && f[2] == cmd {
				return
			}
		}
		select {
		case v := <-done:
			t.Fatalf("the wait ended before it was seen in ENTER: %v", v)
		default:
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("process %d thread %d never seen waiting in ENTER", pid, tid)
		}
	}
}

// TestPollFd: the fd is readable exactly while completions are ready.
func TestPollFd(t *testing.T) {
	q := open(t, Config{Entries: 4})
	pfd := []unix.PollFd{{Fd: int32(q.Fd()), Events: unix.POLLIN}}
	if n, _ := unix.Poll(pfd, 0); n != 0 {
		t.Fatal("readable with an empty CQ")
	}
	q.PrepNop(7)
	if _, err := q.Submit(-1, 0, 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := unix.Poll(pfd, 2000); n != 1 {
		t.Fatal("not readable with a ready completion")
	}
	reap(t, q, 1, time.Second)
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

// TestEcho sends from one attached socket and receives on the other, both
// through the shim, for several sizes and unaligned offsets, checking the
// bytes and the completion/notification contract.
func TestEcho(t *testing.T) {
	q := open(t, Config{Entries: 64})
	a, b := tcpPair(t)
	ida, err := q.Attach(a)
	if err != nil {
		t.Fatal(err)
	}
	idb, err := q.Attach(b)
	if err != nil {
		t.Fatal(err)
	}
	const size = 4 << 20
	src := mmap(t, size)
	dst := mmap(t, size)
	fill(src, 1)
	ks, err := q.RegisterBytes(src, RegionReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := q.RegisterBytes(dst, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ off, n int }{{0, 1}, {0, 4096}, {1, 4095}, {4095, 2}, {123, 100000}, {0, 1 << 20}, {7, 3<<20 + 5}} {
		if err := q.PrepSend(ida, ks, uint64(tc.off), uint32(tc.n), 1); err != nil {
			t.Fatal(err)
		}
		got := 0
		sentDone, notified, recvOut := false, false, false
		for got < tc.n || !sentDone || !notified || recvOut {
			if got < tc.n && !recvOut {
				if err := q.PrepRecv(idb, kd, uint64(tc.off+got), uint32(tc.n-got), 2); err != nil {
					t.Fatal(err)
				}
				recvOut = true
			}
			c := reap(t, q, 1, 10*time.Second)[0]
			switch {
			case c.UserData == 2:
				if c.Res <= 0 {
					t.Fatalf("recv: %v", c)
				}
				recvOut = false
				got += int(c.Res)
			case c.UserData == 1 && c.Notif():
				if !sentDone {
					t.Fatal("notification before the send's completion")
				}
				notified = true
				t.Logf("size %d: notification copied=%v", tc.n, c.Copied())
			case c.UserData == 1:
				if c.Res != int32(tc.n) || !c.More() {
					t.Fatalf("send completion %v, want res %d with More", c, tc.n)
				}
				sentDone = true
			default:
				t.Fatalf("unexpected %v", c)
			}
		}
		if got != tc.n {
			t.Fatalf("received %d of %d", got, tc.n)
		}
		if !bytes.Equal(src[tc.off:tc.off+tc.n], dst[tc.off:tc.off+tc.n]) {
			t.Fatalf("size %d off %d: data differs (sha %x vs %x)", tc.n, tc.off,
				sha256.Sum256(src[tc.off:tc.off+tc.n]), sha256.Sum256(dst[tc.off:tc.off+tc.n]))
		}
	}
	if err := q.Detach(ida); err != nil {
		t.Fatal(err)
	}
	if err := q.Detach(idb); err != nil {
		t.Fatal(err)
	}
	if err := q.Unregister(ks); err != nil {
		t.Fatal(err)
	}
	if err := q.Unregister(kd); err != nil {
		t.Fatal(err)
	}
}
