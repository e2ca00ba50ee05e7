// SPDX-License-Identifier: GPL-2.0
//go:build ignore

/*
 * (The go:build line above keeps the Go toolchain from treating this file,
 * which shares its directory with package kmod, as cgo source.)
 *
 * zcshim - zcnet's kernel-queue shim: io_uring-like submission/completion
 * rings over /dev/zcshim, memory regions pinned once, zero-copy TCP sends
 * whose notification is posted when the stack releases the pages.
 *
 * The ABI is documented in uapi/zcshim.h. This file's structure:
 *
 *   zc_ctx     one per open file: rings, region table, socket table.
 *              Refcounted: the file holds one reference, every pending
 *              notification holds one. Freed from a workqueue; it holds a
 *              module reference until then.
 *   zc_region  pinned user pages. Refcounted: the table holds one, every
 *              queued op and every pending notification holds one.
 *   zc_sock    an attached socket: a pending-op list processed in order,
 *              inline from ENTER and from a work item that a wait-queue
 *              entry on the socket queues when the socket becomes ready.
 *   zc_op      one accepted SQE until its completion is posted.
 *   zc_notif   the ubuf_info handed to TCP for one SEND; its last reference
 *              posts the notification CQE.
 *
 * Locking: ctx->mu (tables, SQ, setup) -> zs->mu (op execution) ->
 * zs->lock (pending list). ctx->cq_lock (irq-safe) guards the CQ tail and
 * reservations and may be taken from any context.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/version.h>
#include <linux/miscdevice.h>
#include <linux/fs.h>
#include <linux/file.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>
#include <linux/idr.h>
#include <linux/net.h>
#include <linux/poll.h>
#include <linux/uio.h>
#include <linux/bvec.h>
#include <linux/skbuff.h>
#include <linux/workqueue.h>
#include <linux/sched/signal.h>
#include <linux/uaccess.h>
#include <linux/jiffies.h>
#include <net/sock.h>
#include <net/tcp_states.h>

#include "uapi/zcshim.h"

#define ZC_RING_HDR 256u          /* four 64-byte index slots */
#define ZC_BVEC     (ZCSHIM_RECV_MAX / PAGE_SIZE + 2)

static struct workqueue_struct *zc_wq;

/* Module-wide live-object counters (ZCSHIM_IOC_STATS and the unload check). */
static atomic64_t st_contexts, st_regions, st_pinned, st_socks, st_notifs,
	st_ops, st_zc, st_copied;

struct zc_ctx {
	refcount_t ref;
	struct mutex mu;
	spinlock_t cq_lock;
	wait_queue_head_t cq_wait;

	void *ring;
	size_t ring_size;
	u32 sq_entries, cq_entries;
	u32 sq_head;     /* kernel's copy, authoritative */
	u32 cq_tail;     /* kernel's copy, authoritative */
	u32 cq_reserved; /* CQEs promised to accepted ops, not yet posted */
	u32 *u_sq_head, *u_sq_tail, *u_cq_head, *u_cq_tail;
	struct zcshim_sqe *sqes;
	struct zcshim_cqe *cqes;

	struct idr regions;
	u32 nregions;
	struct idr socks;
	u32 nsocks;
	bool dead;

	struct work_struct free_work;
};

struct zc_region {
	refcount_t ref;
	u32 key;
	bool readonly;
	u64 len;
	unsigned long first_off; /* offset of byte 0 inside pages[0] */
	unsigned long npages;
	struct page **pages;
	struct mmpin mmp;
	struct work_struct free_work;
};

struct zc_notif {
	struct ubuf_info uarg; /* handed to TCP as msg_ubuf */
	struct zc_ctx *ctx;
	struct zc_region *reg;
	u64 user_data;
	bool zc_used, zc_copied;
	struct work_struct free_work;
};

struct zc_op {
	struct list_head node;
	u64 user_data;
	u8 opcode;
	struct zc_region *reg;
	u64 off;
	u32 len;
	u32 done;
	struct zc_notif *nf;
};

struct zc_sock {
	struct zc_ctx *ctx;
	u32 id;
	struct file *file;
	struct socket *sock;
	struct mutex mu;        /* serializes op execution */
	spinlock_t lock;        /* pending list */
	struct list_head pending;
	wait_queue_head_t *whead;
	wait_queue_entry_t wqe;
	poll_table pt;
	struct work_struct work;
	struct bio_vec bv[ZC_BVEC]; /* scratch, under mu */
};

/* ---------------------------------------------------------------- ctx */

static void zc_ctx_free_work(struct work_struct *w)
{
	struct zc_ctx *ctx = container_of(w, struct zc_ctx, free_work);

	vfree(ctx->ring);
	kfree(ctx);
	atomic64_dec(&st_contexts);
	module_put(THIS_MODULE);
}

