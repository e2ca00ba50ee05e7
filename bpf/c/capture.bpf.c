// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * capture.bpf.c - per-flow packet capture for zcnet. Separate programs,
 * attached beside the steering programs only while a capture runs, so a
 * flow pays nothing when nobody captures it:
 *
 *   zc_cap_ingress  tcx ingress (attached first: sees what arrived)
 *   zc_cap_egress   tcx egress (attached last: sees what leaves, after the
 *                   steering program chose its TX queue)
 *   zc_cap_xdp      fexit of the XDP program already attached to an
 *                   interface (zcnet's zc_xdp or any other): sees frames
 *                   before GRO, with their RX queue and the XDP verdict
 *
 * Packets of the selected flows (cap_flows, written by Go) are copied with
 * a kernel timestamp into the ring buffer cap_ring; see capture.h.
 * None of the programs changes a packet or its verdict.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "zcnet.h"
#include "capture.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* TCX_NEXT (== TC_ACT_UNSPEC): let the next program / the stack decide. */
#define CAP_TCX_NEXT -1

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cap_config);
} cap_settings SEC(".maps");

/* Selected flows; the value is unused (1). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct flow_key);
	__type(value, __u32);
} cap_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct cap_ifstats);
} cap_stats SEC(".maps");

/* max_entries (the ring's size in bytes) is set by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} cap_ring SEC(".maps");

static __always_inline void cap_v4mapped(__u8 *dst, __be32 a)
{
	__builtin_memset(dst, 0, 10);
	dst[10] = 0xff;
	dst[11] = 0xff;
	__builtin_memcpy(dst + 12, &a, 4);
}

/* Is the TCP packet whose addresses and ports are in k selected? k is
 * changed (wildcarded) on the way. */
static __always_inline int cap_selected(struct flow_key *k, __u32 kinds)
{
	if ((kinds & CAP_K_EXACT) && bpf_map_lookup_elem(&cap_flows, k))
		return 1;
	k->remote_port = 0;
	if ((kinds & CAP_K_PEER) && bpf_map_lookup_elem(&cap_flows, k))
		return 1;
	__builtin_memset(k->remote, 0, sizeof(k->remote));
	if ((kinds & CAP_K_LOCAL) && bpf_map_lookup_elem(&cap_flows, k))
		return 1;
	__builtin_memset(k->local, 0, sizeof(k->local));
	if ((kinds & CAP_K_PORT) && bpf_map_lookup_elem(&cap_flows, k))
		return 1;
	return 0;
}

/* Fills k from an IPv4/IPv6 TCP frame: hdr holds the frame's first bytes
 * (Ethernet + 40), ports the 4 bytes at the TCP header. ingress: remote =
 * source. Returns the TCP header's offset, or 0 when it is not TCP. */
struct cap_hdrs {
	struct ethhdr eth;
	union {
		struct iphdr ip;
		struct ipv6hdr ip6;
	};
} __attribute__((packed));

static __always_inline __u32 cap_l3(const struct cap_hdrs *h, struct flow_key *k, int ingress)
{
	if (h->eth.h_proto == bpf_htons(ETH_P_IP)) {
		if (h->ip.protocol != IPPROTO_TCP || h->ip.ihl < 5)
			return 0;
		if (h->ip.frag_off & bpf_htons(0x3fff)) /* fragment: no ports */
			return 0;
		cap_v4mapped(ingress ? k->remote : k->local, h->ip.saddr);
		cap_v4mapped(ingress ? k->local : k->remote, h->ip.daddr);
		return sizeof(struct ethhdr) + h->ip.ihl * 4;
	}
	if (h->eth.h_proto == bpf_htons(ETH_P_IPV6)) {
		/* Extension headers are not followed (as in steering). */
		if (h->ip6.nexthdr != IPPROTO_TCP)
			return 0;
		__builtin_memcpy(ingress ? k->remote : k->local, &h->ip6.saddr, 16);
		__builtin_memcpy(ingress ? k->local : k->remote, &h->ip6.daddr, 16);
		return sizeof(struct ethhdr) + sizeof(struct ipv6hdr);
	}
	return 0;
}

static __always_inline void cap_ports(struct flow_key *k, const __u16 *ports, int ingress)
{
	__u16 sport = bpf_ntohs(ports[0]), dport = bpf_ntohs(ports[1]);

	k->remote_port = ingress ? sport : dport;
	k->local_port = ingress ? dport : sport;
	k->proto = IPPROTO_TCP;
}

