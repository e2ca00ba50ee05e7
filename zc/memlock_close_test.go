package zc

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/memregops"
	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/internal/uring"
)

const memlockCloseChildEnv = "ZC_MEMLOCK_CLOSE_CHILD"

// TestNewRightAfterClose: Engine.Close gives the locked memory back before it returns. A
// child running as nobody (no CAP_IPC_LOCK) under a 1 MiB RLIMIT_MEMLOCK makes 50 engines
// one after the other, each New right after the previous Close, with NoFallback: every one
// must get the io_uring backend. (The kernel frees a closed ring's memory, and unpins
// what was registered with it, in a workqueue after the ring's descriptor is closed: before
// Close waited for that, 23–40 of 50 New calls failed here.)
func TestNewRightAfterClose(t *testing.T) {
	out, err := testutil.RunAsNobody(t, memlockCloseChildEnv+"=1")
	if err != nil || !strings.Contains(out, "MEMLOCK-CLOSE-CHILD-OK") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("child:\n%s", strings.TrimSpace(out))
}

// memlockCloseChild is the unprivileged side of TestNewRightAfterClose.
func memlockCloseChild() int {
	const limit = 1 << 20
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		fmt.Println("setrlimit:", err)
		return 1
	}
	if _, ok := memregops.MemlockLimit(); !ok {
		fmt.Println("the child still has CAP_IPC_LOCK or no limit")
		return 1
	}
	pr := newMemlockProbe()
	if pr != nil {
		fmt.Printf("at start: %d KiB more may be pinned\n", pr.avail())
	}
	const rounds = 50
	var failed []string
	for i := range rounds {
		e, err := New(Config{Queues: 1, NoFallback: true})
		if err != nil {
			failed = append(failed, fmt.Sprintf("round %d: %v", i, err))
			continue
		}
		if b := e.Config().Backend; b != BackendIOUring {
			failed = append(failed, fmt.Sprintf("round %d: backend %v", i, b))
		}
		open := vmPin()
		if pr != nil {
			open += fmt.Sprintf(", %d KiB more may be pinned", pr.avail())
		}
		e.Close()
		if i < 3 && pr != nil {
			fmt.Printf("round %d: open: %s; right after Close: %s, %d KiB more may be pinned\n", i, open, vmPin(), pr.avail())
		}
	}
	fmt.Printf("%d of %d New right after Close failed; rings whose teardown Close did not see: %d\n", len(failed), rounds, loop.CloseWaitMissed())
	for _, f := range failed[:min(len(failed), 5)] {
		fmt.Println(f)
	}
	if len(failed) > 0 {
		return 1
	}
	fmt.Println("MEMLOCK-CLOSE-CHILD-OK")
	return 0
}

// vmPin is the process's pinned memory line of /proc/self/status.
func vmPin() string {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmPin") {
			return strings.Join(strings.Fields(l), " ")
		}
	}
	return "VmPin ?"
}

// memlockProbe measures how much more this user may pin now, by registering buffers on a
// small ring of its own (KiB).
type memlockProbe struct {
	r   *uring.Ring
	mem []byte
}

func newMemlockProbe() *memlockProbe {
	r, err := uring.New(4, nil)
	if err != nil {
		return nil
	}
	mem, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil
	}
	return &memlockProbe{r: r, mem: mem}
}

func (p *memlockProbe) avail() int {
	lo, hi := 0, len(p.mem)/4096
	for lo < hi {
		mid := (lo + hi + 1) / 2
		iov := []uring.Iovec{{Base: uint64(uintptr(unsafe.Pointer(&p.mem[0]))), Len: uint64(mid * 4096)}}
		if err := p.r.RegisterBuffers(iov, nil); err == nil {
			p.r.UnregisterBuffers()
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo * 4
}
