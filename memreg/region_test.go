package memreg

import (
	"errors"
	"fmt"
	"github.com/zcnet/zcnet/internal/leakcheck"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/uring"
)

func TestMain(m *testing.M) {
	if os.Getenv("MEMREG_MEMLOCK_CHILD") != "" {
		os.Exit(memlockChild())
	}
	os.Exit(leakcheck.Main(m, 0,
		leakcheck.Check{Name: "regions", Open: OpenRegions},
		leakcheck.Check{Name: "rings", Open: uring.OpenRings},
	))
}

func newRegion(t testing.TB, opt Options) *Region {
	t.Helper()
	r, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.abandon()
		r.Close()
	})
	return r
}

func TestBadOptions(t *testing.T) {
	for _, o := range []Options{{}, {BufSize: -1, Count: 4}, {BufSize: 4096, Count: 0}, {BufSize: 1 << 31, Count: 4}, {BufSize: 1 << 20, Count: 1 << 25}} {
		if _, err := New(o); !errors.Is(err, unix.EINVAL) {
			t.Errorf("New(%+v) = %v, want EINVAL", o, err)
		}
	}
}

func TestLifecycle(t *testing.T) {
	r := newRegion(t, Options{BufSize: 4096, Count: 2})
	a, err := r.Get()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := r.Get()
	if _, err := r.Get(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("third Get = %v, want ErrExhausted", err)
	}
	if len(a.Bytes()) != 4096 || a.Addr() == b.Addr() {
		t.Fatal("bad buffer geometry")
	}
	copy(a.Bytes(), "hello")
	if err := a.Release(); err != nil {
		t.Fatal(err)
	}
	// The released handle is stale: no bytes, no second release, no lend.
	if a.Bytes() != nil || a.Valid() {
		t.Fatal("released handle still grants access")
	}
	if err := a.Release(); !errors.Is(err, ErrStale) {
		t.Fatalf("double release = %v", err)
	}
	if _, err := a.Lend(); !errors.Is(err, ErrStale) {
		t.Fatalf("lend after release = %v", err)
	}
	// Lent buffers are not handed out again until the kernel returns them.
	loan, err := b.Lend()
	if err != nil {
		t.Fatal(err)
	}
	if b.Valid() || b.Bytes() != nil {
		t.Fatal("handle of a lent buffer still grants access")
	}
	if err := b.Release(); !errors.Is(err, ErrStale) {
		t.Fatalf("release of lent buffer = %v", err)
	}
	c, _ := r.Get() // the one free buffer (a's)
	if c.Index() == loan.Index() {
		t.Fatal("Get handed out a buffer lent to the kernel")
	}
	if _, err := r.Get(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Get while one lent, one held = %v", err)
	}
	if err := r.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Close with a loan = %v, want ErrBusy", err)
	}
	if err := loan.Return(); err != nil {
		t.Fatal(err)
	}
	if err := loan.Return(); !errors.Is(err, ErrStale) {
		t.Fatalf("double return = %v", err)
	}
	d, err := r.Get()
	if err != nil || d.Index() != loan.Index() {
		t.Fatalf("returned buffer not reusable: %v", err)
	}
	// Reclaim hands the buffer straight back.
	l2, _ := d.Lend()
	e, err := l2.Reclaim()
	if err != nil || !e.Valid() {
		t.Fatalf("reclaim: %v", err)
	}
	var zero Buf
	if zero.Valid() || zero.Bytes() != nil || zero.Release() == nil {
		t.Fatal("zero Buf is usable")
	}
	if _, err := (Loan{}).Reclaim(); !errors.Is(err, ErrStale) {
		t.Fatal("zero Loan reclaimed")
	}
	c.Release()
	e.Release()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); !errors.Is(err, ErrClosed) || !errors.Is(err, os.ErrClosed) {
		t.Fatalf("second close = %v", err)
	}
	if _, err := r.Get(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after close = %v", err)
	}
	if e.Bytes() != nil {
		t.Fatal("handle usable after region close")
	}
}

