/*
 * cref.h: what the two C reference servers (uring.c, epoll.c) share: the command line,
 * the listener and the accept of every connection, the frame checker (the same checks as
 * bench/internal/frame's Verifier), the measured window and the result line, and the
 * worker threads.
 *
 * Protocol with zcbench (bench/internal/cref/cref.go):
 *   server -addr HOST:PORT -conns N -size BYTES -crc HEX [-threads T]
 *   stdout: "READY host:port" once listening; "RESULT key=value ..." at the end.
 *   exit 0: every connection ended at a frame boundary; 3: a received byte was not where
 *   the stream says it must be (stderr says which); 1: a system call failed.
 *
 * The measured window opens at the first received byte (as zcbench's Meter does for the
 * Go servers) and closes when the last connection is closed, before the rings and epoll
 * instances are torn down. CPU is getrusage(RUSAGE_SELF): every thread of the process.
 */
#ifndef CREF_H
#define CREF_H

#define _GNU_SOURCE
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define FRAME_MAGIC 0x3142637au /* "zcB1" little-endian */
#define FRAME_HDR 16
#define FRAME_TRL 16
#define EXIT_CORRUPT 3

struct opts {
	char host[128];
	char port[16];
	int conns;
	int size;
	int threads;
	uint32_t crc; /* CRC-32C of the frame payload */
};

static void die(const char *what)
{
	fprintf(stderr, "cref: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void usage(void)
{
	fprintf(stderr, "usage: server -addr HOST:PORT -conns N -size BYTES -crc HEX [-threads T]\n");
	exit(2);
}

static void parse_opts(int argc, char **argv, struct opts *o)
{
	memset(o, 0, sizeof(*o));
	o->threads = 1;
	for (int i = 1; i + 1 < argc; i += 2) {
		const char *k = argv[i], *v = argv[i + 1];
		if (!strcmp(k, "-addr")) {
			const char *colon = strrchr(v, ':');
			if (!colon || (size_t)(colon - v) >= sizeof(o->host) || strlen(colon + 1) >= sizeof(o->port))
				usage();
			const char *h = v;
			size_t hl = colon - v;
			if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') { /* [::1]:port */
				h++;
				hl -= 2;
			}
			memcpy(o->host, h, hl);
			o->host[hl] = 0;
			strcpy(o->port, colon + 1);
		} else if (!strcmp(k, "-conns")) {
			o->conns = atoi(v);
		} else if (!strcmp(k, "-size")) {
			o->size = atoi(v);
		} else if (!strcmp(k, "-threads")) {
			o->threads = atoi(v);
		} else if (!strcmp(k, "-crc")) {
			o->crc = (uint32_t)strtoul(v, NULL, 16);
		} else {
			usage();
		}
	}
	if (!o->host[0] || o->conns < 1 || o->size < FRAME_HDR + FRAME_TRL || o->threads < 1)
		usage();
	if (o->threads > o->conns)
		o->threads = o->conns;
}

/* ---- CRC-32C (Castagnoli, reflected), as Go's hash/crc32 with crc32.Castagnoli ---- */

static uint32_t crc_table[256];
static int crc_hw;

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		crc_table[i] = c;
	}
#if defined(__x86_64__)
	__builtin_cpu_init();
	crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_update_hw(uint32_t r, const uint8_t *p, size_t n)
{
	uint64_t r64 = r;
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		r64 = __builtin_ia32_crc32di(r64, w);
		p += 8;
		n -= 8;
	}
	r = (uint32_t)r64;
	while (n--)
		r = __builtin_ia32_crc32qi(r, *p++);
	return r;
}
#endif

/* crc_update continues a raw (not inverted) CRC state r over p. */
static inline uint32_t crc_update(uint32_t r, const uint8_t *p, size_t n)
{
#if defined(__x86_64__)
	if (crc_hw)
		return crc_update_hw(r, p, n);
#endif
	while (n--)
		r = crc_table[(r ^ *p++) & 0xff] ^ (r >> 8);
	return r;
}

/* ---- the frame checker: bench/internal/frame's Verifier, byte for byte ---- */

struct verifier {
	uint32_t size, pos, raw, want;
	uint64_t seq, frames, bytes;
	uint8_t scratch[FRAME_HDR > FRAME_TRL ? FRAME_HDR : FRAME_TRL];
};

static inline uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static void corrupt(const struct verifier *v, const char *what, unsigned long long got, unsigned long long want)
{
	fprintf(stderr, "cref: payload check failed: frame %llu (size %u): %s %llx, want %llx\n",
		(unsigned long long)v->seq, v->size, what, got, want);
	exit(EXIT_CORRUPT);
}

