package loop

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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

// TestFixedUnpinnedAtClose: the driver's Close unpins its registered memory at once (the
// process's VmPin is back where it was), not when the kernel's asynchronous ring teardown
// runs: a new ring under a tight RLIMIT_MEMLOCK right after finds the allowance back.
func TestFixedUnpinnedAtClose(t *testing.T) {
	before := vmPin(t)
	var u *URing
	q := startQueue(t, kindURing, func(q *Queue, d Driver) error { u = d.(*URing); return nil })
	r, err := memreg.New(memreg.Options{BufSize: 1 << 20, Count: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Do(func() error { _, err := u.RegisterRegion(r); return err }); err != nil {
		t.Fatal(err)
	}
	if pinned := vmPin(t); pinned < before+8<<10 {
		t.Fatalf("VmPin %d kB after registering 8 MiB (before: %d kB): the check cannot see pins", pinned, before)
	}
	q.Close()
	if after := vmPin(t); after != before {
		t.Fatalf("VmPin %d kB after the driver closed, %d kB before", after, before)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// vmPin reads the process's pinned memory (kB).
func vmPin(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmPin:"); ok {
			var n int
			for _, f := range strings.Fields(v) {
				for _, ch := range f {
					if ch < '0' || ch > '9' {
						return n
					}
					n = n*10 + int(ch-'0')
				}
				return n
			}
		}
	}
	t.Fatal("no VmPin in /proc/self/status")
	return 0
}