func TestReceiveRecycle(t *testing.T) {
	r := newRegion(t, Options{BufSize: 1024, Count: 8})
	var ring []Loan
	n := r.provide(5, func(l Loan) { ring = append(ring, l) })
	if n != 5 || r.Lent() != 5 || r.Free() != 3 {
		t.Fatalf("provided %d, lent %d, free %d", n, r.Lent(), r.Free())
	}
	recycled := []int{}
	r.setRecycler(func(idx int) { recycled = append(recycled, idx) })
	b, err := r.received(ring[2].Index())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.received(ring[2].Index()); !errors.Is(err, ErrStale) {
		t.Fatalf("second Received of the same buffer = %v", err)
	}
	if _, err := r.received(99); !errors.Is(err, ErrStale) {
		t.Fatalf("Received(99) = %v", err)
	}
	for i := 0; i < r.Count(); i++ {
		if r.StateOf(i) == Free {
			if _, err := r.received(i); !errors.Is(err, ErrStale) {
				t.Fatalf("Received of free buffer %d = %v", i, err)
			}
			break
		}
	}
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	if len(recycled) != 1 || recycled[0] != ring[2].Index() || r.StateOf(ring[2].Index()) != Kernel {
		t.Fatalf("recycled %v state %v", recycled, r.StateOf(ring[2].Index()))
	}
}

func TestHugePages(t *testing.T) {
	nr, _ := os.ReadFile("/proc/sys/vm/nr_hugepages")
	have, _ := strconv.Atoi(strings.TrimSpace(string(nr)))
	r, err := New(Options{BufSize: 64 << 10, Count: 32, RequireHugePages: true})
	if have == 0 {
		if !errors.Is(err, ErrNotSupported) {
			t.Fatalf("RequireHugePages without reserved pages = %v, want ErrNotSupported", err)
		}
	} else {
		if err != nil {
			t.Fatalf("RequireHugePages with %d reserved pages: %v", have, err)
		}
		if !r.Info().HugeTLB {
			t.Fatal("not hugetlb backed")
		}
		r.Close()
	}
	r = newRegion(t, Options{BufSize: 64 << 10, Count: 32, HugePages: true})
	if !r.Info().HugeTLB && r.Info().Fallback == "" {
		t.Fatal("hugepage fallback not reported")
	}
	t.Logf("hugepages: %+v", r.Info())
}

func TestConcurrentGetRelease(t *testing.T) {
	r := newRegion(t, Options{BufSize: 256, Count: 64})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				b, err := r.Get()
				if errors.Is(err, ErrExhausted) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				p := b.Bytes()
				p[0] = byte(g)
				if i%3 == 0 {
					l, err := b.Lend()
					if err != nil {
						errs <- err
						return
					}
					if err := l.Return(); err != nil {
						errs <- err
						return
					}
					continue
				}
				if p[0] != byte(g) {
					errs <- fmt.Errorf("buffer shared between owners")
					return
				}
				if err := b.Release(); err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if r.Free() != 64 || r.Lent() != 0 {
		t.Fatalf("free %d lent %d after churn", r.Free(), r.Lent())
	}
}

func tcpPair(t *testing.T) (int, int) {
	t.Helper()
	lfd, _ := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	defer unix.Close(lfd)
	unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
	unix.Listen(lfd, 1)
	sa, _ := unix.Getsockname(lfd)
	cfd, _ := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err := unix.Connect(cfd, sa); err != nil {
		t.Fatal(err)
	}
	sfd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(cfd); unix.Close(sfd) })
	return cfd, sfd
}

