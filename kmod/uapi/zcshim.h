/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * zcshim.h - user ABI of the zcnet kernel-queue shim (/dev/zcshim).
 *
 * This header is the single source of truth for the ABI: the kernel module
 * (kmod/zcshim.c) includes it, and the Go structs in
 * kmod/internal/abi/zabi_linux.go are generated from it with
 * `go tool cgo -godefs` (see kmod/internal/abi/gen.go); a Go test compiles
 * this header with gcc and compares every size and offset.
 *
 * OVERVIEW
 *   open("/dev/zcshim", O_RDWR|O_CLOEXEC) gives a private context. Queues,
 *   memory regions and attached sockets belong to that open file alone.
 *
 *   1. ZCSHIM_IOC_SETUP creates the submission (SQ) and completion (CQ)
 *      rings; mmap(NULL, ring_size, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0)
 *      maps them. Offsets inside the mapping are returned by SETUP.
 *   2. ZCSHIM_IOC_REGISTER pins a user memory range once (long-term pin,
 *      charged to RLIMIT_MEMLOCK unless CAP_IPC_LOCK) and names it by a key.
 *   3. ZCSHIM_IOC_ATTACH attaches a connected TCP socket (by fd) and names it
 *      by a socket id.
 *   4. The application writes struct zcshim_sqe entries at
 *      sqes[sq_tail & sq_mask], publishes sq_tail (store-release), and rings
 *      the doorbell with ZCSHIM_IOC_ENTER, which consumes up to to_submit
 *      entries and optionally waits for completions.
 *   5. Completions are struct zcshim_cqe at cqes[cq_head & cq_mask] while
 *      cq_head != cq_tail (load-acquire cq_tail); the application advances
 *      cq_head (store-release) after reading.
 *
 * RING INDEXES
 *   All four indexes are free-running __u32 counters; the slot is
 *   index & mask. The kernel writes sq_head and cq_tail, the application
 *   writes sq_tail and cq_head. The kernel never trusts the application's
 *   values: an sq_tail more than sq_entries ahead of sq_head makes ENTER
 *   fail with EINVAL, every entry is copied before it is validated, and a
 *   cq_head that claims more than cq_entries are free is treated as
 *   "CQ full".
 *
 * COMPLETION SPACE
 *   An operation is accepted only if its completions are guaranteed to fit:
 *   NOP and RECV reserve one CQE, SEND reserves two (completion +
 *   notification). ENTER stops consuming SQEs when the CQ (free slots minus
 *   reservations) cannot hold the next entry's CQEs, and returns the number
 *   consumed so far (or -EBUSY if none). The CQ therefore never overflows.
 *
 * OPERATIONS (struct zcshim_sqe.opcode)
 *   ZCSHIM_OP_NOP   completes at once with res = 0.
 *   ZCSHIM_OP_SEND  zero-copy send of region[off, off+len) on socket `sock`.
 *                   The pinned pages are attached to TCP skbs as fragments;
 *                   nothing is copied by the shim. Two CQEs are posted with
 *                   the same user_data:
 *                     - the completion: res = bytes accepted by TCP (== len
 *                       unless an error cut it short; then the bytes sent so
 *                       far, or -errno if none), flags has ZCSHIM_CQE_F_MORE;
 *                     - the notification: res = 0, flags has
 *                       ZCSHIM_CQE_F_NOTIF, and ZCSHIM_CQE_F_COPIED if the
 *                       stack had to copy the payload (e.g. loopback
 *                       delivery) or did not take it zero-copy at all.
 *                   The memory must not be modified until the notification
 *                   arrives. A SEND that failed after it was accepted
 *                   still posts its notification; one rejected by
 *                   validation (PER-ENTRY ERRORS) posts only its
 *                   completion, without ZCSHIM_CQE_F_MORE.
 *   ZCSHIM_OP_RECV  copies received data into region[off, off+len).
 *                   res = bytes received (> 0), 0 at end of stream, or
 *                   -errno. At most ZCSHIM_RECV_MAX bytes per operation.
 *   Operations on one socket run in submission order; SEND retries
 *   internally until all len bytes are queued. Operations that cannot make
 *   progress wait (in the kernel, asynchronously) for the socket to become
 *   writable/readable; ENTER itself never blocks on a socket.
 *
 * PER-ENTRY ERRORS (cqe.res, the entry is consumed)
 *   -EINVAL     unknown opcode, non-zero reserved field or flag, len == 0,
 *               len too large, or [off, off+len) outside the region.
 *   -ENOENT     region key not registered in this file.
 *   -EBADF      socket id not attached in this file.
 *   -EACCES     RECV into a region registered ZCSHIM_REG_READONLY.
 *   -ECANCELED  the socket was detached or the file closed first.
 *   -ENOMEM     no kernel memory for the operation.
 *   other       errors from the TCP stack (-EPIPE, -ECONNRESET, ...).
 *
 * LIFETIME
 *   Unregistering a region or detaching a socket never waits: a region's
 *   pages stay pinned until the last notification of a SEND using them;
 *   detaching cancels queued operations (-ECANCELED). close() and process
 *   death do the same for everything; nothing the TCP stack still
 *   references is freed, and the module stays referenced until then.
 */
