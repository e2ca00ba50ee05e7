// Package memreg owns the memory zcnet hands to the kernel: regions of mmap'd anonymous memory
// (never Go heap), split into fixed-size buffers, and the lifetime of every buffer. Regions are
// registered once with the kernel by their owner (the engine's io_uring driver keeps the
// fixed-buffer table, the zcshim client the module's region table), which tell the region
// while a kernel table refers to it, so it is never unmapped under the kernel. memreg itself
// knows no ring. What only the module's own packages call on a region (the provided-buffer
// rings' side, the kernel tables' holds, pool-wide buffer ids) is not here: it lives in the
// module's internal/memregops.
//
// # Ownership
//
// Every buffer is in exactly one state:
//
//	Free    in the region's free list
//	Held    handed to the application (Region.Get, or a received buffer it borrowed)
//	Kernel  lent to the kernel: a send in flight, or a receive buffer in a provided-buffer ring
//	Shared  several owners at once (Buf.Share, shared.go): application handles and Refs, and
//	        loans of sends in flight; it goes back when the last of them lets go
//
// A Buf is a handle: region, index and a generation. The generation changes every time the
// buffer leaves the application's hands, so a handle kept after Release, or after the buffer was
// lent to the kernel, is stale: its Bytes returns nil and every operation returns ErrStale.
// A buffer lent for a zero-copy send comes back (Region.Return) only when the kernel's
// notification arrived, not when the send completed; only then can Get hand it out again.
//
// # Errors
//
// ErrStale, ErrExhausted, ErrBusy and ErrNotSupported are matched with errors.Is. A
// registration refused for lack of locked memory returns *MemlockError, which names the
// current RLIMIT_MEMLOCK and how to raise it (RaiseMemlock).
package memreg