// TestZeroCopyLifetime registers a region, sends a buffer with SEND_ZC, and checks the buffer
// is not reusable between the send completion and the notification.
func TestZeroCopyLifetime(t *testing.T) {
	ring, err := uring.New(16, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	if err := ring.RegisterBuffersSparse(4); err != nil {
		t.Fatal(err)
	}
	r := newRegion(t, Options{BufSize: 64 << 10, Count: 2})
	// Register the region by hand in slot 1 (internal/loop keeps the real table).
	if err := r.holdForKernel(); err != nil {
		t.Fatal(err)
	}
	mem := r.Memory()
	if _, err := ring.UpdateBuffers(1, []uring.Iovec{{Base: uint64(r.Base()), Len: uint64(len(mem))}}, nil); err != nil {
		t.Fatal(err)
	}
	const idx = 1
	c, s := tcpPair(t)
	b, _ := r.Get()
	other, _ := r.Get()
	p := b.Bytes()
	for i := range p {
		p[i] = byte(i * 7)
	}
	loan, err := b.Lend()
	if err != nil {
		t.Fatal(err)
	}
	sqe := ring.GetSQE()
	sqe.PrepSendZCFixed(int32(c), loan.Addr(), uint32(r.BufSize()), 0, uring.SendZCReportUsage, idx)
	sqe.UserData = 1
	if _, err := ring.Submit(); err != nil {
		t.Fatal(err)
	}
	other.Release()
	gotNotif := false
	for !gotNotif {
		cqe, err := ring.WaitCQETimeout(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if cqe.Notif() {
			gotNotif = true
			if err := loan.Return(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if cqe.Res != int32(r.BufSize()) {
			t.Fatalf("send res %d", cqe.Res)
		}
		// Send completed but no notification yet: the lent buffer must not come back from Get.
		if g, err := r.Get(); err == nil {
			if g.Index() == loan.Index() {
				t.Fatal("buffer handed out between send completion and notification")
			}
			g.Release()
		}
	}
	got := make([]byte, r.BufSize())
	for n := 0; n < len(got); {
		k, err := unix.Read(s, got[n:])
		if err != nil {
			t.Fatal(err)
		}
		n += k
	}
	for i := range got {
		if got[i] != byte(i*7) {
			t.Fatalf("byte %d corrupted", i)
		}
	}
	if err := r.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("close while registered = %v", err)
	}
	if _, err := ring.UpdateBuffers(1, make([]uring.Iovec, 1), nil); err != nil {
		t.Fatal(err)
	}
	r.releaseFromKernel()
}

// TestMemlockError runs a child without CAP_IPC_LOCK under a 64 KiB RLIMIT_MEMLOCK and checks
// that registering 4 MiB fails with the helpful *MemlockError.
func TestMemlockError(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "MEMREG_MEMLOCK_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	s := string(out)
	if !strings.Contains(s, "RLIMIT_MEMLOCK is 64 KiB") || !strings.Contains(s, "ulimit -l") || !strings.Contains(s, "MEMLOCK-OK") {
		t.Fatalf("child output lacks the helpful error:\n%s", s)
	}
	t.Logf("child said: %s", strings.TrimSpace(s))
}

// memlockChild drops CAP_IPC_LOCK on a locked thread (capabilities are per thread; the ring
// records the creator's credentials), lowers RLIMIT_MEMLOCK and tries to register.
func memlockChild() int {
	runtime.LockOSThread()
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: 64 << 10, Max: 64 << 10}); err != nil {
		fmt.Println("setrlimit:", err)
		return 1
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		fmt.Println("capget:", err)
		return 1
	}
	data[unix.CAP_IPC_LOCK/32].Effective &^= 1 << (unix.CAP_IPC_LOCK % 32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		fmt.Println("capset:", err)
		return 1
	}
	ring, err := uring.New(4, nil)
	if err != nil {
		fmt.Println("ring:", err)
		return 1
	}
	defer ring.Close()
	if err := ring.RegisterBuffersSparse(2); err != nil {
		fmt.Println("sparse:", err)
		return 1
	}
	r, err := New(Options{BufSize: 1 << 20, Count: 4})
	if err != nil {
		fmt.Println("region:", err)
		return 1
	}
	defer r.Close()
	_, err = ring.UpdateBuffers(0, []uring.Iovec{{Base: uint64(r.Base()), Len: uint64(len(r.Memory()))}}, nil)
	if errors.Is(err, unix.ENOMEM) {
		err = NewMemlockError(len(r.Memory()), err)
	}
	var me *MemlockError
	if !errors.As(err, &me) || !errors.Is(err, unix.ENOMEM) {
		fmt.Printf("register under a 64 KiB limit: %v (want *MemlockError)\n", err)
		return 1
	}
	fmt.Println(err)
	fmt.Println("MEMLOCK-OK")
	return 0
}

func TestRaiseMemlock(t *testing.T) {
	var rl unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl)
	defer unix.Setrlimit(unix.RLIMIT_MEMLOCK, &rl)
	got, err := RaiseMemlock(rl.Cur)
	if err != nil || got != rl.Cur {
		t.Fatalf("RaiseMemlock(current) = %d, %v", got, err)
	}
	if rl.Cur != unix.RLIM_INFINITY {
		want := rl.Cur + 1<<20
		got, err := RaiseMemlock(want)
		if err != nil && got == 0 {
			t.Fatal(err)
		}
		var now unix.Rlimit
		unix.Getrlimit(unix.RLIMIT_MEMLOCK, &now)
		if now.Cur != got {
			t.Fatalf("RaiseMemlock says %d, limit is %d", got, now.Cur)
		}
	}
}

