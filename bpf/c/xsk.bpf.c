// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * xsk.bpf.c - steering to raw queues (AF_XDP sockets). A frame that matches one of the rules
 * in force is redirected to the raw queue bound to the RX queue it arrived on (the XSKMAP
 * entry at ctx->rx_queue_index); every other frame, and a matching frame on a queue with no
 * raw queue, goes to the kernel stack untouched (XDP_PASS).
 *
 *   zc_xsk       XDP: the rules, no RX metadata
 *   zc_xsk_meta  XDP, loaded device-bound: the same rules, and before a redirected frame the
 *                device's RX timestamp and RX hash (XDP RX metadata kfuncs) in struct xsk_meta
 *
 * Parsing: Ethernet, one 802.1Q/802.1ad tag, IPv4 (fragments after the first: no ports) or
 * IPv6 (fixed header only: extension headers are not walked, the protocol is the next header
 * field), UDP or TCP ports, and VXLAN's VNI on UDP port 4789.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "xsk.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define VXLAN_PORT 4789

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, XSK_MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsk_sockets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XSK_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xsk_rule);
} xsk_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xsk_config);
} xsk_settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XSK_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xsk_rule_stats);
} xsk_rule_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XSK_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} xsk_counters SEC(".maps");

extern int bpf_xdp_metadata_rx_timestamp(const struct xdp_md *ctx, __u64 *timestamp) __ksym;
/* The kernel's enum (include/net/xdp.h, not in the uapi headers): only its name and size
 * matter to the kfunc's BTF check. */
enum xdp_rss_hash_type { XDP_RSS_TYPE_NONE = 0 };
extern int bpf_xdp_metadata_rx_hash(const struct xdp_md *ctx, __u32 *hash, enum xdp_rss_hash_type *rss_type) __ksym;

/* What the parser found in a frame. */
struct pkt {
	__u32 have; /* XSK_M_* bits for the fields below that hold values */
	__u32 vni;
	__u8 dst_mac[6];
	__u8 proto;
	__u8 dscp;
	__u8 src[16];
	__u8 dst[16];
	__u16 src_port;
	__u16 dst_port;
	__u32 flow_label;
};

static __always_inline void count(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&xsk_counters, &idx);
	if (c)
		(*c)++;
}

static __always_inline void v4mapped(__u8 *dst, __be32 a)
{
	__builtin_memset(dst, 0, 10);
	dst[10] = 0xff;
	dst[11] = 0xff;
	__builtin_memcpy(dst + 12, &a, 4);
}

static __always_inline void parse(struct xdp_md *ctx, struct pkt *p)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	void *l3;
	__u16 proto;
	__u8 l4proto;
	void *l4 = 0;

	if ((void *)(eth + 1) > end)
		return;
	__builtin_memcpy(p->dst_mac, eth->h_dest, 6);
	p->have |= XSK_M_DST_MAC;
	proto = eth->h_proto;
	l3 = eth + 1;
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		__be16 *tag = l3;
		if ((void *)(tag + 2) > end)
			return;
		proto = tag[1];
		l3 = tag + 2;
	}
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = l3;
		if ((void *)(ip + 1) > end || ip->ihl < 5)
			return;
		v4mapped(p->src, ip->saddr);
		v4mapped(p->dst, ip->daddr);
		p->dscp = ip->tos >> 2;
		p->proto = l4proto = ip->protocol;
		p->have |= XSK_M_SRC | XSK_M_DST | XSK_M_DSCP | XSK_M_PROTO | XSK_M_IPV4;
		if (ip->frag_off & bpf_htons(0x1fff))
			return; /* not the first fragment: no ports */
		l4 = (void *)ip + ip->ihl * 4;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = l3;
		__u8 *b = l3;
		if ((void *)(ip6 + 1) > end)
			return;
		__builtin_memcpy(p->src, &ip6->saddr, 16);
		__builtin_memcpy(p->dst, &ip6->daddr, 16);
		p->dscp = ((b[0] & 0x0f) << 2) | (b[1] >> 6);
		p->flow_label = ((__u32)(b[1] & 0x0f) << 16) | ((__u32)b[2] << 8) | b[3];
		p->proto = l4proto = ip6->nexthdr;
		p->have |= XSK_M_SRC | XSK_M_DST | XSK_M_DSCP | XSK_M_PROTO | XSK_M_FLOW_LABEL | XSK_M_IPV6;
		l4 = ip6 + 1;
	} else {
		return;
	}
	if (l4proto != IPPROTO_UDP && l4proto != IPPROTO_TCP)
		return;
	{
		__be16 *ports = l4;
		if ((void *)(ports + 2) > end)
			return;
		p->src_port = bpf_ntohs(ports[0]);
		p->dst_port = bpf_ntohs(ports[1]);
		p->have |= XSK_M_SRC_PORT | XSK_M_DST_PORT;
	}
	if (l4proto == IPPROTO_UDP && p->dst_port == VXLAN_PORT) {
		__u8 *vx = l4 + sizeof(struct udphdr);
		if ((void *)(vx + 8) > end)
			return;
		if (vx[0] & 0x08) { /* I flag: the VNI is valid */
			p->vni = ((__u32)vx[4] << 16) | ((__u32)vx[5] << 8) | vx[6];
			p->have |= XSK_M_VNI;
		}
	}
}

