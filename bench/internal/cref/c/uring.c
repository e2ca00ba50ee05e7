/*
 * uring.c: the C io_uring echo server, zcbench's reference for what an io_uring server
 * costs per request. Written against the raw system calls (io_uring_setup, _enter,
 * _register through syscall(2), the rings mmap'd) with the kernel's own uapi header, so
 * no liburing is needed; it is built the way a careful liburing server is:
 *
 *   - one ring per thread, SINGLE_ISSUER|DEFER_TASKRUN where the kernel has them
 *     (else COOP_TASKRUN, else plain), a CQ of its own size, the ring's fd registered
 *     (IORING_ENTER_REGISTERED_RING) and the sockets registered as fixed files (no file
 *     lookup per operation), each where the kernel takes it;
 *   - a provided-buffer ring (IORING_REGISTER_PBUF_RING) and one multishot RECV per
 *     connection that picks its buffers from it, re-armed whenever a completion comes
 *     without IORING_CQE_F_MORE (ENOBUFS included: then when a buffer comes back);
 *   - one SEND per received chunk, straight from the buffer the kernel filled (no copy),
 *     the buffer handed back to the ring when the send has taken all of it; short sends
 *     resubmit the rest; one send in flight per connection, later chunks queue behind it
 *     (two sends in flight on one socket could reorder);
 *   - one io_uring_enter per loop: it submits everything queued and waits for at least
 *     one completion; every completion found is handled before the next enter.
 *
 * Every received byte goes through the frame checker (cref.h) before it is echoed, as
 * every Go server in zcbench does. Connections are accepted before the loop (cref.h).
 */
#include "cref.h"

#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#define UD_RECV 1ull
#define UD_SEND 2ull
#define UD_CANCEL 3ull
#define UD(kind, conn, bid) ((kind) << 56 | (uint64_t)(conn) << 16 | (uint64_t)(bid))
#define UD_KIND(u) ((u) >> 56)
#define UD_CONN(u) (((u) >> 16) & 0xffffffffffull)

#define BUF_SIZE 4096
#define BGID 0

struct ring {
	int fd;
	int enter_fd;          /* the registered ring index, or fd */
	unsigned enter_flags;  /* IORING_ENTER_REGISTERED_RING when registered */
	unsigned *sq_head, *sq_tail, sq_mask, sq_entries;
	struct io_uring_sqe *sqes;
	unsigned sqe_tail; /* next SQE to fill; published to *sq_tail before each enter */
	unsigned *cq_head, *cq_tail, cq_mask;
	struct io_uring_cqe *cqes;
	void *sq_map, *cq_map, *sqe_map;
	size_t sq_len, cq_len, sqe_len;
};

/* one per buffer id: the part of the buffer still to send, and the next queued chunk */
struct chunk {
	uint32_t off, len;
	int32_t next;
};

struct conn {
	int fd;
	int recv_armed; /* a multishot recv is in the kernel */
	int send_busy;  /* a send is in the kernel */
	int eof;        /* no more bytes will arrive */
	int failed;     /* reset or broken pipe: drop what is queued */
	int closed;
	int starved;    /* recv ended with ENOBUFS: re-arm when a buffer returns */
	int32_t qhead, qtail; /* queued chunks (buffer ids), qhead is being sent */
	struct verifier v;
};

struct server {
	struct ring r;
	struct io_uring_buf_ring *br;
	size_t br_len;
	uint8_t *bufs;
	size_t bufs_len;
	unsigned nbufs;
	uint16_t br_tail;
	struct chunk *chunks;
	struct conn *conns;
	int fixed; /* the sockets are registered files: SQEs name them by index */
	int nconns, live;
	int *starved; /* connections waiting for a buffer */
	int nstarved;
};

static char setup_desc[96] = "none";

static int sys_setup(unsigned entries, struct io_uring_params *p)
{
	return (int)syscall(__NR_io_uring_setup, entries, p);
}

static int sys_enter(struct ring *r, unsigned to_submit, unsigned min_complete, unsigned flags)
{
	return (int)syscall(__NR_io_uring_enter, r->enter_fd, to_submit, min_complete, flags | r->enter_flags, NULL, 0);
}