static void zc_ctx_put(struct zc_ctx *ctx)
{
	if (refcount_dec_and_test(&ctx->ref))
		queue_work(zc_wq, &ctx->free_work);
}

/* CQEs the application has not consumed yet, clamped to the ring size. */
static u32 zc_cq_used(struct zc_ctx *ctx)
{
	u32 used = READ_ONCE(ctx->cq_tail) - READ_ONCE(*ctx->u_cq_head);

	return used > ctx->cq_entries ? ctx->cq_entries : used;
}

static bool zc_cq_reserve(struct zc_ctx *ctx, u32 n)
{
	unsigned long fl;
	bool ok;

	spin_lock_irqsave(&ctx->cq_lock, fl);
	ok = (u64)zc_cq_used(ctx) + ctx->cq_reserved + n <= ctx->cq_entries;
	if (ok)
		ctx->cq_reserved += n;
	spin_unlock_irqrestore(&ctx->cq_lock, fl);
	return ok;
}

static void zc_cq_unreserve(struct zc_ctx *ctx, u32 n)
{
	unsigned long fl;

	spin_lock_irqsave(&ctx->cq_lock, fl);
	ctx->cq_reserved -= n;
	spin_unlock_irqrestore(&ctx->cq_lock, fl);
}

/* Post one CQE against an earlier reservation. Any context. */
static void zc_cq_post(struct zc_ctx *ctx, u64 user_data, s32 res, u32 flags)
{
	struct zcshim_cqe *cqe;
	unsigned long fl;

	spin_lock_irqsave(&ctx->cq_lock, fl);
	if (WARN_ON_ONCE(ctx->cq_reserved == 0)) {
		spin_unlock_irqrestore(&ctx->cq_lock, fl);
		return;
	}
	ctx->cq_reserved--;
	cqe = &ctx->cqes[ctx->cq_tail & (ctx->cq_entries - 1)];
	WRITE_ONCE(cqe->user_data, user_data);
	WRITE_ONCE(cqe->res, res);
	WRITE_ONCE(cqe->flags, flags);
	ctx->cq_tail++;
	smp_store_release(ctx->u_cq_tail, ctx->cq_tail);
	spin_unlock_irqrestore(&ctx->cq_lock, fl);
	wake_up_all(&ctx->cq_wait);
}

/* ------------------------------------------------------------- region */

static void zc_region_free_work(struct work_struct *w)
{
	struct zc_region *r = container_of(w, struct zc_region, free_work);

	unpin_user_pages_dirty_lock(r->pages, r->npages, !r->readonly);
	mm_unaccount_pinned_pages(&r->mmp);
	atomic64_sub(r->npages, &st_pinned);
	atomic64_dec(&st_regions);
	kvfree(r->pages);
	kfree(r);
}

static void zc_region_put(struct zc_region *r)
{
	if (r && refcount_dec_and_test(&r->ref))
		queue_work(zc_wq, &r->free_work);
}

/* Pin npages user pages at start; on failure nothing stays pinned. */
static int zc_pin(unsigned long start, unsigned long npages, unsigned int gup,
		  struct page **pages)
{
	unsigned long done = 0;
	int ret;

	while (done < npages) {
		int n = min_t(unsigned long, npages - done, 1u << 16);

		ret = pin_user_pages_fast(start + (done << PAGE_SHIFT), n, gup,
					  pages + done);
		if (ret <= 0) {
			if (done)
				unpin_user_pages(pages, done);
			return ret ? ret : -EFAULT;
		}
		done += ret;
	}
	return 0;
}

