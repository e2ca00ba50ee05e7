/*
 * epoll.c: the plain C epoll echo server, zcbench's second reference: non-blocking
 * sockets, one level-triggered epoll instance per thread, one read(2) per readiness into
 * the thread's buffer, the bytes checked (cref.h) and written straight back with one
 * write(2). What the socket does not take is kept for the connection, which then waits
 * for EPOLLOUT instead of EPOLLIN until it is all written (so replies keep their order
 * and a client that stops reading cannot make the server buffer without bound).
 */
#include "cref.h"

#include <sys/epoll.h>

#define READ_SIZE 65536
#define MAX_EVENTS 256

struct conn {
	int fd;
	int closed;
	uint8_t *pend; /* bytes read but not yet written back */
	size_t pend_len, pend_cap;
	struct verifier v;
};

struct server {
	int ep, live;
	struct conn *conns;
};

static void finish(struct server *s, struct worker *w, struct conn *c, int failed)
{
	if (!failed)
		verifier_close(&c->v);
	else
		w->resets++;
	w->frames += c->v.frames;
	w->bytes += c->v.bytes;
	close(c->fd); /* also leaves the epoll set */
	c->closed = 1;
	free(c->pend);
	c->pend = NULL;
	s->live--;
}

static void watch(struct server *s, struct conn *c, int ci, uint32_t events)
{
	struct epoll_event ev = {.events = events, .data.u32 = (uint32_t)ci};
	if (epoll_ctl(s->ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
		die("epoll_ctl MOD");
}

/* send_back writes p (after anything pending); it returns -1 when the peer is gone. */
static int send_back(struct server *s, struct conn *c, int ci, const uint8_t *p, size_t n)
{
	ssize_t wr = 0;
	if (c->pend_len == 0) {
		do
			wr = write(c->fd, p, n);
		while (wr < 0 && errno == EINTR);
		if (wr < 0) {
			if (errno != EAGAIN)
				return -1;
			wr = 0;
		}
		if ((size_t)wr == n)
			return 0;
		watch(s, c, ci, EPOLLOUT);
	}
	size_t rest = n - (size_t)wr;
	if (c->pend_len + rest > c->pend_cap) {
		size_t cap = c->pend_cap ? c->pend_cap : 4096;
		while (cap < c->pend_len + rest)
			cap *= 2;
		uint8_t *np = realloc(c->pend, cap);
		if (!np)
			die("realloc");
		c->pend = np;
		c->pend_cap = cap;
	}
	memcpy(c->pend + c->pend_len, p + wr, rest);
	c->pend_len += rest;
	return 0;
}

/* flush writes pending bytes on EPOLLOUT; back to EPOLLIN when all are written. */
static int flush(struct server *s, struct conn *c, int ci)
{
	size_t off = 0;
	while (off < c->pend_len) {
		ssize_t wr = write(c->fd, c->pend + off, c->pend_len - off);
		if (wr < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				break;
			return -1;
		}
		off += (size_t)wr;
	}
	memmove(c->pend, c->pend + off, c->pend_len - off);
	c->pend_len -= off;
	if (c->pend_len == 0)
		watch(s, c, ci, EPOLLIN | EPOLLRDHUP);
	return 0;
}

static void *epoll_worker(struct worker *w)
{
	struct server *s = calloc(1, sizeof(*s));
	uint8_t *buf = malloc(READ_SIZE);
	if (!s || !buf)
		die("malloc");
	w->priv = s;
	s->ep = epoll_create1(EPOLL_CLOEXEC);
	if (s->ep < 0)
		die("epoll_create1");
	s->live = w->nfds;
	s->conns = calloc(w->nfds, sizeof(*s->conns));
	if (!s->conns)
		die("calloc");
	for (int i = 0; i < w->nfds; i++) {
		struct conn *c = &s->conns[i];
		c->fd = w->fds[i];
		verifier_init(&c->v, w->o);
		struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u32 = (uint32_t)i};
		if (epoll_ctl(s->ep, EPOLL_CTL_ADD, c->fd, &ev) < 0)
			die("epoll_ctl ADD");
	}
	struct epoll_event evs[MAX_EVENTS];
	while (s->live > 0) {
		int n = epoll_wait(s->ep, evs, MAX_EVENTS, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("epoll_wait");
		}
		for (int e = 0; e < n; e++) {
			int ci = (int)evs[e].data.u32;
			struct conn *c = &s->conns[ci];
			if (c->closed)
				continue;
			if (c->pend_len > 0) {
				/* waiting for room: EPOLLOUT (or an error/hangup) */
				if (flush(s, c, ci) < 0)
					finish(s, w, c, 1);
				continue;
			}
			ssize_t rd;
			do
				rd = read(c->fd, buf, READ_SIZE);
			while (rd < 0 && errno == EINTR);
			if (rd > 0) {
				window_start();
				verify(&c->v, buf, (size_t)rd);
				if (send_back(s, c, ci, buf, (size_t)rd) < 0)
					finish(s, w, c, 1);
			} else if (rd == 0) {
				finish(s, w, c, 0); /* EOF, everything echoed */
			} else if (errno != EAGAIN) {
				finish(s, w, c, 1); /* ECONNRESET and friends */
			}
		}
	}
	free(buf);
	return NULL;
}

static void epoll_teardown(struct worker *w)
{
	struct server *s = w->priv;
	if (!s)
		return;
	close(s->ep);
	free(s->conns);
	free(s);
}

static const char *describe(void) { return "epoll-level-triggered"; }

int main(int argc, char **argv)
{
	return serve_main(argc, argv, 1, epoll_worker, epoll_teardown, describe);
}