static int sys_register(int fd, unsigned op, void *arg, unsigned nr)
{
	return (int)syscall(__NR_io_uring_register, fd, op, arg, nr);
}

static void *map_ring(int fd, size_t len, off_t off)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, off);
	if (p == MAP_FAILED)
		die("mmap ring");
	return p;
}

/* ring_init sets a ring up with the best task-running mode the kernel takes. */
static void ring_init(struct ring *r, unsigned entries, unsigned cq_entries, int first)
{
	static const struct {
		unsigned flags;
		const char *name;
	} tries[] = {
		{IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, "SINGLE_ISSUER|DEFER_TASKRUN"},
		{IORING_SETUP_COOP_TASKRUN, "COOP_TASKRUN"},
		{0, "plain"},
	};
	struct io_uring_params p;
	int fd = -1;
	for (size_t i = 0; i < sizeof(tries) / sizeof(tries[0]); i++) {
		memset(&p, 0, sizeof(p));
		p.flags = tries[i].flags | IORING_SETUP_CQSIZE;
		p.cq_entries = cq_entries;
		fd = sys_setup(entries, &p);
		if (fd >= 0) {
			if (first)
				snprintf(setup_desc, sizeof(setup_desc), "%s", tries[i].name);
			break;
		}
		if (errno != EINVAL)
			die("io_uring_setup");
	}
	if (fd < 0)
		die("io_uring_setup");
	r->fd = fd;
	r->enter_fd = fd;
	r->enter_flags = 0;
	/* register the ring's own fd: io_uring_enter skips the fd lookup (5.18+) */
	struct io_uring_rsrc_update up = {.offset = ~0u, .data = (uint64_t)fd};
	if (sys_register(fd, IORING_REGISTER_RING_FDS, &up, 1) == 1) {
		r->enter_fd = (int)up.offset;
		r->enter_flags = IORING_ENTER_REGISTERED_RING;
		if (first)
			strncat(setup_desc, ",registered-ring", sizeof(setup_desc) - strlen(setup_desc) - 1);
	}
	r->sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
	r->cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	if (p.features & IORING_FEAT_SINGLE_MMAP) {
		if (r->cq_len > r->sq_len)
			r->sq_len = r->cq_len;
		r->sq_map = map_ring(fd, r->sq_len, IORING_OFF_SQ_RING);
		r->cq_map = r->sq_map;
		r->cq_len = 0;
	} else {
		r->sq_map = map_ring(fd, r->sq_len, IORING_OFF_SQ_RING);
		r->cq_map = map_ring(fd, r->cq_len, IORING_OFF_CQ_RING);
	}
	r->sqe_len = p.sq_entries * sizeof(struct io_uring_sqe);
	r->sqe_map = map_ring(fd, r->sqe_len, IORING_OFF_SQES);
	r->sqes = r->sqe_map;
	uint8_t *sq = r->sq_map, *cq = r->cq_map;
	r->sq_head = (unsigned *)(sq + p.sq_off.head);
	r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
	r->sq_mask = *(unsigned *)(sq + p.sq_off.ring_mask);
	r->sq_entries = p.sq_entries;
	unsigned *array = (unsigned *)(sq + p.sq_off.array);
	for (unsigned i = 0; i < p.sq_entries; i++)
		array[i] = i; /* SQE i sits in slot i: only the tail moves */
	r->sqe_tail = *r->sq_tail;
	r->cq_head = (unsigned *)(cq + p.cq_off.head);
	r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
	r->cq_mask = *(unsigned *)(cq + p.cq_off.ring_mask);
	r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
}

/* ring_flush submits everything queued without waiting (get_sqe: the SQ is full). */
static void ring_flush(struct ring *r)
{
	atomic_store_explicit((_Atomic unsigned *)r->sq_tail, r->sqe_tail, memory_order_release);
	for (;;) {
		unsigned n = r->sqe_tail - atomic_load_explicit((_Atomic unsigned *)r->sq_head, memory_order_acquire);
		if (n == 0)
			return;
		int rc = sys_enter(r, n, 0, 0);
		if (rc < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == EBUSY)
				continue;
			die("io_uring_enter");
		}
	}
}