static int zc_region_register(struct zc_ctx *ctx, struct zcshim_region *ur)
{
	unsigned long start, end, npages;
	struct zc_region *r;
	int ret, id;

	if (ur->flags & ~ZCSHIM_REG_READONLY || ur->key)
		return -EINVAL;
	if (ur->len == 0 || ur->len > ZCSHIM_MAX_REGION_LEN)
		return -EINVAL;
	if (ur->addr + ur->len < ur->addr || ur->addr + ur->len > TASK_SIZE)
		return -EINVAL;
	if (ctx->nregions >= ZCSHIM_MAX_REGIONS)
		return -ENOSPC;

	start = ur->addr & PAGE_MASK;
	end = PAGE_ALIGN(ur->addr + ur->len);
	npages = (end - start) >> PAGE_SHIFT;

	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	r->pages = kvmalloc_array(npages, sizeof(*r->pages), GFP_KERNEL);
	if (!r->pages) {
		kfree(r);
		return -ENOMEM;
	}
	ret = mm_account_pinned_pages(&r->mmp, end - start);
	if (ret) {
		ret = -ENOMEM;
		goto err_free;
	}
	/*
	 * Pin for write whenever the mapping allows it, even for a read-only
	 * region: a read-only pin of private memory would pin whatever page
	 * is mapped now (the shared zero page, or a page COW later replaces),
	 * and the application's later writes would never be sent. Only
	 * mappings without write permission get a read-only pin.
	 */
	ret = zc_pin(start, npages, FOLL_LONGTERM | FOLL_WRITE, r->pages);
	if (ret == -EFAULT && (ur->flags & ZCSHIM_REG_READONLY))
		ret = zc_pin(start, npages, FOLL_LONGTERM, r->pages);
	if (ret)
		goto err_unaccount;
	refcount_set(&r->ref, 1);
	r->readonly = ur->flags & ZCSHIM_REG_READONLY;
	r->len = ur->len;
	r->first_off = ur->addr & ~PAGE_MASK;
	r->npages = npages;
	INIT_WORK(&r->free_work, zc_region_free_work);

	id = idr_alloc_cyclic(&ctx->regions, r, 1, INT_MAX, GFP_KERNEL);
	if (id < 0) {
		ret = id == -ENOSPC ? -ENOSPC : -ENOMEM;
		unpin_user_pages(r->pages, npages);
		goto err_unaccount;
	}
	r->key = id;
	ctx->nregions++;
	atomic64_inc(&st_regions);
	atomic64_add(npages, &st_pinned);
	ur->key = id;
	return 0;

err_unaccount:
	mm_unaccount_pinned_pages(&r->mmp);
err_free:
	kvfree(r->pages);
	kfree(r);
	/* GUP on a PROT_NONE/unmapped/read-only range reports EFAULT. */
	return ret;
}

static int zc_region_unregister(struct zc_ctx *ctx, u32 key)
{
	struct zc_region *r;

	if (key == 0 || key > INT_MAX)
		return -ENOENT;
	r = idr_remove(&ctx->regions, key);
	if (!r)
		return -ENOENT;
	ctx->nregions--;
	zc_region_put(r);
	return 0;
}

/* Fill bv[] with the pages covering region[off, off+len). Returns bytes. */
static u32 zc_region_bvec(struct zc_region *r, u64 off, u32 len,
			  struct bio_vec *bv, unsigned int *nr)
{
	u32 total = 0;
	unsigned int i = 0;

	while (total < len && i < ZC_BVEC) {
		u64 pos = r->first_off + off + total;
		unsigned long pi = pos >> PAGE_SHIFT;
		u32 po = pos & ~PAGE_MASK;
		u32 take = min_t(u32, PAGE_SIZE - po, len - total);

		bv[i].bv_page = r->pages[pi];
		bv[i].bv_offset = po;
		bv[i].bv_len = take;
		total += take;
		i++;
	}
	*nr = i;
	return total;
}

/* ------------------------------------------------------------- notifs */

static void zc_notif_free_work(struct work_struct *w)
{
	struct zc_notif *nf = container_of(w, struct zc_notif, free_work);

	zc_region_put(nf->reg);
	zc_ctx_put(nf->ctx);
	atomic64_dec(&st_notifs);
	kfree(nf);
}

static void zc_notif_release(struct zc_notif *nf)
{
	bool copied = READ_ONCE(nf->zc_copied) || !READ_ONCE(nf->zc_used);

	atomic64_inc(copied ? &st_copied : &st_zc);
	zc_cq_post(nf->ctx, nf->user_data, 0,
		   ZCSHIM_CQE_F_NOTIF | (copied ? ZCSHIM_CQE_F_COPIED : 0));
	queue_work(zc_wq, &nf->free_work);
}

/*
 * Called by the stack for every reference it drops (one per skb, and for
 * the per-call reference tcp_sendmsg takes), in any context.
 */
static void zc_notif_complete(struct sk_buff *skb, struct ubuf_info *uarg,
			      bool success)
{
	struct zc_notif *nf = container_of(uarg, struct zc_notif, uarg);

	if (success && skb)
		WRITE_ONCE(nf->zc_used, true);
	else if (!success)
		WRITE_ONCE(nf->zc_copied, true);
	if (refcount_dec_and_test(&uarg->refcnt))
		zc_notif_release(nf);
}

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 10, 0)
static const struct ubuf_info_ops zc_ubuf_ops = {
	.complete = zc_notif_complete,
};
#endif

static struct zc_notif *zc_notif_alloc(struct zc_ctx *ctx,
				       struct zc_region *reg, u64 user_data)
{
	struct zc_notif *nf = kzalloc(sizeof(*nf), GFP_KERNEL);

	if (!nf)
		return NULL;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 10, 0)
	nf->uarg.ops = &zc_ubuf_ops;
#else
	nf->uarg.callback = zc_notif_complete;
