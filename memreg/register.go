package memreg

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/uring"
)

// maxFixed is the largest fixed buffer io_uring accepts (1 GiB); bigger regions take several
// consecutive slots.
const maxFixed = 1 << 30

// Slots returns how many fixed-buffer slots the region needs.
func (r *Region) Slots() int { return (len(r.mem) + maxFixed - 1) / maxFixed }

func (r *Region) iovecs() []uring.Iovec {
	var v []uring.Iovec
	for off := 0; off < len(r.mem); off += maxFixed {
		n := min(maxFixed, len(r.mem)-off)
		v = append(v, uring.Iovec{Base: uint64(r.base) + uint64(off), Len: uint64(n)})
	}
	return v
}

// Register installs the region in ring's fixed-buffer table (created sparse, e.g. with
// RegisterBuffersSparse) at slots slot..slot+Slots()-1. The kernel pins the pages once, counted
// against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK.
func (r *Region) Register(ring *uring.Ring, slot uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if _, ok := r.regs[ring]; ok {
		return fmt.Errorf("memreg: region already registered with this ring: %w", ErrBusy)
	}
	if _, err := ring.UpdateBuffers(slot, r.iovecs(), nil); err != nil {
		if errors.Is(err, unix.ENOMEM) {
			return NewMemlockError(len(r.mem), err)
		}
		return fmt.Errorf("memreg: register %d bytes at fixed slot %d: %w", len(r.mem), slot, err)
	}
	r.regs[ring] = slot
	return nil
}

// Unregister removes the region from ring's fixed-buffer table. Sends already submitted keep
// the pages pinned until they complete.
func (r *Region) Unregister(ring *uring.Ring) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	slot, ok := r.regs[ring]
	if !ok {
		return fmt.Errorf("memreg: region not registered with this ring: %w", unix.ENOENT)
	}
	empty := make([]uring.Iovec, r.Slots())
	if _, err := ring.UpdateBuffers(slot, empty, nil); err != nil {
		return fmt.Errorf("memreg: unregister: %w", err)
	}
	delete(r.regs, ring)
	return nil
}

// Forget drops the registration record for a ring that was closed (the kernel already released
// the pages).
func (r *Region) Forget(ring *uring.Ring) {
	r.mu.Lock()
	delete(r.regs, ring)
	r.mu.Unlock()
}

// FixedIndex returns the fixed-buffer slot that holds [addr, addr+n) in ring's table, or false
// when the region is not registered there or the range crosses a slot boundary.
func (r *Region) FixedIndex(ring *uring.Ring, addr uintptr, n int) (uint16, bool) {
	r.mu.Lock()
	slot, ok := r.regs[ring]
	r.mu.Unlock()
	if !ok || !r.Contains(addr, n) {
		return 0, false
	}
	off := addr - r.base
	first, last := off/maxFixed, (off+uintptr(max(n, 1))-1)/maxFixed
	if first != last {
		return 0, false
	}
	return uint16(slot + uint32(first)), true
}

// MemlockError says that registering memory failed for lack of locked-memory allowance.
type MemlockError struct {
	Need      int    // bytes the registration needed
	Limit     uint64 // soft RLIMIT_MEMLOCK in bytes
	HardLimit uint64
	Err       error
}

// NewMemlockError describes a registration (of need bytes; 0 when unknown) refused by err for
// lack of locked memory, with the current limits.
func NewMemlockError(need int, err error) *MemlockError {
	var rl unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl)
	return &MemlockError{Need: need, Limit: rl.Cur, HardLimit: rl.Max, Err: err}
}

func (e *MemlockError) Error() string {
	what := "register " + human(uint64(e.Need))
	if e.Need == 0 {
		what = "lock memory"
	}
	return fmt.Sprintf("memreg: %s: %v (RLIMIT_MEMLOCK is %s, hard limit %s; raise it with ulimit -l, LimitMEMLOCK= in a systemd unit, or memreg.RaiseMemlock)",
		what, e.Err, human(e.Limit), human(e.HardLimit))
}

func (e *MemlockError) Unwrap() error { return e.Err }

func human(n uint64) string {
	switch {
	case n == unix.RLIM_INFINITY:
		return "unlimited"
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// RaiseMemlock raises the soft RLIMIT_MEMLOCK to at least bytes, up to the hard limit (and the
// hard limit too where the process may: root or CAP_SYS_RESOURCE). It returns the new soft
// limit; an error when it could not reach bytes.
func RaiseMemlock(bytes uint64) (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return 0, fmt.Errorf("memreg: getrlimit: %w", err)
	}
	if rl.Cur >= bytes {
		return rl.Cur, nil
	}
	if rl.Max < bytes {
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: bytes, Max: bytes}); err == nil {
			return bytes, nil
		}
		rl.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
			return 0, fmt.Errorf("memreg: setrlimit: %w", err)
		}
		return rl.Cur, fmt.Errorf("memreg: RLIMIT_MEMLOCK raised only to the hard limit %s, %s wanted: %w", human(rl.Max), human(bytes), unix.EPERM)
	}
	rl.Cur = bytes
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return 0, fmt.Errorf("memreg: setrlimit: %w", err)
	}
	return bytes, nil
}