static __always_inline struct cap_config *cap_config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cap_settings, &zero);
}

/* Header fields common to every hook, written right after the reservation;
 * the caller fills in the rest. Not inlined: as a BPF-to-BPF call its
 * signature carries struct cap_record into the object's BTF, from which
 * bpf2go generates the Go struct. */
static __attribute__((noinline)) void cap_head(struct cap_record *h, struct cap_ifstats *st, __u32 len,
					       __u32 cap, __u32 hook)
{
	h->tstamp = bpf_ktime_get_tai_ns();
	h->hwtstamp = 0;
	h->len = len;
	h->caplen = cap;
	h->queue = 0;
	h->drops = st->pending;
	h->cpu = bpf_get_smp_processor_id();
	h->hook = hook;
	h->verdict = 0;
	h->flags = cap < len ? CAP_F_TRUNCATED : 0;
	h->pad = 0;
	st->pending = 0;
}

static __always_inline void cap_full(struct cap_ifstats *st)
{
	st->dropped++;
	st->pending++;
}

/* Submit flags: wake the reader only when enough has piled up. */
static __always_inline __u64 cap_wakeup(const struct cap_config *cfg)
{
	return bpf_ringbuf_query(&cap_ring, BPF_RB_AVAIL_DATA) >= cfg->wakeup ? BPF_RB_FORCE_WAKEUP
									      : BPF_RB_NO_WAKEUP;
}

static __always_inline void cap_done(struct cap_ifstats *st, __u32 cap, __u32 len)
{
	st->captured++;
	if (cap < len)
		st->truncated++;
}

/* cap, which the caller checked to be in 1..n, in a form the verifier can
 * see is in 1..n: the empty asm hides the earlier checks from clang, so it
 * cannot drop these (it would otherwise pass a copy of cap whose bounds the
 * verifier never saw). */
static __always_inline __u64 cap_bound(__u64 cap, __u64 n)
{
	/* 64-bit, so no zero-extension puts the check on another register. */
	asm volatile("" : "+r"(cap));
	if (cap > n)
		cap = n;
	if (cap < 1)
		cap = 1;
	return cap;
}

/* ---------------------------------------------------------------------- */
/* tc                                                                     */

/* One size class of the ring record: reserve header + N bytes (a constant,
 * as bpf_ringbuf_reserve requires), copy cap <= N bytes of the skb. */
#define CAP_SKB_CLASS(N)                                                                    \
	if (cap <= N) {                                                                     \
		struct {                                                                    \
			struct cap_record h;                                                \
			__u8 d[N];                                                          \
		} *r = bpf_ringbuf_reserve(&cap_ring, sizeof(*r), 0);                       \
		if (!r) {                                                                   \
			cap_full(st);                                                       \
			return;                                                             \
		}                                                                           \
		cap_head(&r->h, st, len, cap, hook);                                        \
		r->h.ifindex = skb->ifindex;                                                \
		r->h.hwtstamp = skb->hwtstamp;                                              \
		r->h.queue = skb->queue_mapping;                                            \
		if (bpf_skb_load_bytes(skb, 0, r->d, cap_bound(cap, N))) {                  \
			bpf_ringbuf_discard(r, BPF_RB_NO_WAKEUP);                           \
			cap_full(st);                                                       \
			return;                                                             \
		}                                                                           \
		bpf_ringbuf_submit(r, cap_wakeup(cfg));                                     \
		cap_done(st, cap, len);                                                     \
		return;                                                                     \
	}

static __always_inline void cap_skb_emit(struct __sk_buff *skb, struct cap_ifstats *st,
					 const struct cap_config *cfg, __u8 hook)
{
	__u32 len = skb->len, cap = len;

	if (cap > cfg->snap)
		cap = cfg->snap;
	if (cap < 1 || cap > CAP_MAX_SNAP)
		return;
	CAP_SKB_CLASS(128)
	CAP_SKB_CLASS(256)
	CAP_SKB_CLASS(512)
	CAP_SKB_CLASS(1024)
	CAP_SKB_CLASS(1536)
	CAP_SKB_CLASS(2048)
	CAP_SKB_CLASS(4096)
	CAP_SKB_CLASS(9216)
	CAP_SKB_CLASS(16384)
	CAP_SKB_CLASS(32768)
	CAP_SKB_CLASS(65600)
	CAP_SKB_CLASS(131072)
	CAP_SKB_CLASS(CAP_MAX_SNAP)
}