static void verifier_init(struct verifier *v, const struct opts *o)
{
	memset(v, 0, sizeof(*v));
	v->size = (uint32_t)o->size;
	v->want = o->crc;
}

/* verify checks the next n bytes of the stream; it exits the process on a wrong byte. */
static void verify(struct verifier *v, const uint8_t *p, size_t n)
{
	const uint32_t pay_end = v->size - FRAME_TRL;
	while (n > 0) {
		if (v->pos < FRAME_HDR) {
			size_t k = FRAME_HDR - v->pos < n ? FRAME_HDR - v->pos : n;
			memcpy(v->scratch + v->pos, p, k);
			v->pos += k;
			p += k;
			n -= k;
			if (v->pos == FRAME_HDR) {
				if (le32(v->scratch) != FRAME_MAGIC)
					corrupt(v, "bad magic", le32(v->scratch), FRAME_MAGIC);
				if (le32(v->scratch + 4) != v->size)
					corrupt(v, "frame size", le32(v->scratch + 4), v->size);
				if (le64(v->scratch + 8) != v->seq)
					corrupt(v, "sequence", le64(v->scratch + 8), v->seq);
				v->raw = 0xffffffffu;
			}
		} else if (v->pos < pay_end) {
			size_t k = pay_end - v->pos < n ? pay_end - v->pos : n;
			v->raw = crc_update(v->raw, p, k);
			v->pos += k;
			p += k;
			n -= k;
		} else {
			uint32_t off = v->pos - pay_end;
			size_t k = FRAME_TRL - off < n ? FRAME_TRL - off : n;
			memcpy(v->scratch + off, p, k);
			v->pos += k;
			p += k;
			n -= k;
			if (v->pos == v->size) {
				uint32_t crc = ~v->raw;
				if (le64(v->scratch) != v->seq)
					corrupt(v, "trailer sequence", le64(v->scratch), v->seq);
				if (le32(v->scratch + 8) != v->want || crc != v->want)
					corrupt(v, "payload CRC-32C", crc, v->want);
				if (le32(v->scratch + 12) != FRAME_MAGIC)
					corrupt(v, "bad trailer magic", le32(v->scratch + 12), FRAME_MAGIC);
				v->seq++;
				v->frames++;
				v->bytes += v->size;
				v->pos = 0;
			}
		}
	}
}

/* verifier_close fails the run when the stream ended inside a frame (a clean EOF). */
static void verifier_close(const struct verifier *v)
{
	if (v->pos > 0)
		corrupt(v, "stream ended inside the frame at byte", v->pos, 0);
}

/* ---- the measured window ---- */

static atomic_int window_open;
static pthread_mutex_t window_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rusage ru0;
static struct timespec t0;

/* window_start opens the window at the first received byte (any thread; once). */
static inline void window_start(void)
{
	if (atomic_load_explicit(&window_open, memory_order_relaxed))
		return;
	pthread_mutex_lock(&window_mu);
	if (!atomic_load_explicit(&window_open, memory_order_relaxed)) {
		getrusage(RUSAGE_SELF, &ru0);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		atomic_store(&window_open, 1);
	}
	pthread_mutex_unlock(&window_mu);
}

static long long tv_us(struct timeval t) { return (long long)t.tv_sec * 1000000 + t.tv_usec; }

/* ---- listening, accepting ---- */

/* listen_on binds o->host:o->port (a numeric IPv4 or IPv6 address; port 0: any), prints
 * READY with the bound address and returns the listening socket. (inet_pton, not
 * getaddrinfo: the binary links statically for the bench kit.) */
static int listen_on(const struct opts *o)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	memset(&ss, 0, sizeof(ss));
	int port = atoi(o->port);
	struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
	if (inet_pton(AF_INET, o->host, &s4->sin_addr) == 1) {
		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)port);
		sl = sizeof(*s4);
	} else if (inet_pton(AF_INET6, o->host, &s6->sin6_addr) == 1) {
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)port);
		sl = sizeof(*s6);
	} else {
		fprintf(stderr, "cref: address %s: not a numeric IPv4 or IPv6 address\n", o->host);
		exit(1);
	}
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_TCP);
	if (fd < 0)
		die("socket");
	int one = 1;
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0)
		die("SO_REUSEADDR");
	if (bind(fd, (struct sockaddr *)&ss, sl) < 0)
		die("bind");
	if (listen(fd, 4096) < 0)
		die("listen");
	sl = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
		die("getsockname");
	char host[INET6_ADDRSTRLEN];
	if (ss.ss_family == AF_INET6) {
		inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
		printf("READY [%s]:%u\n", host, ntohs(s6->sin6_port));
	} else {
		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
		printf("READY %s:%u\n", host, ntohs(s4->sin_port));
	}
	fflush(stdout);
	return fd;
}