#endif
	/*
	 * DONT_ORPHAN: the pages are pinned for as long as the notif lives, so
	 * skbs in the write queue may keep them (as io_uring's SEND_ZC does);
	 * receive paths that must not hold user pages (loopback delivery)
	 * still copy through skb_orphan_frags_rx and report COPIED.
	 */
	nf->uarg.flags = SKBFL_ZEROCOPY_FRAG | SKBFL_DONT_ORPHAN;
	refcount_set(&nf->uarg.refcnt, 1); /* ours, dropped at op completion */
	nf->ctx = ctx;
	nf->reg = reg;
	nf->user_data = user_data;
	INIT_WORK(&nf->free_work, zc_notif_free_work);
	refcount_inc(&ctx->ref);
	atomic64_inc(&st_notifs);
	return nf;
}

/* ---------------------------------------------------------------- ops */

/* Post an op's completion and free it. The op is off every list. */
static void zc_op_finish(struct zc_ctx *ctx, struct zc_op *op, int err)
{
	if (op->opcode == ZCSHIM_OP_SEND) {
		s32 res = op->done ? (s32)op->done : err;

		zc_cq_post(ctx, op->user_data, res, ZCSHIM_CQE_F_MORE);
		/* The notif owns the region reference now. */
		zc_notif_complete(NULL, &op->nf->uarg, true);
	} else {
		zc_cq_post(ctx, op->user_data, err, 0);
		zc_region_put(op->reg);
	}
	atomic64_dec(&st_ops);
	kfree(op);
}

/* 0: done; -EAGAIN: wait for the socket; other: failed. */
static int zc_exec_send(struct zc_sock *zs, struct zc_op *op)
{
	struct bio_vec *bv = zs->bv;

	while (op->done < op->len) {
		struct msghdr msg = {};
		unsigned int nr;
		u32 n;
		int ret;

		n = zc_region_bvec(op->reg, op->off + op->done,
				   op->len - op->done, bv, &nr);
		msg.msg_flags = MSG_DONTWAIT | MSG_NOSIGNAL | MSG_ZEROCOPY;
		if (op->done + n < op->len)
			msg.msg_flags |= MSG_MORE;
		msg.msg_ubuf = &op->nf->uarg;
		iov_iter_bvec(&msg.msg_iter, ITER_SOURCE, bv, nr, n);
		ret = sock_sendmsg(zs->sock, &msg);
		if (ret > 0) {
			op->done += ret;
			continue;
		}
		return ret ? ret : -EPIPE;
	}
	return 0;
}