static struct io_uring_sqe *get_sqe(struct ring *r)
{
	unsigned head = atomic_load_explicit((_Atomic unsigned *)r->sq_head, memory_order_acquire);
	if (r->sqe_tail - head >= r->sq_entries)
		ring_flush(r);
	struct io_uring_sqe *sqe = &r->sqes[r->sqe_tail & r->sq_mask];
	memset(sqe, 0, sizeof(*sqe));
	r->sqe_tail++;
	return sqe;
}

static void arm_recv(struct server *s, int ci)
{
	struct io_uring_sqe *sqe = get_sqe(&s->r);
	sqe->opcode = IORING_OP_RECV;
	sqe->fd = s->fixed ? ci : s->conns[ci].fd;
	sqe->ioprio = IORING_RECV_MULTISHOT;
	sqe->flags = IOSQE_BUFFER_SELECT | (s->fixed ? IOSQE_FIXED_FILE : 0);
	sqe->buf_group = BGID;
	sqe->user_data = UD(UD_RECV, ci, 0);
	s->conns[ci].recv_armed = 1;
}

static void send_head(struct server *s, int ci)
{
	struct conn *c = &s->conns[ci];
	int32_t bid = c->qhead;
	struct chunk *k = &s->chunks[bid];
	struct io_uring_sqe *sqe = get_sqe(&s->r);
	sqe->opcode = IORING_OP_SEND;
	sqe->fd = s->fixed ? ci : c->fd;
	sqe->flags = s->fixed ? IOSQE_FIXED_FILE : 0;
	sqe->addr = (uint64_t)(uintptr_t)(s->bufs + (size_t)bid * BUF_SIZE + k->off);
	sqe->len = k->len;
	sqe->msg_flags = MSG_NOSIGNAL;
	sqe->user_data = UD(UD_SEND, ci, bid);
	c->send_busy = 1;
}

/* recycle hands buffer bid back to the kernel (published before the next enter) and
 * re-arms a connection that starved for one. */
static void recycle(struct server *s, int32_t bid)
{
	struct io_uring_buf *b = &s->br->bufs[s->br_tail & (s->nbufs - 1)];
	b->addr = (uint64_t)(uintptr_t)(s->bufs + (size_t)bid * BUF_SIZE);
	b->len = BUF_SIZE;
	b->bid = (uint16_t)bid;
	s->br_tail++;
	if (s->nstarved > 0) {
		int ci = s->starved[--s->nstarved];
		s->conns[ci].starved = 0;
		if (!s->conns[ci].closed && !s->conns[ci].eof)
			arm_recv(s, ci);
	}
}

static void publish_bufs(struct server *s)
{
	atomic_store_explicit((_Atomic uint16_t *)&s->br->tail, s->br_tail, memory_order_release);
}

static void maybe_close(struct server *s, struct worker *w, int ci)
{
	struct conn *c = &s->conns[ci];
	if (c->closed || c->recv_armed || c->send_busy || c->starved)
		return;
	if (!c->eof && !c->failed)
		return;
	if (!c->failed && c->qhead >= 0)
		return; /* echo what is queued first */
	while (c->qhead >= 0) { /* failed: drop the rest */
		int32_t bid = c->qhead;
		c->qhead = s->chunks[bid].next;
		recycle(s, bid);
	}
	if (!c->failed)
		verifier_close(&c->v);
	w->frames += c->v.frames;
	w->bytes += c->v.bytes;
	if (c->failed)
		w->resets++;
	if (s->fixed) { /* drop the ring's reference too, or the socket stays open */
		int32_t none = -1;
		struct io_uring_files_update upd = {.offset = (uint32_t)ci, .fds = (uint64_t)(uintptr_t)&none};
		if (sys_register(s->r.fd, IORING_REGISTER_FILES_UPDATE, &upd, 1) < 0)
			die("IORING_REGISTER_FILES_UPDATE");
	}
	close(c->fd);
	c->closed = 1;
	s->live--;
}