static __always_inline int cap_tc(struct __sk_buff *skb, int ingress)
{
	struct flow_key k = {};
	struct cap_config *cfg;
	struct cap_ifstats *st;
	struct cap_hdrs h;
	__u32 ifindex, off;
	__u16 ports[2];

	cfg = cap_config();
	if (!cfg || !cfg->snap)
		return CAP_TCX_NEXT;
	/* Headers through bpf_skb_load_bytes: works whether or not they are in
	 * the linear part, and never changes the skb. Short frames (ARP) fail. */
	if (bpf_skb_load_bytes(skb, 0, &h, sizeof(h)))
		return CAP_TCX_NEXT;
	off = cap_l3(&h, &k, ingress);
	if (!off || bpf_skb_load_bytes(skb, off, ports, sizeof(ports)))
		return CAP_TCX_NEXT;
	cap_ports(&k, ports, ingress);
	if (!cap_selected(&k, cfg->kinds))
		return CAP_TCX_NEXT;
	ifindex = skb->ifindex;
	st = bpf_map_lookup_elem(&cap_stats, &ifindex);
	if (!st)
		return CAP_TCX_NEXT;
	st->matched++;
	cap_skb_emit(skb, st, cfg, ingress ? CAP_HOOK_TC_INGRESS : CAP_HOOK_TC_EGRESS);
	return CAP_TCX_NEXT;
}

SEC("tc")
int zc_cap_ingress(struct __sk_buff *skb)
{
	return cap_tc(skb, 1);
}

SEC("tc")
int zc_cap_egress(struct __sk_buff *skb)
{
	return cap_tc(skb, 0);
}

/* ---------------------------------------------------------------------- */
/* XDP                                                                    */

/* One size class; COPY(dst, n) copies the first n bytes of the frame. */
#define CAP_XDP_CLASS(N, COPY)                                                              \
	if (cap <= N) {                                                                     \
		struct {                                                                    \
			struct cap_record h;                                                \
			__u8 d[N];                                                          \
		} *r = bpf_ringbuf_reserve(&cap_ring, sizeof(*r), 0);                       \
		if (!r) {                                                                   \
			cap_full(st);                                                       \
			return;                                                             \
		}                                                                           \
		cap_head(&r->h, st, len, cap, CAP_HOOK_XDP);                                \
		r->h.ifindex = ifindex;                                                     \
		r->h.queue = queue + 1;                                                     \
		r->h.verdict = verdict;                                                     \
		if (COPY(r->d, cap_bound(cap, N))) {                                        \
			bpf_ringbuf_discard(r, BPF_RB_NO_WAKEUP);                           \
			cap_full(st);                                                       \
			return;                                                             \
		}                                                                           \
		bpf_ringbuf_submit(r, cap_wakeup(cfg));                                     \
		cap_done(st, cap, len);                                                     \
		return;                                                                     \
	}

#define CAP_XDP_CLASSES(COPY)                \
	CAP_XDP_CLASS(128, COPY)             \
	CAP_XDP_CLASS(256, COPY)             \
	CAP_XDP_CLASS(512, COPY)             \
	CAP_XDP_CLASS(1024, COPY)            \
	CAP_XDP_CLASS(1536, COPY)            \
	CAP_XDP_CLASS(2048, COPY)            \
	CAP_XDP_CLASS(4096, COPY)            \
	CAP_XDP_CLASS(9216, COPY)            \
	CAP_XDP_CLASS(16384, COPY)           \
	CAP_XDP_CLASS(32768, COPY)           \
	CAP_XDP_CLASS(65600, COPY)           \
	CAP_XDP_CLASS(131072, COPY)          \
	CAP_XDP_CLASS(CAP_MAX_SNAP, COPY)

/* Is the frame whose first bytes are in h (and ports) selected, on an
 * interface we count? Returns its counters, or NULL. */
static __always_inline struct cap_ifstats *cap_xdp_match(struct cap_config *cfg, const struct cap_hdrs *h,
							 const __u16 *ports, __u32 ifindex)
{
	struct flow_key k = {};
	struct cap_ifstats *st;

	if (!cap_l3(h, &k, 1))
		return 0;
	cap_ports(&k, ports, 1);
	if (!cap_selected(&k, cfg->kinds))
		return 0;
	st = bpf_map_lookup_elem(&cap_stats, &ifindex);
	if (st)
		st->matched++;
	return st;
}