static __always_inline int eq16(const __u8 *a, const __u8 *b)
{
	__u64 a0, a1, b0, b1;
	__builtin_memcpy(&a0, a, 8);
	__builtin_memcpy(&a1, a + 8, 8);
	__builtin_memcpy(&b0, b, 8);
	__builtin_memcpy(&b1, b + 8, 8);
	return a0 == b0 && a1 == b1;
}

static __always_inline int eq6(const __u8 *a, const __u8 *b)
{
	__u32 a0, b0;
	__u16 a1, b1;
	__builtin_memcpy(&a0, a, 4);
	__builtin_memcpy(&a1, a + 4, 2);
	__builtin_memcpy(&b0, b, 4);
	__builtin_memcpy(&b1, b + 4, 2);
	return a0 == b0 && a1 == b1;
}

static __always_inline int matches(const struct xsk_rule *r, const struct pkt *p)
{
	__u32 m = r->match;
	if (m == 0 || (m & p->have & ~(XSK_M_IPV4 | XSK_M_IPV6)) != (m & ~(XSK_M_IPV4 | XSK_M_IPV6)))
		return 0;
	if ((m & XSK_M_IPV4) && !(p->have & XSK_M_IPV4))
		return 0;
	if ((m & XSK_M_IPV6) && !(p->have & XSK_M_IPV6))
		return 0;
	if ((m & XSK_M_DST_MAC) && !eq6(r->dst_mac, p->dst_mac))
		return 0;
	if ((m & XSK_M_SRC) && !eq16(r->src, p->src))
		return 0;
	if ((m & XSK_M_DST) && !eq16(r->dst, p->dst))
		return 0;
	if ((m & XSK_M_PROTO) && r->proto != p->proto)
		return 0;
	if ((m & XSK_M_SRC_PORT) && r->src_port != p->src_port)
		return 0;
	if ((m & XSK_M_DST_PORT) && r->dst_port != p->dst_port)
		return 0;
	if ((m & XSK_M_DSCP) && r->dscp != p->dscp)
		return 0;
	if ((m & XSK_M_FLOW_LABEL) && r->flow_label != p->flow_label)
		return 0;
	if ((m & XSK_M_VNI) && r->vni != p->vni)
		return 0;
	return 1;
}

/* put_meta copies m before the frame (bpf_xdp_adjust_meta). A subprogram of its own, so
 * that struct xsk_meta stays in the object's BTF for the Go bindings. */
static __noinline int put_meta(struct xdp_md *ctx, struct xsk_meta *m)
{
	void *meta, *data;

	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct xsk_meta)) != 0)
		return 0;
	meta = (void *)(long)ctx->data_meta;
	data = (void *)(long)ctx->data;
	if (meta + sizeof(struct xsk_meta) > data)
		return 0;
	__builtin_memcpy(meta, m, sizeof(*m));
	return 1;
}

/* rx_meta writes struct xsk_meta before the frame with what the device answers. */
static __always_inline void rx_meta(struct xdp_md *ctx)
{
	struct xsk_meta m = {};
	__u64 ts = 0;
	__u32 hash = 0;
	enum xdp_rss_hash_type type = XDP_RSS_TYPE_NONE;

	if (bpf_xdp_metadata_rx_timestamp(ctx, &ts) == 0) {
		m.rx_timestamp = ts;
		m.flags |= XSK_META_TIMESTAMP;
		count(XSK_C_META_TS);
	}
	if (bpf_xdp_metadata_rx_hash(ctx, &hash, &type) == 0) {
		m.rx_hash = hash;
		m.rx_hash_type = type;
		m.flags |= XSK_META_HASH;
		count(XSK_C_META_HASH);
	}
	if (!m.flags)
		return;
	m.magic = XSK_META_MAGIC;
	put_meta(ctx, &m);
}

static __always_inline int steer(struct xdp_md *ctx, int want_meta)
{
	struct pkt p = {};
	__u32 zero = 0;
	struct xsk_config *cfg;
	__u64 active;
	__u32 len = ctx->data_end - ctx->data;
	__u32 rxq = ctx->rx_queue_index;

	count(XSK_C_SEEN);
	cfg = bpf_map_lookup_elem(&xsk_settings, &zero);
	if (!cfg || !cfg->active) {
		count(XSK_C_PASS);
		return XDP_PASS;
	}
	active = cfg->active;
	parse(ctx, &p);
	for (__u32 i = 0; i < XSK_MAX_RULES; i++) {
		struct xsk_rule *r;
		struct xsk_rule_stats *st;
		__u32 key = i;
		if (!(active & (1ull << i)))
			continue;
		r = bpf_map_lookup_elem(&xsk_rules, &key);
		if (!r || !matches(r, &p))
			continue;
		st = bpf_map_lookup_elem(&xsk_rule_counters, &key);
		if (!bpf_map_lookup_elem(&xsk_sockets, &rxq)) {
			if (st)
				st->no_socket++;
			count(XSK_C_NO_SOCKET);
			return XDP_PASS;
		}
		if (st) {
			st->packets++;
			st->bytes += len;
		}
		if (want_meta && (cfg->flags & XSK_F_META))
			rx_meta(ctx);
		count(XSK_C_REDIRECT);
		return bpf_redirect_map(&xsk_sockets, rxq, XDP_PASS);
	}
	count(XSK_C_PASS);
	return XDP_PASS;
}

SEC("xdp")
int zc_xsk(struct xdp_md *ctx)
{
	return steer(ctx, 0);
}

SEC("xdp")
int zc_xsk_meta(struct xdp_md *ctx)
{
	return steer(ctx, 1);
}
