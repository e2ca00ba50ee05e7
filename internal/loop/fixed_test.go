package loop

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

// mapAnon maps n bytes of anonymous memory for the test.
func mapAnon(tb testing.TB, n int) []byte {
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Munmap(mem) })
	return mem
}

func baseOf(mem []byte) uintptr { return uintptr(unsafe.Pointer(&mem[0])) }

// TestFixedTable: the fixed-buffer table of the io_uring driver: register, look up, refuse a
// second registration, unregister (the release function runs once), and Close of the driver
// releases what is still registered.
func TestFixedTable(t *testing.T) {
	var u *URing
	q := startQueue(t, kindURing, func(q *Queue, d Driver) error { u = d.(*URing); return nil })
	m, m2 := mapAnon(t, 128<<10), mapAnon(t, 16<<10)
	var released, released2 atomic.Int32
	err := q.Do(func() error {
		first, err := u.RegisterMem(m, func() { released.Add(1) })
		if err != nil {
			return err
		}
		if _, err := u.RegisterMem(m, nil); !errors.Is(err, unix.EBUSY) {
			t.Errorf("double register = %v, want EBUSY", err)
		}
		if _, err := u.RegisterMem(nil, nil); !errors.Is(err, unix.EINVAL) {
			t.Errorf("register of no memory = %v, want EINVAL", err)
		}
		idx, ok := u.FixedIndex(baseOf(m), baseOf(m)+64<<10, 64<<10)
		if !ok || uint32(idx) != first {
			t.Errorf("FixedIndex = %d, %v; want %d", idx, ok, first)
		}
		if _, ok := u.FixedIndex(baseOf(m), baseOf(m)+64<<10, 64<<10+1); ok {
			t.Error("FixedIndex accepted a range past the memory's end")
		}
		if _, ok := u.FixedIndex(baseOf(m), baseOf(m)-1, 1); ok {
			t.Error("FixedIndex accepted a range before the memory")
		}
		if _, ok := u.FixedIndex(baseOf(m2), baseOf(m2), 1); ok {
			t.Error("FixedIndex of unregistered memory")
		}
		if err := u.UnregisterMem(baseOf(m)); err != nil {
			return err
		}
		if released.Load() != 1 {
			t.Errorf("release ran %d times after unregister, want 1", released.Load())
		}
		if err := u.UnregisterMem(baseOf(m)); !errors.Is(err, unix.ENOENT) {
			t.Errorf("double unregister = %v, want ENOENT", err)
		}
		_, err = u.RegisterMem(m2, func() { released2.Add(1) }) // left registered: Close releases it
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if released2.Load() != 0 {
		t.Fatal("released while registered")
	}
	q.Close()
	if released.Load() != 1 || released2.Load() != 1 {
		t.Fatalf("after Close: released %d and %d times, want 1 and 1", released.Load(), released2.Load())
	}
}

// TestFixedUnpinnedAtClose: the driver's Close unpins its registered memory at once, not
// when the kernel's asynchronous ring teardown gets to it. A child without CAP_IPC_LOCK
// (nobody) under a 6 MiB RLIMIT_MEMLOCK registers 4 MiB, closes, and does it again, 30 times
// in a row: with the pages still accounted to the closed ring the next registration fails
// with ENOMEM (the "49 of 50 New after a Close failed").
func TestFixedUnpinnedAtClose(t *testing.T) {
	out, err := testutil.RunAsNobody(t, unpinChildEnv+"=1")
	if err != nil || !strings.Contains(out, "UNPIN-OK") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("child: %s", strings.TrimSpace(out))
}

const unpinChildEnv = "LOOP_UNPIN_CHILD"

// unpinChild is TestFixedUnpinnedAtClose's unprivileged side.
func unpinChild() int {
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: 6 << 20, Max: 6 << 20}); err != nil {
		fmt.Println("setrlimit:", err)
		return 1
	}
	for i := 0; i < 30; i++ {
		var u *URing
		q, err := Start(Config{NoPin: true}, func(q *Queue) (Driver, error) {
			var err error
			u, err = NewURing(q, URingConfig{})
			return u, err
		})
		if err != nil {
			fmt.Println("start:", err)
			return 1
		}
		mem, err := unix.Mmap(-1, 0, 4<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			fmt.Println("mmap:", err)
			return 1
		}
		err = q.Do(func() error { _, err := u.RegisterMem(mem, nil); return err })
		q.Close()
		unix.Munmap(mem)
		if err != nil {
			fmt.Printf("round %d: register 4 MiB under a 6 MiB limit right after the last Close: %v\n", i, err)
			return 1
		}
	}
	fmt.Println("30 rounds of register 4 MiB / Close under a 6 MiB RLIMIT_MEMLOCK")
	fmt.Println("UNPIN-OK")
	return 0
}