static void on_recv(struct server *s, struct worker *w, int ci, int res, unsigned flags)
{
	struct conn *c = &s->conns[ci];
	if (!(flags & IORING_CQE_F_MORE))
		c->recv_armed = 0;
	if (res > 0) {
		if (!(flags & IORING_CQE_F_BUFFER)) {
			fprintf(stderr, "cref: recv completion without a buffer\n");
			exit(1);
		}
		window_start();
		int32_t bid = (int32_t)(flags >> IORING_CQE_BUFFER_SHIFT);
		verify(&c->v, s->bufs + (size_t)bid * BUF_SIZE, (size_t)res);
		struct chunk *k = &s->chunks[bid];
		k->off = 0;
		k->len = (uint32_t)res;
		k->next = -1;
		if (c->failed) {
			recycle(s, bid);
		} else {
			if (c->qhead < 0)
				c->qhead = bid;
			else
				s->chunks[c->qtail].next = bid;
			c->qtail = bid;
			if (!c->send_busy)
				send_head(s, ci);
		}
		if (!c->recv_armed && !c->eof && !c->failed)
			arm_recv(s, ci);
		if (c->failed)
			maybe_close(s, w, ci); /* a send failed while this recv was armed */
		return;
	}
	if (res == 0) {
		c->eof = 1;
	} else if (res == -ENOBUFS) {
		if (!c->recv_armed && !c->starved) {
			c->starved = 1;
			s->starved[s->nstarved++] = ci;
		}
		return;
	} else {
		c->eof = 1;
		c->failed = 1; /* ECONNRESET and friends */
	}
	maybe_close(s, w, ci);
}

/* cancel_recv ends a connection's multishot recv (its last CQE comes without F_MORE). */
static void cancel_recv(struct server *s, int ci)
{
	struct io_uring_sqe *sqe = get_sqe(&s->r);
	sqe->opcode = IORING_OP_ASYNC_CANCEL;
	sqe->addr = UD(UD_RECV, ci, 0);
	sqe->user_data = UD(UD_CANCEL, ci, 0);
}

static void on_send(struct server *s, struct worker *w, int ci, int32_t bid, int res)
{
	struct conn *c = &s->conns[ci];
	c->send_busy = 0;
	if (res <= 0) {
		if (c->recv_armed && !c->failed)
			cancel_recv(s, ci); /* the peer is gone: stop receiving */
		c->failed = 1;
		c->eof = 1;
	} else {
		struct chunk *k = &s->chunks[bid];
		k->off += (uint32_t)res;
		k->len -= (uint32_t)res;
		if (k->len == 0) {
			c->qhead = k->next;
			recycle(s, bid);
		}
	}
	if (!c->failed && c->qhead >= 0) {
		send_head(s, ci);
		return;
	}
	maybe_close(s, w, ci);
}

static unsigned pow2_at_least(unsigned n)
{
	unsigned p = 1;
	while (p < n)
		p <<= 1;
	return p;
}