#ifndef _UAPI_ZCSHIM_H
#define _UAPI_ZCSHIM_H

#include <linux/types.h>
#include <linux/ioctl.h>

#define ZCSHIM_ABI_VERSION 1
#define ZCSHIM_DEVICE_NAME "zcshim"

/* Limits (also enforced by the module). */
#define ZCSHIM_MAX_ENTRIES     4096        /* sq_entries, cq_entries <= this (powers of two) */
#define ZCSHIM_MAX_REGIONS     1024        /* regions per open file */
#define ZCSHIM_MAX_REGION_LEN  (1ULL << 30) /* bytes per region */
#define ZCSHIM_MAX_SOCKS       1024        /* attached sockets per open file */
#define ZCSHIM_RECV_MAX        (256U << 10) /* bytes per RECV operation */

/* Operation codes (zcshim_sqe.opcode). */
#define ZCSHIM_OP_NOP  0
#define ZCSHIM_OP_SEND 1
#define ZCSHIM_OP_RECV 2
#define ZCSHIM_OP_LAST 3 /* first invalid opcode */

/* zcshim_cqe.flags */
#define ZCSHIM_CQE_F_MORE   (1U << 0) /* a notification CQE will follow (SEND) */
#define ZCSHIM_CQE_F_NOTIF  (1U << 1) /* this is a notification: pages released */
#define ZCSHIM_CQE_F_COPIED (1U << 2) /* notification: the stack copied (some of) the data */

/* zcshim_region.flags */
/*
 * ZCSHIM_REG_READONLY: RECV into the region fails -EACCES, and the range may
 * be mapped without PROT_WRITE. Writable mappings are still pinned for
 * write (so that later writes by the application land in the pinned pages,
 * not in a copy-on-write replacement); only non-writable mappings get a
 * read-only pin.
 */
#define ZCSHIM_REG_READONLY (1U << 0)

/* zcshim_enter.flags */
#define ZCSHIM_ENTER_GETEVENTS (1U << 0) /* wait until min_complete CQEs are ready */

/*
 * struct zcshim_sqe - one submission entry, 64 bytes.
 * @opcode:    ZCSHIM_OP_*.
 * @flags:     must be 0.
 * @resv0:     must be 0.
 * @sock:      socket id from ZCSHIM_IOC_ATTACH (SEND, RECV; 0 for NOP).
 * @region:    region key from ZCSHIM_IOC_REGISTER (SEND, RECV; 0 for NOP).
 * @len:       bytes (SEND, RECV: 1..region length; 0 for NOP).
 * @off:       byte offset into the region (0 for NOP).
 * @user_data: copied into every CQE of this entry.
 * @op_flags:  must be 0.
 * @resv1:     must be 0.
 * @resv2:     must be 0.
 */
struct zcshim_sqe {
	__u8  opcode;
	__u8  flags;
	__u16 resv0;
	__u32 sock;
	__u32 region;
	__u32 len;
	__u64 off;
	__u64 user_data;
	__u32 op_flags;
	__u32 resv1;
	__u64 resv2[3];
};

/*
 * struct zcshim_cqe - one completion entry, 16 bytes.
 * @user_data: from the SQE.
 * @res:       result, >= 0 on success, -errno on failure (see above).
 * @flags:     ZCSHIM_CQE_F_*.
 */
struct zcshim_cqe {
	__u64 user_data;
	__s32 res;
	__u32 flags;
};

/*
 * struct zcshim_setup - ZCSHIM_IOC_SETUP argument.
 * @sq_entries:  in: power of two, 1..ZCSHIM_MAX_ENTRIES.
 * @cq_entries:  in: power of two >= 2*sq_entries, <= ZCSHIM_MAX_ENTRIES,
 *               or 0 for 2*sq_entries (capped at ZCSHIM_MAX_ENTRIES).
 *               out: the value used.
 * @flags:       must be 0.
 * @abi_version: out: ZCSHIM_ABI_VERSION.
 * @ring_size:   out: bytes to mmap at offset 0.
 * @sq_head_off, @sq_tail_off, @cq_head_off, @cq_tail_off: out: byte offsets
 *               of the __u32 ring indexes inside the mapping.
 * @sqes_off, @cqes_off: out: byte offsets of the entry arrays.
 * @resv:        must be 0.
 *
 * RETURN VALUE 0. ERRORS: EINVAL (bad sizes, flags or reserved fields),
 * EBUSY (rings already set up on this file), ENOMEM.
 */
struct zcshim_setup {
	__u32 sq_entries;
	__u32 cq_entries;
	__u32 flags;
	__u32 abi_version;
	__u64 ring_size;
	__u32 sq_head_off;
	__u32 sq_tail_off;
	__u32 cq_head_off;
	__u32 cq_tail_off;
	__u32 sqes_off;
	__u32 cqes_off;
	__u64 resv[2];
};