/* >= 0: bytes received (done); -EAGAIN: wait; other: failed. */
static int zc_exec_recv(struct zc_sock *zs, struct zc_op *op)
{
	struct bio_vec *bv = zs->bv;
	struct msghdr msg = {};
	unsigned int nr;
	u32 n;

	n = zc_region_bvec(op->reg, op->off, min(op->len, ZCSHIM_RECV_MAX),
			   bv, &nr);
	iov_iter_bvec(&msg.msg_iter, ITER_DEST, bv, nr, n);
	return sock_recvmsg(zs->sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Run queued ops on a socket in order until one has to wait. */
static void zc_sock_run(struct zc_sock *zs)
{
	mutex_lock(&zs->mu);
	for (;;) {
		struct zc_op *op;
		int ret;

		spin_lock_bh(&zs->lock);
		op = list_first_entry_or_null(&zs->pending, struct zc_op, node);
		spin_unlock_bh(&zs->lock);
		if (!op)
			break;
		if (op->opcode == ZCSHIM_OP_SEND)
			ret = zc_exec_send(zs, op);
		else
			ret = zc_exec_recv(zs, op);
		if (ret == -EAGAIN)
			break;
		spin_lock_bh(&zs->lock);
		list_del(&op->node);
		spin_unlock_bh(&zs->lock);
		zc_op_finish(zs->ctx, op, ret);
	}
	mutex_unlock(&zs->mu);
}

static void zc_sock_work(struct work_struct *w)
{
	zc_sock_run(container_of(w, struct zc_sock, work));
}

/* Socket wait-queue callback (softirq or process context). */
static int zc_sock_wake(struct wait_queue_entry *wqe, unsigned int mode,
			int sync, void *key)
{
	struct zc_sock *zs = container_of(wqe, struct zc_sock, wqe);

	if (!list_empty_careful(&zs->pending))
		queue_work(zc_wq, &zs->work);
	return 0;
}

static void zc_sock_queue_proc(struct file *file, wait_queue_head_t *head,
			       poll_table *pt)
{
	struct zc_sock *zs = container_of(pt, struct zc_sock, pt);

	if (zs->whead)
		return; /* one wait queue per socket is enough */
	zs->whead = head;
	init_waitqueue_func_entry(&zs->wqe, zc_sock_wake);
	add_wait_queue(head, &zs->wqe);
}

static int zc_sock_attach(struct zc_ctx *ctx, struct zcshim_attach *ua)
{
	struct zc_sock *zs, *other;
	struct socket *sock;
	struct file *f;
	struct sock *sk;
	int ret, id, state;

	if (ua->flags || ua->id || ua->resv)
		return -EINVAL;
	if (ctx->nsocks >= ZCSHIM_MAX_SOCKS)
		return -ENOSPC;
	f = fget(ua->fd);
	if (!f)
		return -EBADF;
	sock = sock_from_file(f);
	if (!sock) {
		ret = -ENOTSOCK;
		goto err_fput;
	}
	sk = sock->sk;
	if (!sk || (sk->sk_family != AF_INET && sk->sk_family != AF_INET6) ||
	    sk->sk_type != SOCK_STREAM || sk->sk_protocol != IPPROTO_TCP) {
		ret = -EOPNOTSUPP;
		goto err_fput;
	}
	state = READ_ONCE(sk->sk_state);
	if (state != TCP_ESTABLISHED && state != TCP_CLOSE_WAIT) {
		ret = -ENOTCONN;
		goto err_fput;
	}
	idr_for_each_entry(&ctx->socks, other, id) {
		if (other->sock == sock) {
			ret = -EBUSY;
			goto err_fput;
		}
	}
	zs = kzalloc(sizeof(*zs), GFP_KERNEL);
	if (!zs) {
		ret = -ENOMEM;
		goto err_fput;
	}
	zs->ctx = ctx;
	zs->file = f;
	zs->sock = sock;
	mutex_init(&zs->mu);
	spin_lock_init(&zs->lock);
	INIT_LIST_HEAD(&zs->pending);
	INIT_WORK(&zs->work, zc_sock_work);
	id = idr_alloc_cyclic(&ctx->socks, zs, 1, INT_MAX, GFP_KERNEL);
	if (id < 0) {
		kfree(zs);
		ret = id == -ENOSPC ? -ENOSPC : -ENOMEM;
		goto err_fput;
	}
	zs->id = id;
	init_poll_funcptr(&zs->pt, zc_sock_queue_proc);
	vfs_poll(f, &zs->pt);
	ctx->nsocks++;
	atomic64_inc(&st_socks);
	ua->id = id;
	return 0;

err_fput:
	fput(f);
	return ret;
}

/* Remove a socket: cancel its queued ops, drop our file reference. */
static void zc_sock_destroy(struct zc_ctx *ctx, struct zc_sock *zs)
{
	struct zc_op *op, *tmp;
	LIST_HEAD(drain);

	idr_remove(&ctx->socks, zs->id);
	ctx->nsocks--;
	if (zs->whead)
		remove_wait_queue(zs->whead, &zs->wqe);
	cancel_work_sync(&zs->work);
	mutex_lock(&zs->mu);
	spin_lock_bh(&zs->lock);
	list_splice_init(&zs->pending, &drain);
	spin_unlock_bh(&zs->lock);
	list_for_each_entry_safe(op, tmp, &drain, node) {
		list_del(&op->node);
		zc_op_finish(ctx, op, -ECANCELED);
	}
	mutex_unlock(&zs->mu);
	fput(zs->file);
	atomic64_dec(&st_socks);
	kfree(zs);
}

static int zc_sock_detach(struct zc_ctx *ctx, u32 id)
{
	struct zc_sock *zs;

	if (id == 0 || id > INT_MAX)
		return -EBADF;
	zs = idr_find(&ctx->socks, id);
	if (!zs)
		return -EBADF;
	zc_sock_destroy(ctx, zs);
	return 0;
}

/* ------------------------------------------------------------- submit */

static int zc_prep(struct zc_ctx *ctx, const struct zcshim_sqe *sqe,
		   struct zc_op **opp, struct zc_sock **zsp)
{
	struct zc_region *reg;
	struct zc_sock *zs;
	struct zc_op *op;

	if (sqe->flags || sqe->resv0 || sqe->op_flags || sqe->resv1 ||
	    sqe->resv2[0] || sqe->resv2[1] || sqe->resv2[2])
		return -EINVAL;
	if (sqe->opcode == ZCSHIM_OP_NOP) {
		if (sqe->sock || sqe->region || sqe->len || sqe->off)
			return -EINVAL;
		return 0;
	}
	if (sqe->opcode != ZCSHIM_OP_SEND && sqe->opcode != ZCSHIM_OP_RECV)
		return -EINVAL;
	if (sqe->len == 0)
		return -EINVAL;
	reg = sqe->region && sqe->region <= INT_MAX ?
		idr_find(&ctx->regions, sqe->region) : NULL;
	if (!reg)
		return -ENOENT;
	if (sqe->off > reg->len || sqe->len > reg->len - sqe->off)
		return -EINVAL;
	zs = sqe->sock && sqe->sock <= INT_MAX ?
		idr_find(&ctx->socks, sqe->sock) : NULL;
	if (!zs)
		return -EBADF;
	if (sqe->opcode == ZCSHIM_OP_RECV && reg->readonly)
		return -EACCES;

	op = kzalloc(sizeof(*op), GFP_KERNEL);
	if (!op)
		return -ENOMEM;
	op->opcode = sqe->opcode;
	op->user_data = sqe->user_data;
	op->off = sqe->off;
	op->len = sqe->len;
	op->reg = reg;
	if (op->opcode == ZCSHIM_OP_SEND) {
		op->nf = zc_notif_alloc(ctx, reg, sqe->user_data);
		if (!op->nf) {
			kfree(op);
			return -ENOMEM;
		}
	}
	refcount_inc(&reg->ref);
	atomic64_inc(&st_ops);
	*opp = op;
	*zsp = zs;
	return 0;
}

static int zc_submit(struct zc_ctx *ctx, u32 to_submit)
{
	u32 submitted = 0;

	while (submitted < to_submit) {
		struct zcshim_sqe sqe;
		struct zc_op *op = NULL;
		struct zc_sock *zs = NULL;
		u32 tail, avail, need;
		int ret;

		tail = smp_load_acquire(ctx->u_sq_tail);
		avail = tail - ctx->sq_head;
		if (avail > ctx->sq_entries)
			return submitted ? submitted : -EINVAL; /* nonsensical tail */
		if (avail == 0)
			break;
		memcpy(&sqe, &ctx->sqes[ctx->sq_head & (ctx->sq_entries - 1)],
		       sizeof(sqe));
		barrier(); /* validate only the private copy */
		need = sqe.opcode == ZCSHIM_OP_SEND ? 2 : 1;
		if (!zc_cq_reserve(ctx, need))
			break;
		ctx->sq_head++;
		smp_store_release(ctx->u_sq_head, ctx->sq_head);
		submitted++;

		ret = zc_prep(ctx, &sqe, &op, &zs);
		if (ret || !op) {
			if (need == 2)
				zc_cq_unreserve(ctx, 1);
			zc_cq_post(ctx, sqe.user_data, ret, 0);
			continue;
		}
		spin_lock_bh(&zs->lock);
		list_add_tail(&op->node, &zs->pending);
		spin_unlock_bh(&zs->lock);
		zc_sock_run(zs);
	}
	return submitted ? submitted : (to_submit ? -EBUSY : 0);
}

static int zc_enter(struct zc_ctx *ctx, struct zcshim_enter *ue)
{
	int submitted = 0;
	long left;

	if (ue->flags & ~ZCSHIM_ENTER_GETEVENTS || ue->submitted)
		return -EINVAL;
	if ((ue->flags & ZCSHIM_ENTER_GETEVENTS) &&
	    ue->min_complete > ctx->cq_entries)
		return -EINVAL;
	if (ue->to_submit) {
		mutex_lock(&ctx->mu);
		submitted = zc_submit(ctx, min(ue->to_submit, ctx->sq_entries));
		mutex_unlock(&ctx->mu);
		if (submitted == -EBUSY && (ue->flags & ZCSHIM_ENTER_GETEVENTS))
			submitted = 0; /* let the caller wait for room */
		else if (submitted < 0)
			return submitted;
	}
	ue->submitted = submitted;
	if (!(ue->flags & ZCSHIM_ENTER_GETEVENTS) || ue->min_complete == 0)
		return submitted;

	if (ue->timeout_ns) {
		unsigned long t = nsecs_to_jiffies(ue->timeout_ns);

		left = wait_event_interruptible_timeout(ctx->cq_wait,
			zc_cq_used(ctx) >= ue->min_complete, t ? t : 1);
		if (left == 0)
			return submitted ? submitted : -ETIME;
	} else {
		left = wait_event_interruptible(ctx->cq_wait,
			zc_cq_used(ctx) >= ue->min_complete);
	}
	if (left < 0)
		return submitted ? submitted : -EINTR;
	return submitted;
}

/* -------------------------------------------------------------- setup */

static int zc_setup(struct zc_ctx *ctx, struct zcshim_setup *us)
{
	u32 sq = us->sq_entries, cq = us->cq_entries;
	size_t size;
	void *ring;

	if (us->flags || us->abi_version || us->ring_size || us->sq_head_off ||
	    us->sq_tail_off || us->cq_head_off || us->cq_tail_off ||
	    us->sqes_off || us->cqes_off || us->resv[0] || us->resv[1])
		return -EINVAL;
	if (ctx->ring)
		return -EBUSY;
	if (sq == 0 || sq > ZCSHIM_MAX_ENTRIES || !is_power_of_2(sq))
		return -EINVAL;
	if (cq == 0)
		cq = min_t(u32, 2 * sq, ZCSHIM_MAX_ENTRIES);
	if (cq > ZCSHIM_MAX_ENTRIES || !is_power_of_2(cq) ||
	    (cq < 2 * sq && cq != ZCSHIM_MAX_ENTRIES))
		return -EINVAL;

	size = PAGE_ALIGN(ZC_RING_HDR + sq * sizeof(struct zcshim_sqe) +
			  cq * sizeof(struct zcshim_cqe));
	ring = vmalloc_user(size);
	if (!ring)
		return -ENOMEM;
	ctx->ring_size = size;
	ctx->sq_entries = sq;
	ctx->cq_entries = cq;
	ctx->u_sq_head = ring + 0;
	ctx->u_sq_tail = ring + 64;
	ctx->u_cq_head = ring + 128;
	ctx->u_cq_tail = ring + 192;
	ctx->sqes = ring + ZC_RING_HDR;
	ctx->cqes = ring + ZC_RING_HDR + sq * sizeof(struct zcshim_sqe);
	smp_store_release(&ctx->ring, ring); /* publish after the fields */

	us->cq_entries = cq;
	us->abi_version = ZCSHIM_ABI_VERSION;
	us->ring_size = size;
	us->sq_head_off = 0;
	us->sq_tail_off = 64;
	us->cq_head_off = 128;
	us->cq_tail_off = 192;
	us->sqes_off = ZC_RING_HDR;
	us->cqes_off = ZC_RING_HDR + sq * sizeof(struct zcshim_sqe);
	return 0;
}

/* ------------------------------------------------------------ fileops */

static int zc_open(struct inode *inode, struct file *file)
{
	struct zc_ctx *ctx = kzalloc(sizeof(*ctx), GFP_KERNEL);

	if (!ctx)
		return -ENOMEM;
	refcount_set(&ctx->ref, 1);
	mutex_init(&ctx->mu);
	spin_lock_init(&ctx->cq_lock);
	init_waitqueue_head(&ctx->cq_wait);
	idr_init(&ctx->regions);
	idr_init(&ctx->socks);
	INIT_WORK(&ctx->free_work, zc_ctx_free_work);
	__module_get(THIS_MODULE); /* held until the context is freed */
	atomic64_inc(&st_contexts);
	file->private_data = ctx;
	return 0;
}

static int zc_release(struct inode *inode, struct file *file)
{
	struct zc_ctx *ctx = file->private_data;
	struct zc_region *r;
	struct zc_sock *zs;
	int id;

	mutex_lock(&ctx->mu);
	ctx->dead = true;
	idr_for_each_entry(&ctx->socks, zs, id)
		zc_sock_destroy(ctx, zs);
	idr_for_each_entry(&ctx->regions, r, id) {
		idr_remove(&ctx->regions, id);
		zc_region_put(r);
	}
	ctx->nregions = 0;
	idr_destroy(&ctx->regions);
	idr_destroy(&ctx->socks);
	mutex_unlock(&ctx->mu);
	wake_up_all(&ctx->cq_wait);
	zc_ctx_put(ctx);
	return 0;
}

static long zc_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct zc_ctx *ctx = file->private_data;
	void __user *uarg = (void __user *)arg;
	long ret;

	switch (cmd) {
	case ZCSHIM_IOC_SETUP: {
		struct zcshim_setup us;

		if (copy_from_user(&us, uarg, sizeof(us)))
			return -EFAULT;
		mutex_lock(&ctx->mu);
		ret = zc_setup(ctx, &us);
		mutex_unlock(&ctx->mu);
		if (!ret && copy_to_user(uarg, &us, sizeof(us)))
			return -EFAULT; /* rings stay set up; mmap still works */
		return ret;
	}
	case ZCSHIM_IOC_REGISTER: {
		struct zcshim_region ur;

		if (copy_from_user(&ur, uarg, sizeof(ur)))
			return -EFAULT;
		mutex_lock(&ctx->mu);
		ret = zc_region_register(ctx, &ur);
		if (!ret && copy_to_user(uarg, &ur, sizeof(ur))) {
			zc_region_unregister(ctx, ur.key);
			ret = -EFAULT;
		}
		mutex_unlock(&ctx->mu);
		return ret;
	}
	case ZCSHIM_IOC_UNREGISTER:
	case ZCSHIM_IOC_DETACH: {
		struct zcshim_id ui;

		if (copy_from_user(&ui, uarg, sizeof(ui)))
			return -EFAULT;
		if (ui.resv)
			return -EINVAL;
		mutex_lock(&ctx->mu);
		if (cmd == ZCSHIM_IOC_UNREGISTER)
			ret = zc_region_unregister(ctx, ui.id);
		else
			ret = zc_sock_detach(ctx, ui.id);
		mutex_unlock(&ctx->mu);
		return ret;
	}
	case ZCSHIM_IOC_ATTACH: {
		struct zcshim_attach ua;

		if (copy_from_user(&ua, uarg, sizeof(ua)))
			return -EFAULT;
		if (!smp_load_acquire(&ctx->ring))
			return -ENXIO;
		mutex_lock(&ctx->mu);
		ret = zc_sock_attach(ctx, &ua);
		if (!ret && copy_to_user(uarg, &ua, sizeof(ua))) {
			zc_sock_detach(ctx, ua.id);
			ret = -EFAULT;
		}
		mutex_unlock(&ctx->mu);
		return ret;
	}
	case ZCSHIM_IOC_ENTER: {
		struct zcshim_enter ue;

		if (copy_from_user(&ue, uarg, sizeof(ue)))
			return -EFAULT;
		if (!smp_load_acquire(&ctx->ring))
			return -ENXIO;
		ret = zc_enter(ctx, &ue);
		if (ret >= 0 && put_user(ue.submitted,
					 &((struct zcshim_enter __user *)uarg)->submitted))
			return ret > 0 ? ret : -EFAULT;
		return ret;
	}
	case ZCSHIM_IOC_STATS: {
		struct zcshim_stats st = {
			.contexts = atomic64_read(&st_contexts),
			.regions = atomic64_read(&st_regions),
			.pinned_pages = atomic64_read(&st_pinned),
			.socks = atomic64_read(&st_socks),
			.notifs = atomic64_read(&st_notifs),
			.ops = atomic64_read(&st_ops),
			.zc_sends = atomic64_read(&st_zc),
			.copied_sends = atomic64_read(&st_copied),
		};

		return copy_to_user(uarg, &st, sizeof(st)) ? -EFAULT : 0;
	}
	}
	return -ENOTTY;
}

static int zc_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct zc_ctx *ctx = file->private_data;
	unsigned long size = vma->vm_end - vma->vm_start;
	void *ring = smp_load_acquire(&ctx->ring);

	/* No ctx->mu here: mmap holds mmap_lock, REGISTER takes them the other way. */
	if (!ring)
		return -ENXIO;
	if (vma->vm_pgoff != 0 || size > ctx->ring_size)
		return -EINVAL;
	return remap_vmalloc_range(vma, ring, 0);
}