/* zc_cap_xdp_pass: the capture's own XDP program, for interfaces without
 * one: records and passes every frame. */
#define CAP_COPY_XDP(dst, n) bpf_xdp_load_bytes(ctx, 0, dst, n)

static __always_inline void cap_xdp_own(struct xdp_md *ctx, struct cap_config *cfg)
{
	__u32 ifindex = ctx->ingress_ifindex, queue = ctx->rx_queue_index;
	/* Masked so the verifier knows the 64-bit register's bounds too. */
	__u32 len = bpf_xdp_get_buff_len(ctx) & 0x7fffffff, cap = len, off;
	struct cap_ifstats *st;
	__u8 verdict = XDP_PASS;
	struct cap_hdrs h;
	__u16 ports[2];

	if (bpf_xdp_load_bytes(ctx, 0, &h, sizeof(h)))
		return;
	off = sizeof(struct ethhdr) + (h.eth.h_proto == bpf_htons(ETH_P_IP) ? h.ip.ihl * 4 : sizeof(struct ipv6hdr));
	if (off > 255 || bpf_xdp_load_bytes(ctx, off, ports, sizeof(ports)))
		return;
	st = cap_xdp_match(cfg, &h, ports, ifindex);
	if (!st)
		return;
	if (cap > cfg->snap)
		cap = cfg->snap;
	if (cap < 1 || cap > CAP_MAX_SNAP)
		return;
	CAP_XDP_CLASSES(CAP_COPY_XDP)
}

SEC("xdp")
int zc_cap_xdp_pass(struct xdp_md *ctx)
{
	struct cap_config *cfg = cap_config();

	if (cfg && cfg->snap)
		cap_xdp_own(ctx, cfg);
	return XDP_PASS;
}

/* zc_cap_xdp: fexit of the XDP program already attached to an interface.
 * The kernel's structs, reduced to the fields read here; CO-RE relocations
 * (preserve_access_index) fix the offsets against the running kernel's BTF.
 * An fexit program on an XDP program gets its context as struct xdp_buff
 * and its return value (the verdict) as the second argument. */
struct net_device___cap {
	int ifindex;
} __attribute__((preserve_access_index));

struct xdp_rxq_info___cap {
	struct net_device___cap *dev;
	__u32 queue_index;
} __attribute__((preserve_access_index));

struct xdp_buff___cap {
	void *data;
	void *data_end;
	struct xdp_rxq_info___cap *rxq;
} __attribute__((preserve_access_index));

#define CAP_COPY_KERNEL(dst, n) bpf_probe_read_kernel(dst, n, data)

static __always_inline void cap_xdp_fexit(struct xdp_buff___cap *xdp, __u8 verdict, struct cap_config *cfg)
{
	void *data = xdp->data, *end = xdp->data_end;
	__u32 ifindex, queue, len, cap, off;
	struct cap_ifstats *st;
	struct cap_hdrs h;
	__u16 ports[2];

	if (end <= data)
		return;
	/* Only the linear part of a multi-buffer frame. */
	len = end - data;
	if (len < sizeof(h) || bpf_probe_read_kernel(&h, sizeof(h), data))
		return;
	off = sizeof(struct ethhdr) + (h.eth.h_proto == bpf_htons(ETH_P_IP) ? h.ip.ihl * 4 : sizeof(struct ipv6hdr));
	if (off + sizeof(ports) > len || bpf_probe_read_kernel(ports, sizeof(ports), data + off))
		return;
	ifindex = xdp->rxq->dev->ifindex;
	queue = xdp->rxq->queue_index;
	st = cap_xdp_match(cfg, &h, ports, ifindex);
	if (!st)
		return;
	cap = len;
	if (cap > cfg->snap)
		cap = cfg->snap;
	if (cap < 1 || cap > CAP_MAX_SNAP)
		return;
	CAP_XDP_CLASSES(CAP_COPY_KERNEL)
}

/* The attach target (the XDP program and its function name) is set by the
 * loader; "zc_xdp" is zcnet's steering program. */
SEC("fexit/zc_xdp")
int zc_cap_xdp(__u64 *ctx)
{
	struct cap_config *cfg = cap_config();

	if (cfg && cfg->snap)
		cap_xdp_fexit((void *)ctx[0], (__u8)ctx[1], cfg);
	return 0;
}