/*
 * struct zcshim_region - ZCSHIM_IOC_REGISTER argument.
 * @addr:  in: start of the user range (any alignment).
 * @len:   in: bytes, 1..ZCSHIM_MAX_REGION_LEN.
 * @flags: in: ZCSHIM_REG_*.
 * @key:   out: the region key (never 0).
 *
 * RETURN VALUE 0. ERRORS: EINVAL (zero/too long/overflowing range, unknown
 * flags), EFAULT (range not mapped or not writable), ENOMEM (RLIMIT_MEMLOCK
 * exceeded, or out of memory), ENOSPC (ZCSHIM_MAX_REGIONS reached).
 */
struct zcshim_region {
	__u64 addr;
	__u64 len;
	__u32 flags;
	__u32 key;
};

/*
 * struct zcshim_attach - ZCSHIM_IOC_ATTACH argument.
 * @fd:    in: a connected (ESTABLISHED or CLOSE_WAIT) IPv4/IPv6 TCP socket.
 * @flags: in: must be 0.
 * @id:    out: the socket id (never 0).
 * @resv:  must be 0.
 *
 * The shim holds its own reference to the socket until ZCSHIM_IOC_DETACH or
 * close; the application may close its fd.
 * RETURN VALUE 0. ERRORS: EBADF (not an open fd), ENOTSOCK, EOPNOTSUPP (not
 * plain TCP, e.g. MPTCP or UDP), ENOTCONN (not connected), EBUSY (already
 * attached to this file), ENOSPC (ZCSHIM_MAX_SOCKS reached), EINVAL.
 */
struct zcshim_attach {
	__s32 fd;
	__u32 flags;
	__u32 id;
	__u32 resv;
};

/*
 * struct zcshim_id - ZCSHIM_IOC_UNREGISTER / ZCSHIM_IOC_DETACH argument.
 * @id:   region key or socket id.
 * @resv: must be 0.
 * ERRORS: ENOENT (no such region), EBADF (no such socket), EINVAL.
 */
struct zcshim_id {
	__u32 id;
	__u32 resv;
};

/*
 * struct zcshim_enter - ZCSHIM_IOC_ENTER argument (the doorbell).
 * @to_submit:    in: consume up to this many SQEs (0 is allowed).
 * @min_complete: in: with ZCSHIM_ENTER_GETEVENTS, wait until this many
 *                CQEs are ready (<= cq_entries).
 * @flags:        in: ZCSHIM_ENTER_*.
 * @submitted:    out: SQEs consumed.
 * @timeout_ns:   in: maximum wait; 0 waits without limit.
 *
 * RETURN VALUE the number of SQEs consumed (also in @submitted); if any were
 * consumed the call returns that count even if the wait then timed out or
 * was interrupted. ERRORS (nothing consumed): EBUSY (CQ has no room),
 * ETIME (wait timed out), EINTR (signal), ENXIO (no rings: call SETUP),
 * EINVAL (bad flags/fields, min_complete > cq_entries, or an sq_tail more
 * than sq_entries ahead of sq_head).
 */
struct zcshim_enter {
	__u32 to_submit;
	__u32 min_complete;
	__u32 flags;
	__u32 submitted;
	__u64 timeout_ns;
};

/*
 * struct zcshim_stats - ZCSHIM_IOC_STATS result: module-wide live object
 * counts, used by tests to prove that nothing leaked.
 */
struct zcshim_stats {
	__u64 contexts;      /* live per-file contexts (incl. closed ones still referenced) */
	__u64 regions;       /* live regions */
	__u64 pinned_pages;  /* pages pinned by live regions */
	__u64 socks;         /* attached sockets */
	__u64 notifs;        /* SEND notifications not yet delivered */
	__u64 ops;           /* operations queued or running */
	__u64 zc_sends;      /* SENDs whose notification did not report a copy */
	__u64 copied_sends;  /* SENDs whose notification reported a copy */
};

#define ZCSHIM_IOC_MAGIC 'z'

#define ZCSHIM_IOC_SETUP      _IOWR(ZCSHIM_IOC_MAGIC, 1, struct zcshim_setup)
#define ZCSHIM_IOC_REGISTER   _IOWR(ZCSHIM_IOC_MAGIC, 2, struct zcshim_region)
#define ZCSHIM_IOC_UNREGISTER _IOW(ZCSHIM_IOC_MAGIC, 3, struct zcshim_id)
#define ZCSHIM_IOC_ATTACH     _IOWR(ZCSHIM_IOC_MAGIC, 4, struct zcshim_attach)
#define ZCSHIM_IOC_DETACH     _IOW(ZCSHIM_IOC_MAGIC, 5, struct zcshim_id)
#define ZCSHIM_IOC_ENTER      _IOWR(ZCSHIM_IOC_MAGIC, 6, struct zcshim_enter)
#define ZCSHIM_IOC_STATS      _IOR(ZCSHIM_IOC_MAGIC, 7, struct zcshim_stats)

#endif /* _UAPI_ZCSHIM_H */