/* accept_all accepts o->conns connections (zcbench's clients dial them all before the
 * first request, and the Go servers accept them all first too), sets TCP_NODELAY on each
 * (every mode's rule) and closes the listener. */
static int *accept_all(int lfd, const struct opts *o, int nonblock)
{
	int *fds = calloc(o->conns, sizeof(int));
	if (!fds)
		die("calloc");
	for (int i = 0; i < o->conns; i++) {
		int fd;
		do
			fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0));
		while (fd < 0 && (errno == EINTR || errno == ECONNABORTED));
		if (fd < 0)
			die("accept");
		int one = 1;
		if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
			die("TCP_NODELAY");
		fds[i] = fd;
	}
	close(lfd);
	return fds;
}

/* ---- worker threads ---- */

struct worker {
	int id;
	const struct opts *o;
	int *fds;
	int nfds;
	/* results */
	uint64_t frames, bytes;
	long resets; /* connections that ended in an error (reset, broken pipe) */
	void *priv;  /* the server's teardown state, released after the window closes */
};

/* pin_thread pins the calling thread to the id-th CPU of the process's mask (a
 * multi-core server: one thread per CPU, as zc's queues and netpoll's pollers). */
static void pin_thread(int id)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return;
	int n = 0;
	for (int c = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, &set))
			continue;
		if (n++ == id) {
			cpu_set_t one;
			CPU_ZERO(&one);
			CPU_SET(c, &one);
			pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
			return;
		}
	}
}

static void *(*worker_fn)(struct worker *);
static void (*teardown_fn)(struct worker *);

static void *thread_main(void *arg)
{
	struct worker *w = arg;
	pin_thread(w->id);
	return worker_fn(w);
}

/* serve_main is each server's main: listen, accept, split the connections over
 * o.threads workers (connection i to worker i mod T), run them, print the result. */
static int serve_main(int argc, char **argv, int nonblock, void *(*fn)(struct worker *),
		      void (*teardown)(struct worker *), const char *(*describe)(void))
{
	struct opts o;
	parse_opts(argc, argv, &o);
	signal(SIGPIPE, SIG_IGN);
	crc_init();
	/* descriptors for every connection: the soft limit up to the hard one, as Go's runtime
	 * does for itself (os/exec hands children the original soft limit, often 1024) */
	struct rlimit nofile;
	if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
		nofile.rlim_cur = nofile.rlim_max;
		setrlimit(RLIMIT_NOFILE, &nofile);
	}
	worker_fn = fn;
	teardown_fn = teardown;
	int lfd = listen_on(&o);
	int *fds = accept_all(lfd, &o, nonblock);
	struct worker *ws = calloc(o.threads, sizeof(*ws));
	if (!ws)
		die("calloc");
	for (int t = 0; t < o.threads; t++) {
		ws[t].id = t;
		ws[t].o = &o;
		ws[t].fds = calloc(o.conns / o.threads + 1, sizeof(int));
		if (!ws[t].fds)
			die("calloc");
	}
	for (int i = 0; i < o.conns; i++) {
		struct worker *w = &ws[i % o.threads];
		w->fds[w->nfds++] = fds[i];
	}
	if (o.threads == 1) {
		fn(&ws[0]); /* one thread: the process's placement is the server's */
	} else {
		pthread_t *th = calloc(o.threads, sizeof(pthread_t));
		for (int t = 0; t < o.threads; t++)
			if ((errno = pthread_create(&th[t], NULL, thread_main, &ws[t])) != 0)
				die("pthread_create");
		for (int t = 0; t < o.threads; t++)
			pthread_join(th[t], NULL);
		free(th);
	}
	struct rusage ru1;
	struct timespec t1;
	getrusage(RUSAGE_SELF, &ru1);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	uint64_t frames = 0, bytes = 0;
	long resets = 0;
	for (int t = 0; t < o.threads; t++) {
		frames += ws[t].frames;
		bytes += ws[t].bytes;
		resets += ws[t].resets;
		if (teardown)
			teardown(&ws[t]);
	}
	long long wall = 0, user = 0, sys = 0;
	if (atomic_load(&window_open)) {
		wall = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
		user = tv_us(ru1.ru_utime) - tv_us(ru0.ru_utime);
		sys = tv_us(ru1.ru_stime) - tv_us(ru0.ru_stime);
	}
	printf("RESULT frames=%llu bytes=%llu wall_ns=%lld user_us=%lld sys_us=%lld resets=%ld threads=%d setup=%s\n",
	       (unsigned long long)frames, (unsigned long long)bytes, wall, user, sys, resets, o.threads, describe());
	fflush(stdout);
	return 0;
}

#endif
