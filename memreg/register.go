package memreg

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// holdForKernel records that a kernel table (an io_uring fixed-buffer table, the zcshim
// module's region table) refers to the region's memory: Close refuses with ErrBusy and the
// memory stays mapped until the matching releaseFromKernel. It fails with ErrClosed after
// Close. The table itself belongs to its owner (internal/loop keeps the io_uring one).
func (r *Region) holdForKernel() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	r.kernRefs++
	return nil
}

// releaseFromKernel undoes one holdForKernel (the table no longer refers to the memory).
func (r *Region) releaseFromKernel() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kernRefs > 0 {
		r.kernRefs--
	}
	r.unmapIfDoneLocked()
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