static void *uring_worker(struct worker *w)
{
	struct server *s = calloc(1, sizeof(*s));
	if (!s)
		die("calloc");
	w->priv = s;
	s->nconns = s->live = w->nfds;
	/* two buffers per connection at least (one being echoed, one arriving), 256 to 32768 */
	s->nbufs = pow2_at_least((unsigned)(2 * w->nfds));
	if (s->nbufs < 256)
		s->nbufs = 256;
	if (s->nbufs > 32768)
		s->nbufs = 32768;
	ring_init(&s->r, 256, 2 * s->nbufs > 4096 ? 2 * s->nbufs : 4096, w->id == 0);

	s->br_len = (s->nbufs * sizeof(struct io_uring_buf) + 4095) & ~(size_t)4095;
	s->br = mmap(NULL, s->br_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (s->br == MAP_FAILED)
		die("mmap buffer ring");
	s->bufs_len = (size_t)s->nbufs * BUF_SIZE;
	s->bufs = mmap(NULL, s->bufs_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (s->bufs == MAP_FAILED)
		die("mmap buffers");
	struct io_uring_buf_reg reg = {.ring_addr = (uint64_t)(uintptr_t)s->br, .ring_entries = s->nbufs, .bgid = BGID};
	if (sys_register(s->r.fd, IORING_REGISTER_PBUF_RING, &reg, 1) < 0)
		die("IORING_REGISTER_PBUF_RING");
	s->chunks = calloc(s->nbufs, sizeof(*s->chunks));
	s->conns = calloc(s->nconns, sizeof(*s->conns));
	s->starved = calloc(s->nconns, sizeof(int));
	if (!s->chunks || !s->conns || !s->starved)
		die("calloc");
	for (unsigned b = 0; b < s->nbufs; b++) {
		struct io_uring_buf *e = &s->br->bufs[b];
		e->addr = (uint64_t)(uintptr_t)(s->bufs + (size_t)b * BUF_SIZE);
		e->len = BUF_SIZE;
		e->bid = (uint16_t)b;
	}
	s->br_tail = (uint16_t)s->nbufs;
	publish_bufs(s);
	/* the sockets as registered files: no file lookup and reference per operation */
	if (sys_register(s->r.fd, IORING_REGISTER_FILES, w->fds, (unsigned)w->nfds) == 0) {
		s->fixed = 1;
		if (w->id == 0)
			strncat(setup_desc, ",fixed-files", sizeof(setup_desc) - strlen(setup_desc) - 1);
	}
	for (int i = 0; i < s->nconns; i++) {
		struct conn *c = &s->conns[i];
		c->fd = w->fds[i];
		c->qhead = c->qtail = -1;
		verifier_init(&c->v, w->o);
		arm_recv(s, i);
	}

	struct ring *r = &s->r;
	while (s->live > 0) {
		publish_bufs(s);
		atomic_store_explicit((_Atomic unsigned *)r->sq_tail, r->sqe_tail, memory_order_release);
		unsigned n = r->sqe_tail - atomic_load_explicit((_Atomic unsigned *)r->sq_head, memory_order_acquire);
		int rc = sys_enter(r, n, 1, IORING_ENTER_GETEVENTS);
		if (rc < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == EBUSY)
				continue; /* the unsubmitted rest stays in the SQ: submitted next time */
			die("io_uring_enter");
		}
		unsigned head = *r->cq_head;
		unsigned tail = atomic_load_explicit((_Atomic unsigned *)r->cq_tail, memory_order_acquire);
		for (; head != tail; head++) {
			struct io_uring_cqe *cqe = &r->cqes[head & r->cq_mask];
			uint64_t ud = cqe->user_data;
			int res = cqe->res;
			unsigned flags = cqe->flags;
			int ci = (int)UD_CONN(ud);
			if (UD_KIND(ud) == UD_RECV)
				on_recv(s, w, ci, res, flags);
			else if (UD_KIND(ud) == UD_SEND)
				on_send(s, w, ci, (int32_t)(ud & 0xffff), res);
			/* UD_CANCEL: nothing to do; the recv's own last CQE closes the connection */
		}
		atomic_store_explicit((_Atomic unsigned *)r->cq_head, head, memory_order_release);
	}
	return NULL;
}

/* uring_teardown runs after the measured window: unregister, unmap, close. */
static void uring_teardown(struct worker *w)
{
	struct server *s = w->priv;
	if (!s)
		return;
	struct io_uring_buf_reg reg = {.bgid = BGID};
	sys_register(s->r.fd, IORING_UNREGISTER_PBUF_RING, &reg, 1);
	close(s->r.fd);
	munmap(s->r.sqe_map, s->r.sqe_len);
	if (s->r.cq_len)
		munmap(s->r.cq_map, s->r.cq_len);
	munmap(s->r.sq_map, s->r.sq_len);
	munmap(s->br, s->br_len);
	munmap(s->bufs, s->bufs_len);
	free(s->chunks);
	free(s->conns);
	free(s->starved);
	free(s);
}

static const char *describe(void) { return setup_desc; }

int main(int argc, char **argv)
{
	return serve_main(argc, argv, 0, uring_worker, uring_teardown, describe);
}
