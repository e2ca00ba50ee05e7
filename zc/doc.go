// Package zc is zcnet's public API: an Engine of queues that moves TCP bytes with io_uring,
// zero-copy where the kernel can, with the kernel's own TCP stack underneath.
//
// # Two faces
//
// The event-loop face is for full speed. Listen and Dial take a Handler whose methods run on
// the connection's queue goroutine, one at a time, on every backend. Received data arrives as
// Data: borrowed buffers from the queue's receive pool, valid until Release. Sends take
// memreg buffers (Conn.Buffer, then Conn.Send), or forward received Data as is
// (Conn.SendData): ownership passes to the engine until the kernel is done with the memory —
// for a zero-copy send that is its notification, not its completion — and the handle you
// passed is stale from the moment Send returns, so the memory cannot be written while the
// kernel may still read it. Every buffer queued on a connection leaves in one kernel send
// (SENDMSG with an iovec) while no send is in flight, so small sends cost what big ones cost.
//
// The net.Conn face (package zc/netconn: netconn.Listen, netconn.Dial) wraps the same
// connections in net.Conn / net.Listener, copying where that interface demands it, with
// deadlines and *net.OpError errors. Its Read does what Go's net does: read(2) into the
// caller's slice on the reading goroutine, waiting in Go's poller (one copy; the queue is
// not involved), and its Write writes directly while nothing is queued; queued sends,
// sendfile and splice (io.ReaderFrom) and closing go through the queue. It is built on this
// package's API only: a connection opened with ReadSelf (ListenOptions, DialOptions) is read
// by the application with Conn.Read, and one opened Exclusive keeps its first handler as its
// only reader.
//
// # The package map
//
// This package holds the Engine, Listener, Conn and Data, and what needs the connection
// core: shared sends (Shared), FanOut, Relay, SendFile, timers. Layers built on its public
// API live in their own packages: zc/netconn (the net.Conn face), zc/framed (a no-copy
// Reader of framed protocols over received Data), zc/ztls (TLS with the kernel's records),
// zc/caps (what this machine can do for zcnet: the report zcprobe prints).
//
// # Handlers must not block
//
// A handler runs on a queue goroutine; a call that would wait for a queue goroutine returns
// ErrWouldBlock there instead of deadlocking: Dial (use DialAsync), BufferWait (use Buffer),
// Write over MaxQueuedBytes (send from OnWritable), a netconn Read with nothing to read.
// Engine.Close and Listener.Close called from a handler return at once and finish in the
// background (Engine.Done, Listener.Done). A panic in a handler closes only its connection,
// with a *PanicError. Conn.AfterFunc schedules work on the connection's queue goroutine (an
// idle timeout, a deadline) without a goroutine; off the queues, Conn.WriteContext is Write
// bounded by a context.
//
// # Every wait has a waker
//
// A call on a queue goroutine that refuses a connection for want of a resource promises an
// event when the resource is back, whoever gives it back:
//
//   - Buffer's memreg.ErrExhausted, and Write's or BufferWait's ErrWouldBlock when the queue's
//     send pool is empty: the connection joins the pool's waiters (goroutines blocked in
//     Write or BufferWait, and refused connections, served in arrival order); the next
//     buffer that returns is granted to the oldest of them, and a connection is told with
//     OnWritable (its next Buffer or Write takes the grant; a grant not taken goes to the
//     next waiter). Stats.Send.PoolWaits counts the refusals.
//   - Write's ErrWouldBlock at MaxQueuedBytes: OnWritable once less than half is queued.
//   - SendData over the destination's MaxQueuedBytes: the source stops receiving and
//     resumes when the destination drained to half of it.
//   - Receive credit (MaxRecvHeld): receiving resumes when Data is released (every
//     reference of a retained Data: the last one).
//   - FanOut.Publish's ErrWouldBlock (FanOutPause): OnReady once every subscriber drained
//     to half its bound, left, or the FanOut closed.
//
// OnClose ends every promise. A handler that does not implement Writable hears nothing but
// OnClose: a sender must implement it. The send pool's growth refused by RLIMIT_MEMLOCK is
// a cap like SendPoolMax: senders wait, they do not fail (Config.OnLimit, Stats.Memory.MemlockCaps).
//
// Config.Debug turns on checks for the misuses that cannot be made impossible: a buffer
// written after Send or after Release, a handler that blocks, Data never released.
//
// # Flow control
//
// A connection holds at most Config.MaxRecvHeld bytes of receive buffers (Data not yet
// released, or forwarded by SendData and not yet sent); at the bound it stops receiving until
// some is released; with many connections the bound shrinks to each one's share of half the
// queue's receive pool, so together they never hold all of it. SendData counts
// toward the destination's MaxQueuedBytes; above it the source connection stops receiving
// until the destination drains to half of it (OnWritable runs there then). A relay written
// with SendData both ways therefore needs no flow-control code and cannot deadlock; Relay
// is that relay, with each side's end of stream passed on to the other, where it cannot
// splice. Where it can (io_uring and plain backends, no RecvZcrx) Relay moves the bytes
// socket → pipe → socket with splice(2) instead, never through user memory: the pipe is the
// flow control (RelayOptions.Path demands a path; RelayStats says which one each byte took).
//
// # Shared sends and fan-out
//
// One buffer can go to many connections without a copy: NewShared makes a send buffer a
// Shared, whose Send queues the same memory on one more connection; Data.Retain makes a
// second reference to received bytes, each released or passed to SendData on its own.
// memreg counts the owners (memreg.Ref); the buffer returns to its pool, and a received
// buffer's receive credit to its connection, when the last send is done (after its
// zero-copy notification) and the last reference is released. FanOut builds a pub/sub
// fan-out on it: one message, every subscriber, each bounded (FanOutOptions.MaxQueued) with
// the policy the caller picks for a slow one (pause the publisher, drop, close). Stats
// (SharedSends, BytesShared, BytesDataCopied) say which bytes were shared and which copied.
//
// # Memory
//
// Each queue has a send pool (registered with the kernel, so pinned and counted against
// RLIMIT_MEMLOCK) and a receive pool. Both start small (by default 512 KiB each per queue)
// and grow, doubling, with demand up to their caps (Config.SendPoolMax, RecvPoolMax); Stats
// reports their sizes. Memory the application still holds when the engine closes (a Buf, a
// Data) stays mapped until it is released: Close never unmaps memory under the application.
//
// # Queues and Go's scheduler
//
// A queue waits for the kernel in io_uring_enter (epoll_wait on the plain backend) on its
// own locked thread, and Go counts that as a system call that holds one of its GOMAXPROCS
// Ps. While another P is idle the runtime leaves it so; when none is (GOMAXPROCS no larger
// than the number of waiting queues, as in a process confined to one CPU with one queue),
// its monitor (sysmon) takes the P back from every wait that outlasts one of its 20 µs
// ticks, and keeps waking at that rate while it finds such waits: CPU and latency at low
// message rates (measured: doc/notes/issue-18-core-v3.md, "Session 9"). Give such
// processes a GOMAXPROCS above Config.Queues (Config.AddProcs does it for the engine's
// lifetime), or let the queues spin (Config.BusyPoll).
//
// A handler that hands work to a goroutine of its own wakes it with Conn.Wake, not a bare
// channel send: the queue then lets that goroutine run before it next waits in the kernel,
// instead of leaving it to sysmon (up to 10 ms later). Code that may run on a queue
// goroutine asks Conn.OnQueue before it waits.
//
// # Backends and fallbacks
//
// Every backend has the same queues, handlers, flow control and close semantics; only the
// way bytes reach the kernel differs: io_uring (the default), the zcshim kernel module
// (/dev/zcshim) where io_uring is blocked, and plain non-blocking sockets with epoll. When
// io_uring cannot be set up (disabled by sysctl, blocked by seccomp, locked-memory limit),
// New falls back to the shim (if its module is loaded) and then to plain sockets, and says so
// in Stats.Fallback and Config.OnFallback; with Config.NoFallback, or a specific Backend, it
// returns the error instead. The capability probe runs again at every New, so a process
// follows io_uring being enabled or disabled.
//
// # Send paths
//
// With SendAdaptive (the default), sends of at least ZCThreshold bytes start as zero-copy;
// when the kernel reports that it copied them anyway (IORING_NOTIF_USAGE_ZC_COPIED: always
// the case on loopback and veth), the connection switches to copying sends and probes
// zero-copy again with exponential backoff. SendCopy and SendZeroCopy force a path. Counters
// (Stats, Conn.Stats) say how many bytes went which way and why. Conn.SendFile queues a
// file range in order with the other sends; it leaves with sendfile(2) from the page cache
// (Stats.Send.BytesFile).
//
// # TLS
//
// ListenOptions.TLS and DialOptions.TLS (a *tls.Config in TLSOptions) make TLS
// connections: crypto/tls runs the handshake before the connection joins its queue, then
// the kernel carries the records (kernel TLS), so handlers receive decrypted Data and every
// send path (Write, Send, SendData, SendFile's sendfile, FanOut's shared sends) is encrypted
// by the kernel, with copying sends (kernel TLS refuses SEND_ZC). The queue reads the
// non-data records itself: a close_notify is the EOF, an alert a *tcpglue.TLSAlertError (a
// refused TLS 1.2 renegotiation tcpglue.ErrTLSRenegotiation), a TLS 1.3
// KeyUpdate gives the kernel the next keys (Linux 6.14), session tickets are dropped; Close
// and CloseWrite send close_notify. Where the kernel has no TLS the connection runs
// crypto/tls in user space instead, visibly (ConnStats.TLS, Stats.TLS) and only if allowed
// (TLSOptions.NoFallback turns it into a *NotSupportedError). The net.Conn face's TLS is
// package zc/ztls.
//
// # Lifetimes
//
// A connection's descriptor is owned by a reference-counted socket: Conn.Socket and
// CloseWrite never act on a descriptor number that was closed and reused. Close is
// asynchronous and idempotent (OnClose and Done tell when it finished); after it every
// operation returns an error matching ErrClosed. A graceful close lets queued sends go out
// while the peer takes them or answers, however slowly it reads; once the peer is silent
// for CloseTimeout (the kernel's probes and retransmissions unanswered; Engine.Close:
// CloseTimeout from its start) it resets the connection and reports it: OnClose gets an
// error matching ErrCloseTimeout (a *CloseTimeoutError says how many bytes the peer did
// not get) instead of nil. Zero-copy
// notifications still outstanding get another CloseTimeout (their buffers stay lent until
// they arrive).
// TCP keep-alive is on by default (15 s, as Go's net).
//
// # Errors
//
// Errors are *OpError values (Op, Net, Addr, Err) that unwrap to the cause: ErrClosed after
// Close (and for sends after CloseWrite); after a connection failed, its failure (a peer's
// reset: sends return an error matching syscall.ECONNRESET or EPIPE, as net's do);
// ErrNotSupported for what this kernel cannot do (the one sentinel every zcnet package
// shares), ErrInvalid and *ConfigError for bad arguments, ErrWouldBlock, ErrEmpty,
// ErrTooLarge, ErrForeignBuffer, memreg errors for buffer misuse (memreg.ErrStale,
// memreg.ErrExhausted, *memreg.MemlockError), syscall errnos. io.EOF stays bare.
package zc