func BenchmarkGetRelease(b *testing.B) {
	r := newRegion(b, Options{BufSize: 4096, Count: 64})
	for b.Loop() {
		x, _ := r.Get()
		x.Release()
	}
}

func BenchmarkLendReturn(b *testing.B) {
	r := newRegion(b, Options{BufSize: 4096, Count: 64})
	for b.Loop() {
		x, _ := r.Get()
		l, _ := x.Lend()
		l.Return()
	}
}

// TestValidFastPath: Buf.Valid's lock-free answer (the tag mirror of gen and state) agrees
// with the locked check for every handle ever handed out, after every step of a random walk
// through Get, Release, Lend, Return, Reclaim, Share and the shared owners' releases.
func TestValidFastPath(t *testing.T) {
	r, err := New(Options{BufSize: 4096, Count: 4})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var held []Buf
	var loans []Loan
	var refs []*Ref
	var seen []Buf
	locked := func(b Buf) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return b.check() == nil
	}
	for step := 0; step < 20000; step++ {
		switch op := rng.IntN(7); {
		case op == 0 || len(held) == 0:
			if b, err := r.Get(); err == nil {
				held = append(held, b)
				seen = append(seen, b)
			}
		case op == 1:
			i := rng.IntN(len(held))
			held[i].Release()
			held = append(held[:i], held[i+1:]...)
		case op == 2:
			i := rng.IntN(len(held))
			if l, err := held[i].Lend(); err == nil {
				loans = append(loans, l)
				held = append(held[:i], held[i+1:]...)
			}
		case op == 3 && len(loans) > 0:
			i := rng.IntN(len(loans))
			loans[i].Return()
			loans = append(loans[:i], loans[i+1:]...)
		case op == 4 && len(loans) > 0:
			i := rng.IntN(len(loans))
			if b, err := loans[i].Reclaim(); err == nil {
				held = append(held, b)
				seen = append(seen, b)
			}
			loans = append(loans[:i], loans[i+1:]...)
		case op == 5:
			i := rng.IntN(len(held))
			if x, err := held[i].Share(nil); err == nil {
				refs = append(refs, x)
			}
		case op == 6 && len(refs) > 0:
			i := rng.IntN(len(refs))
			refs[i].Release()
			refs = append(refs[:i], refs[i+1:]...)
		}
		for _, b := range seen {
			if fast, slow := b.Valid(), locked(b); fast != slow {
				t.Fatalf("step %d: buffer %d gen %d: Valid %v, locked check %v", step, b.idx, b.gen, fast, slow)
			}
		}
		if len(seen) > 64 {
			seen = seen[len(seen)-64:]
		}
	}
	for _, x := range refs {
		x.Release()
	}
	for _, l := range loans {
		l.Return()
	}
	for _, b := range held {
		b.Release()
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}
