package loop

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/memreg"
)

// TestFixedTable: the fixed-buffer table of the io_uring driver (moved here from memreg):
// register, look up, refuse a second registration and a Close of a registered region,
// unregister, and Close of the driver gives every region back.
func TestFixedTable(t *testing.T) {
	var u *URing
	q := startQueue(t, kindURing, func(q *Queue, d Driver) error { u = d.(*URing); return nil })
	r, err := memreg.New(memreg.Options{BufSize: 64 << 10, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := memreg.New(memreg.Options{BufSize: 4096, Count: 4})
	if err != nil {
		t.Fatal(err)
	}
	err = q.Do(func() error {
		first, err := u.RegisterRegion(r)
		if err != nil {
			return err
		}
		if _, err := u.RegisterRegion(r); !errors.Is(err, memreg.ErrBusy) {
			t.Errorf("double register = %v, want ErrBusy", err)
		}
		b, _ := r.Get()
		defer b.Release()
		idx, ok := u.FixedIndex(r, b.Addr(), len(b.Bytes()))
		if !ok || uint32(idx) != first {
			t.Errorf("FixedIndex = %d, %v; want %d", idx, ok, first)
		}
		if _, ok := u.FixedIndex(r, b.Addr(), 1<<30); ok {
			t.Error("FixedIndex accepted a range outside the region")
		}
		if _, ok := u.FixedIndex(r2, r2.Base(), 1); ok {
			t.Error("FixedIndex of an unregistered region")
		}
		if err := r.Close(); !errors.Is(err, memreg.ErrBusy) {
			t.Errorf("Close while registered = %v, want ErrBusy", err)
		}
		if err := u.UnregisterRegion(r); err != nil {
			return err
		}
		if err := u.UnregisterRegion(r); !errors.Is(err, unix.ENOENT) {
			t.Errorf("double unregister = %v, want ENOENT", err)
		}
		_, err = u.RegisterRegion(r2) // left registered: Close gives it back
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Close after unregister: %v", err)
	}
	if err := r2.Close(); !errors.Is(err, memreg.ErrBusy) {
		t.Fatalf("Close of a registered region = %v", err)
	}
	q.Close()
	if err := r2.Close(); err != nil {
		t.Fatalf("Close after the driver closed: %v", err)
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
		r, err := memreg.New(memreg.Options{BufSize: 1 << 20, Count: 4})
		if err != nil {
			fmt.Println("region:", err)
			return 1
		}
		err = q.Do(func() error { _, err := u.RegisterRegion(r); return err })
		q.Close()
		r.Close()
		if err != nil {
			fmt.Printf("round %d: register 4 MiB under a 6 MiB limit right after the last Close: %v\n", i, err)
			return 1
		}
	}
	fmt.Println("30 rounds of register 4 MiB / Close under a 6 MiB RLIMIT_MEMLOCK")
	fmt.Println("UNPIN-OK")
	return 0
}
