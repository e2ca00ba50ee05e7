// Package zc is zcnet's public API: an Engine of queues that moves TCP bytes with io_uring,
// zero-copy where the kernel can, with the kernel's own TCP stack underneath.
//
// # Two faces
//
// The event-loop face is for full speed. Listen and Dial take a Handler whose methods run on
// the connection's queue goroutine (they must not block). Received data arrives as Data:
// borrowed buffers from a registered region, valid until Release. Sends take memreg buffers
// (Conn.Buffer, then Conn.Send): ownership passes to the library until the kernel is done
// with them; for a zero-copy send that is its notification, not its completion, and the
// handle you passed is stale from the moment Send returns, so the memory cannot be written
// while the kernel may still read it. Many sends and receives go into one io_uring_enter.
//
// The net.Conn face (Engine.NetListen, Engine.NetDial) wraps the same connections in
// net.Conn / net.Listener, copying where that interface demands it, with deadlines and
// *net.OpError errors.
//
// # Send paths
//
// Each send picks SEND_ZC (from the queue's fixed buffers) or a copying SEND. With
// SendAdaptive (the default), sends of at least ZCThreshold bytes start as zero-copy; when the
// kernel reports that it copied them anyway (IORING_NOTIF_USAGE_ZC_COPIED: always the case on
// loopback and veth), the connection switches to copying sends and probes zero-copy again with
// exponential backoff. SendCopy and SendZeroCopy force a path. Counters (Stats, Conn.Stats)
// say how many bytes went which way and why.
//
// # Fallbacks
//
// When io_uring cannot be set up (disabled by sysctl, blocked by seccomp, locked-memory limit),
// New falls back to a plain-socket backend with the same API (blocking syscalls, a goroutine
// pair per connection) and says so in Capabilities and Stats.Fallback; with
// Config.NoFallback it returns the error instead. Every fallback is visible; none is silent.
//
// # Errors
//
// Errors returned by Dial/Listen/Send are *OpError values (Op, Net, Addr, Err) that unwrap
// to the cause: net.ErrClosed after Close, ErrNotSupported for a path this kernel cannot do,
// memreg errors for buffer misuse (memreg.ErrStale), syscall errnos. io.EOF stays bare.
package zc
