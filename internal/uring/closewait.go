package uring

import (
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/eintr"
)

// CloseWait is Close, and then waits, at most timeout, until the kernel has freed the ring.
//
// Closing a ring's descriptor does not free the ring: the kernel cancels what is in flight
// and frees the ring's memory (the submission and completion rings, provided-buffer rings,
// whatever is still registered) later, in a workqueue, and until then that memory still
// counts against the user's RLIMIT_MEMLOCK. A process that closes a ring and makes another
// at once under a tight limit is refused (ENOMEM) for memory it no longer uses. The work
// that frees the ring drops its registered files first and the ring memory right after, in
// one go; so before closing, CloseWait registers a pipe's write end as the ring's only
// registered file and closes its own copy: the pipe's read end then sees its hang-up when
// that work ran, and that is what CloseWait waits for (in poll(2): a real waker, with
// timeout as the bound). The kernel puts files released by a kernel worker a tick later,
// after the ring memory is gone.
//
// Call it on the ring's submitter (SINGLE_ISSUER rings refuse registration elsewhere),
// with no registered-file table in use. It reports whether the teardown was seen; false
// when timeout passed first or no sentinel could be made (out of descriptors, a table
// already in place): the ring is closed either way.
func (r *Ring) CloseWait(timeout time.Duration) (bool, error) {
	if r == nil || r.closed {
		return false, os.ErrClosed
	}
	// A ring fd registered with this thread (RegisterRingFd) holds the ring open until the
	// thread exits: drop it first.
	r.UnregisterRingFd()
	var p [2]int
	sentinel := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK) == nil
	if sentinel {
		fds := []int32{int32(p[1])}
		escape(fds)
		reg := rsrcRegister{Nr: 1, Data: uint64(uintptr(unsafe.Pointer(&fds[0])))}
		_, err := register(r.fd, RegisterFiles2, unsafe.Pointer(&reg), uint32(unsafe.Sizeof(reg)))
		runtime.KeepAlive(fds)
		unix.Close(p[1]) // the ring's copy is the last one now
		if err != nil {
			unix.Close(p[0])
			sentinel = false
		}
	}
	err := r.Close()
	if !sentinel {
		return false, err
	}
	defer unix.Close(p[0])
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false, err
		}
		pfd := []unix.PollFd{{Fd: int32(p[0]), Events: unix.POLLIN}}
		n, perr := eintr.Poll(pfd, left)
		if perr != nil || n == 0 {
			return false, err
		}
		if pfd[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0 {
			return true, err
		}
	}
}