static __poll_t zc_poll(struct file *file, poll_table *pt)
{
	struct zc_ctx *ctx = file->private_data;

	poll_wait(file, &ctx->cq_wait, pt);
	if (smp_load_acquire(&ctx->ring) && zc_cq_used(ctx))
		return EPOLLIN | EPOLLRDNORM;
	return 0;
}

static const struct file_operations zc_fops = {
	.owner = THIS_MODULE,
	.open = zc_open,
	.release = zc_release,
	.unlocked_ioctl = zc_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = zc_mmap,
	.poll = zc_poll,
	.llseek = noop_llseek,
};

static struct miscdevice zc_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = ZCSHIM_DEVICE_NAME,
	.fops = &zc_fops,
	.mode = 0666,
};

static int __init zc_init(void)
{
	int ret;

	zc_wq = alloc_workqueue("zcshim", WQ_UNBOUND, 0);
	if (!zc_wq)
		return -ENOMEM;
	ret = misc_register(&zc_misc);
	if (ret) {
		destroy_workqueue(zc_wq);
		return ret;
	}
	pr_info("zcshim: loaded, abi %d\n", ZCSHIM_ABI_VERSION);
	return 0;
}

static void __exit zc_exit(void)
{
	misc_deregister(&zc_misc);
	destroy_workqueue(zc_wq); /* drains the last free works */
	if (atomic64_read(&st_contexts) || atomic64_read(&st_regions) ||
	    atomic64_read(&st_pinned) || atomic64_read(&st_socks) ||
	    atomic64_read(&st_notifs) || atomic64_read(&st_ops))
		pr_err("zcshim: LEAK contexts=%lld regions=%lld pinned=%lld socks=%lld notifs=%lld ops=%lld\n",
		       atomic64_read(&st_contexts), atomic64_read(&st_regions),
		       atomic64_read(&st_pinned), atomic64_read(&st_socks),
		       atomic64_read(&st_notifs), atomic64_read(&st_ops));
	pr_info("zcshim: unloaded (zc sends %lld, copied sends %lld)\n",
		atomic64_read(&st_zc), atomic64_read(&st_copied));
}

module_init(zc_init);
module_exit(zc_exit);
MODULE_LICENSE("GPL");
MODULE_AUTHOR("zcnet");
MODULE_DESCRIPTION("zcnet kernel-queue shim: zero-copy TCP send/recv rings");
