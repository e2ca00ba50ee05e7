// Package uring is zcnet's own binding of the Linux io_uring ABI: ring setup and mmap, SQE
// preparation, CQE decoding, registration (buffers, files, provided-buffer rings, eventfd, ring
// fd) and the opcode probe. It is the only place in zcnet that issues io_uring syscalls.
//
// # Lifecycle
//
// A Ring is created by New and released by Close. A Ring is not safe for concurrent use: one
// goroutine (in zcnet, the queue's goroutine locked to an OS thread) prepares SQEs, submits and
// reaps completions. Close unmaps the rings and closes the fd; the kernel cancels whatever is
// still in flight and drops its references to registered memory.
//
// # Memory the kernel touches asynchronously
//
// The SQ/CQ rings are the kernel's own mapping. Buffers named by address in an SQE (send and
// receive buffers, provided-buffer rings, accept's sockaddr) must stay valid and must not move
// until the kernel is done with them: zcnet uses mmap'd memory (package memreg) for those, never
// the Go heap. Arguments the kernel reads only while the SQE is being submitted (a timeout's
// timespec, connect's sockaddr) may live on the Go heap; the Ring keeps them reachable until the
// SQE has been consumed (see Ring.Keep).
//
// # Errors
//
// Syscall failures are returned as *os.SyscallError wrapping the errno, so errors.Is(err,
// unix.EINVAL) works. ErrNotSupported (matched with errors.Is) means this kernel or this process
// cannot do what was asked: io_uring is disabled or blocked, an opcode or setup flag is absent.
// Only nil and ErrNotSupported are conclusive answers of a probe.
package uring
