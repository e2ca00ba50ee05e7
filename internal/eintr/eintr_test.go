package eintr

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestRetry(t *testing.T) {
	calls := 0
	err := Retry(func() error {
		calls++
		if calls < 3 {
			return unix.EINTR
		}
		return unix.EAGAIN
	})
	if calls != 3 || err != unix.EAGAIN {
		t.Fatalf("Retry: %d calls, %v", calls, err)
	}
	// A wrapped EINTR is an EINTR too (os.SyscallError from os and net).
	calls = 0
	n, err := Retry1(func() (int, error) {
		calls++
		if calls == 1 {
			return -1, os.NewSyscallError("read", unix.EINTR)
		}
		return 7, nil
	})
	if calls != 2 || n != 7 || err != nil {
		t.Fatalf("Retry1: %d calls, %d, %v", calls, n, err)
	}
	calls = 0
	if e := Errno(func() unix.Errno {
		calls++
		if calls < 4 {
			return unix.EINTR
		}
		return 0
	}); e != 0 || calls != 4 {
		t.Fatalf("Errno: %d calls, %v", calls, e)
	}
	other := fmt.Errorf("x: %w", unix.EBADF)
	if err := Retry(func() error { return other }); !errors.Is(err, unix.EBADF) {
		t.Fatalf("Retry changed the error: %v", err)
	}
}

// TestPollAfterSignal: a poll interrupted by signals neither returns early with EINTR nor
// starts its whole timeout again: SIGURG (the runtime's preemption signal, which Go lets
// through) is sent to the process while Poll waits on a pipe nobody writes.
func TestPollAfterSignal(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			unix.Kill(os.Getpid(), unix.SIGURG)
			time.Sleep(time.Millisecond)
		}
	}()
	fds := []unix.PollFd{{Fd: int32(p[0]), Events: unix.POLLIN}}
	n, err := Poll(fds, 50*time.Millisecond)
	close(stop)
	<-done
	if n != 0 || err != nil {
		t.Fatalf("Poll on an idle pipe: %d, %v (want 0, nil: the time ran out)", n, err)
	}
	// Ready at once: the count, with no wait.
	unix.Write(p[1], []byte{1})
	if n, err := Poll(fds, time.Hour); n != 1 || err != nil {
		t.Fatalf("Poll on a readable pipe: %d, %v", n, err)
	}
	if n, err := Poll(fds, -1); n != 1 || err != nil {
		t.Fatalf("Poll without a bound on a readable pipe: %d, %v", n, err)
	}
}

func TestPollMs(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{{0, 0}, {1, 1}, {time.Millisecond, 1}, {time.Millisecond + 1, 2}, {1 << 62, 1 << 30}} {
		if got := pollMs(c.d); got != c.want {
			t.Errorf("pollMs(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}
