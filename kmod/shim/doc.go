// Package shim is the user-space client of /dev/zcshim, zcnet's
// kernel-queue shim (see package kmod and kmod/uapi/zcshim.h): the same
// queue model as io_uring for hosts where io_uring is disabled.
//
// Lifecycle:
//
//	q, err := shim.Open(shim.Config{Entries: 256})   // ErrNotSupported if the module is absent
//	mem, _ := shim.Mmap(1 << 20)                     // region memory: never Go heap
//	key, _ := q.RegisterBytes(mem, 0)                 // pinned once, charged to RLIMIT_MEMLOCK
//	id, _ := q.Attach(tcpFd)                          // a connected plain TCP socket
//	q.PrepSend(id, key, 0, 4096, 1)                   // zero-copy send
//	q.PrepRecv(id, key, 8192, 4096, 2)                // receive into the region
//	q.Submit(-1, 1, time.Second)                      // one ioctl per batch
//	n := q.Completions(buf)                           // Res, UserData, More/Notif/Copied
//	q.Detach(id); q.Unregister(key); q.Close()
//
// Send contract (io_uring SEND_ZC's): a SEND posts a completion with More()
// set (Res = bytes queued or -errno), then a notification with Notif() set
// when the TCP stack has released the pages; Copied() on the notification
// says the stack copied the data instead (always the case on loopback).
// The buffer must not be written between PrepSend and the notification.
// A completion without More() has no notification (e.g. a SEND rejected by
// validation).
//
// A Queue belongs to one goroutine (the hwq model: one queue per locked OS
// thread); its methods are not safe for concurrent use. Fd() is readable
// (POLLIN) while completions are ready: an event loop that must also wake
// on an eventfd polls both fds, then calls Submit(-1, 0, 0) to hand over
// prepared entries and Completions to reap, instead of blocking in
// Submit(n, waitFor, timeout).
//
// Completion space: the kernel reserves one CQ slot per NOP/RECV and two
// per SEND at submission; Submit returns ErrCQFull when nothing fits. Size
// the CQ (default 2*Entries) for the notifications that can be
// outstanding, and reap before resubmitting. A RECV that waits for data
// keeps its slot reserved until it completes or its socket is detached.
//
// Errors are *OpError wrapping an *os.SyscallError (errno) or a sentinel:
// ErrNotSupported (no /dev/zcshim: the only conclusive "cannot"),
// ErrSQFull, ErrCQFull, ErrClosed, and os.ErrDeadlineExceeded from Submit.
// Per-operation errors arrive in Completion.Res (Completion.Err()).
package shim
