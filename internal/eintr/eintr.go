// Package eintr retries system calls that a signal interrupted (EINTR), in one place for the
// module. The Go runtime's preemption signal interrupts blocking calls under load, so every
// call that can block and is safe to repeat goes through here.
//
// What is not retried, and why, stays with the caller: close(2) (the descriptor is gone
// either way), an io_uring_enter that submitted (the caller re-checks what was taken), a
// blocking connect(2) (the handshake goes on: wait for it), and the event loops' waits (an
// interrupted wait is a wake-up: the loop goes around).
package eintr

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// Retry calls f until it returns anything but an error matching EINTR.
func Retry(f func() error) error {
	for {
		if err := f(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// Retry1 is Retry for a call that also returns a value (a count, a descriptor).
func Retry1[T any](f func() (T, error)) (T, error) {
	for {
		v, err := f()
		if !errors.Is(err, unix.EINTR) {
			return v, err
		}
	}
}

// Errno is Retry for a raw system call (unix.Syscall's errno, 0 for success). f makes the
// call itself, so the pointer arguments converted to uintptr in the call stay alive.
func Errno(f func() unix.Errno) unix.Errno {
	for {
		if e := f(); e != unix.EINTR {
			return e
		}
	}
}

// Poll is poll(2) that waits at most timeout (negative: without a bound) in all: after
// EINTR it polls again for what is left, rounded up to a millisecond. It returns the number
// of descriptors with events, 0 when the time ran out.
func Poll(fds []unix.PollFd, timeout time.Duration) (int, error) {
	if timeout < 0 {
		return Retry1(func() (int, error) { return unix.Poll(fds, -1) })
	}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left < 0 {
			left = 0
		}
		n, err := unix.Poll(fds, pollMs(left))
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
		if left == 0 {
			return 0, nil
		}
	}
}

// pollMs is d in whole milliseconds, rounded up, within poll(2)'s int.
func pollMs(d time.Duration) int {
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return int(min(ms, 1<<30))
}
