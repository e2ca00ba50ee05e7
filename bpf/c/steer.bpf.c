// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * steer.bpf.c - the zcnet steering programs. All of them share one flow
 * table (flows, written by Go) and one learned connection table (conns,
 * written by sk_reuseport, cleaned by sockops), so a flow's listener, its
 * receive CPU and its TX queue all follow the same queue number.
 *
 *   zc_reuseport  SK_REUSEPORT: pick the queue's listener for a new connection
 *   zc_sockops    SOCK_OPS (cgroup): per-flow cc / TCP_NODELAY, RTT+retrans stats
 *   zc_xdp        XDP: redirect a flow's packets to its queue's CPU (cpumap)
 *   zc_cpumap     XDP on the cpumap: counts the CPU that packets land on
 *   zc_tc_egress  tc (tcx) egress: skb->queue_mapping = queue + 1
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "zcnet.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Socket option numbers from linux/tcp.h, spelled out so no libc header is needed. */
#define ZC_SOL_TCP 6
#define ZC_TCP_NODELAY 1
#define ZC_TCP_CONGESTION 13
/* TCX_NEXT (== TC_ACT_UNSPEC): let the next program / the stack decide. */
#define ZC_TCX_NEXT -1

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ZC_MAX_FLOWS);
	__type(key, struct flow_key);
	__type(value, __u32);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, ZC_MAX_FLOWS);
	__type(key, struct flow_key);
	__type(value, struct conn);
} conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} settings SEC(".maps");

/* value: queue + 1, 0 = no entry */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ZC_MAX_CPUS);
	__type(key, __u32);
	__type(value, __u32);
} cpu_queue SEC(".maps");

/* value: queue + 1, 0 = no entry; key: DSCP (ToS >> 2) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} dscp_queue SEC(".maps");

/* value: CPU + 1 that XDP redirects the queue's packets to, 0 = none */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ZC_MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} queue_cpu SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
	__uint(max_entries, ZC_MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u64);
} sockets SEC(".maps");

/* max_entries is set to the number of possible CPUs by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_CPUMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bpf_cpumap_val);
} cpus SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cc_key);
	__type(value, struct cc_policy);
} cc_policies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, ZC_MAX_FLOWS);
	__type(key, struct flow_key);
	__type(value, struct flow_stats);
} flowstats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ZC_MAX_QUEUES);
	__type(key, __u32);
	__type(value, struct queue_stats);
} queuestats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ZC_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);

	if (v)
		*v += 1;
}

static __always_inline struct queue_stats *qstats(__u32 q)
{
	return bpf_map_lookup_elem(&queuestats, &q);
}

static __always_inline struct config *get_config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&settings, &zero);
}

static __always_inline int drained(const struct config *cfg, __u32 q)
{
	return q < 64 && (cfg->drained >> q) & 1;
}

static __always_inline void v4mapped(__u8 *dst, __be32 a)
{
	__builtin_memset(dst, 0, 10);
	dst[10] = 0xff;
	dst[11] = 0xff;
	__builtin_memcpy(dst + 12, &a, 4);
}

/* Count of trailing zero bits of a non-zero x (no loop for the verifier). */
static __always_inline __u32 ctz64(__u64 x)
{
	__u32 n = 0;

	if (!(x & 0xffffffffull)) {
		n += 32;
		x >>= 32;
	}
	if (!(x & 0xffff)) {
		n += 16;
		x >>= 16;
	}
	if (!(x & 0xff)) {
		n += 8;
		x >>= 8;
	}
	if (!(x & 0xf)) {
		n += 4;
		x >>= 4;
	}
	if (!(x & 0x3)) {
		n += 2;
		x >>= 2;
	}
	if (!(x & 0x1))
		n += 1;
	return n;
}

/* Explicit entry for this exact flow, else for any port of this peer. */
static __always_inline __u32 *lookup_flow(struct flow_key *k)
{
	__u32 *q = bpf_map_lookup_elem(&flows, k);
	__u16 port;

	if (q)
		return q;
	port = k->remote_port;
	k->remote_port = 0;
	q = bpf_map_lookup_elem(&flows, k);
	k->remote_port = port;
	return q;
}

/* Queue for packets of an existing flow: explicit entry, then learned one.
 * Returns -1 when the flow is unknown. */
static __always_inline int flow_queue(struct flow_key *k)
{
	__u32 *q = lookup_flow(k);
	struct conn *c;

	if (q)
		return *q;
	c = bpf_map_lookup_elem(&conns, k);
	if (c)
		return c->queue;
	return -1;
}

/* ---------------------------------------------------------------------- */
/* sk_reuseport                                                           */

static __always_inline int reuseport_key(struct sk_reuseport_md *md, struct flow_key *k, __u8 *dscp)
{
	__u16 ports[2];

	if (md->eth_protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes_relative(md, 0, &ip, sizeof(ip), BPF_HDR_START_NET))
			return -1;
		v4mapped(k->remote, ip.saddr);
		v4mapped(k->local, ip.daddr);
		*dscp = ip.tos >> 2;
	} else if (md->eth_protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes_relative(md, 0, &ip6, sizeof(ip6), BPF_HDR_START_NET))
			return -1;
		__builtin_memcpy(k->remote, &ip6.saddr, 16);
		__builtin_memcpy(k->local, &ip6.daddr, 16);
		*dscp = ((ip6.priority << 4) | (ip6.flow_lbl[0] >> 4)) >> 2;
	} else {
		return -1;
	}
	/* md->data starts at the TCP header. */
	if (bpf_skb_load_bytes(md, 0, ports, sizeof(ports)))
		return -1;
	k->remote_port = bpf_ntohs(ports[0]);
	k->local_port = bpf_ntohs(ports[1]);
	k->proto = md->ip_protocol;
	return 0;
}

SEC("sk_reuseport")
int zc_reuseport(struct sk_reuseport_md *md)
{
	struct flow_key k = {};
	struct config *cfg;
	struct queue_stats *qs;
	struct conn c = {};
	__u32 n, q, *v, cpu, dscp32;
	__u64 avail;
	__u8 dscp = 0;
	int why = -1;

	cfg = get_config();
	if (!cfg || cfg->nqueues == 0)
		return SK_PASS;
	n = cfg->nqueues;
	if (n > ZC_MAX_QUEUES)
		n = ZC_MAX_QUEUES;

	if (md->ip_protocol != IPPROTO_TCP || reuseport_key(md, &k, &dscp)) {
		count(ZC_RP_BAD_PACKET);
		return SK_PASS;
	}

	v = lookup_flow(&k);
	if (v && *v < n) {
		if (!drained(cfg, *v)) {
			q = *v;
			why = ZC_RP_FLOW;
		} else {
			count(ZC_RP_DRAIN_SKIP);
		}
	}
	if (why < 0 && (cfg->policy & ZC_POLICY_DSCP)) {
		dscp32 = dscp;
		v = bpf_map_lookup_elem(&dscp_queue, &dscp32);
		if (v && *v && *v - 1 < n) {
			if (!drained(cfg, *v - 1)) {
				q = *v - 1;
				why = ZC_RP_DSCP;
			} else {
				count(ZC_RP_DRAIN_SKIP);
			}
		}
	}
	if (why < 0 && (cfg->policy & ZC_POLICY_CPU)) {
		cpu = bpf_get_smp_processor_id();
		v = bpf_map_lookup_elem(&cpu_queue, &cpu);
		if (v && *v && *v - 1 < n) {
			if (!drained(cfg, *v - 1)) {
				q = *v - 1;
				why = ZC_RP_CPU;
			} else {
				count(ZC_RP_DRAIN_SKIP);
			}
		}
	}
	if (why < 0) {
		/* md->hash is the kernel's keyed hash of the 4-tuple: uniform even
		 * though ephemeral ports are mostly even. Scale it onto 0..n-1 and
		 * probe forward past drained queues. */
		q = (__u32)(((__u64)md->hash * n) >> 32);
		avail = ~cfg->drained;
		if (n < 64)
			avail &= (1ull << n) - 1;
		if (!avail) {
			count(ZC_RP_ALL_DRAINED);
			return SK_DROP;
		}
		if (q > 63)
			q = 0;
		if (!((avail >> q) & 1)) {
			/* next queue up from q that is not drained, wrapping */
			count(ZC_RP_DRAIN_SKIP);
			if (avail >> q)
				q += ctz64(avail >> q);
			else
				q = ctz64(avail);
		}
		why = ZC_RP_HASH;
	}

	if (bpf_sk_select_reuseport(md, &sockets, &q, 0)) {
		count(ZC_RP_NO_LISTENER);
		return SK_PASS;
	}
	count(why);
	qs = qstats(q);
	if (qs)
		qs->steered++;
	c.queue = q;
	bpf_map_update_elem(&conns, &k, &c, BPF_ANY);
	return SK_PASS;
}

/* ---------------------------------------------------------------------- */
/* sockops                                                                */

static __always_inline void sockops_key(struct bpf_sock_ops *skops, struct flow_key *k)
{
	if (skops->family == 2 /* AF_INET */) {
		v4mapped(k->remote, skops->remote_ip4);
		v4mapped(k->local, skops->local_ip4);
	} else {
		__u32 r[4], l[4];

		/* One 4-byte load each: the context allows no wider access. */

		r[0] = *(volatile __u32 *)&skops->remote_ip6[0];
		r[1] = *(volatile __u32 *)&skops->remote_ip6[1];
		r[2] = *(volatile __u32 *)&skops->remote_ip6[2];
		r[3] = *(volatile __u32 *)&skops->remote_ip6[3];
		l[0] = *(volatile __u32 *)&skops->local_ip6[0];
		l[1] = *(volatile __u32 *)&skops->local_ip6[1];
		l[2] = *(volatile __u32 *)&skops->local_ip6[2];
		l[3] = *(volatile __u32 *)&skops->local_ip6[3];
		__builtin_memcpy(k->remote, r, 16);
		__builtin_memcpy(k->local, l, 16);
	}
	k->remote_port = bpf_ntohl(skops->remote_port);
	k->local_port = skops->local_port;
	k->proto = IPPROTO_TCP;
}

static __always_inline void sockops_established(struct bpf_sock_ops *skops, int passive)
{
	struct flow_stats fs = {};
	struct flow_key k = {};
	struct cc_key ck = {};
	struct cc_policy *pol;
	struct queue_stats *qs;
	struct conn *c;
	int one = 1, q;

	if (skops->family != 2 && skops->family != 10)
		return;
	sockops_key(skops, &k);
	count(ZC_SO_ESTABLISHED);
	fs.queue = ~0u;
	if (passive) {
		fs.flags |= ZC_FS_PASSIVE;
		q = flow_queue(&k);
		if (q >= 0) {
			fs.queue = q;
			qs = qstats(q);
			if (qs)
				qs->established++;
		}
		c = bpf_map_lookup_elem(&conns, &k);
		if (c)
			c->flags |= ZC_CONN_ESTABLISHED;
	}

	ck.prefixlen = 128;
	__builtin_memcpy(ck.addr, k.remote, 16);
	pol = bpf_map_lookup_elem(&cc_policies, &ck);
	if (pol) {
		if (pol->flags & ZC_CC_SET_CC) {
			char name[ZC_CC_NAME_LEN];

			__builtin_memcpy(name, pol->cc, sizeof(name));
			name[ZC_CC_NAME_LEN - 1] = 0;
			if (bpf_setsockopt(skops, ZC_SOL_TCP, ZC_TCP_CONGESTION, name, sizeof(name)) == 0) {
				fs.flags |= ZC_FS_CC_SET;
				count(ZC_SO_CC_SET);
			} else {
				fs.flags |= ZC_FS_CC_FAILED;
				count(ZC_SO_CC_FAILED);
			}
		}
		if (pol->flags & ZC_CC_NODELAY) {
			if (bpf_setsockopt(skops, ZC_SOL_TCP, ZC_TCP_NODELAY, &one, sizeof(one)) == 0) {
				fs.flags |= ZC_FS_NODELAY;
				count(ZC_SO_NODELAY);
			}
		}
	}
	fs.srtt_us = skops->srtt_us >> 3;
	fs.total_retrans = skops->total_retrans;
	bpf_map_update_elem(&flowstats, &k, &fs, BPF_ANY);
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTT_CB_FLAG |
					     BPF_SOCK_OPS_RETRANS_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG);
}

SEC("sockops")
int zc_sockops(struct bpf_sock_ops *skops)
{
	struct flow_key k = {};
	struct flow_stats *fs;
	struct queue_stats *qs;

	switch (skops->op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		sockops_established(skops, 0);
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		sockops_established(skops, 1);
		break;
	case BPF_SOCK_OPS_RTT_CB:
		count(ZC_SO_RTT);
		sockops_key(skops, &k);
		fs = bpf_map_lookup_elem(&flowstats, &k);
		if (fs) {
			fs->srtt_us = skops->srtt_us >> 3;
			fs->rtt_samples++;
		}
		break;
	case BPF_SOCK_OPS_RETRANS_CB:
		count(ZC_SO_RETRANS);
		sockops_key(skops, &k);
		fs = bpf_map_lookup_elem(&flowstats, &k);
		if (fs) {
			fs->total_retrans = skops->total_retrans;
			fs->retrans_events++;
		}
		break;
	case BPF_SOCK_OPS_STATE_CB:
		if (skops->args[1] != BPF_TCP_CLOSE)
			break;
		count(ZC_SO_CLOSED);
		sockops_key(skops, &k);
		fs = bpf_map_lookup_elem(&flowstats, &k);
		if (fs && fs->queue < ZC_MAX_QUEUES) {
			qs = qstats(fs->queue);
			if (qs)
				qs->closed++;
		}
		bpf_map_delete_elem(&flowstats, &k);
		bpf_map_delete_elem(&conns, &k);
		break;
	}
	return 1;
}

/* ---------------------------------------------------------------------- */
/* XDP and tc: parse Ethernet + IPv4/IPv6 + TCP                            */

/* Fills k from a frame between data and end. ingress: remote = source.
 * Returns 0 for TCP, -1 otherwise. */
static __always_inline int frame_key(void *data, void *end, struct flow_key *k, int ingress)
{
	struct ethhdr *eth = data;
	struct tcphdr *th;
	__u16 sport, dport;

	if ((void *)(eth + 1) > end)
		return -1;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_TCP || ip->ihl < 5)
			return -1;
		if (ip->frag_off & bpf_htons(0x3fff)) /* fragment: no ports */
			return -1;
		th = (void *)ip + ip->ihl * 4;
		if ((void *)(th + 1) > end)
			return -1;
		if (ingress) {
			v4mapped(k->remote, ip->saddr);
			v4mapped(k->local, ip->daddr);
		} else {
			v4mapped(k->remote, ip->daddr);
			v4mapped(k->local, ip->saddr);
		}
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		/* Extension headers are not followed: such flows are not steered. */
		if ((void *)(ip6 + 1) > end || ip6->nexthdr != IPPROTO_TCP)
			return -1;
		th = (void *)(ip6 + 1);
		if ((void *)(th + 1) > end)
			return -1;
		if (ingress) {
			__builtin_memcpy(k->remote, &ip6->saddr, 16);
			__builtin_memcpy(k->local, &ip6->daddr, 16);
		} else {
			__builtin_memcpy(k->remote, &ip6->daddr, 16);
			__builtin_memcpy(k->local, &ip6->saddr, 16);
		}
	} else {
		return -1;
	}
	sport = bpf_ntohs(th->source);
	dport = bpf_ntohs(th->dest);
	k->remote_port = ingress ? sport : dport;
	k->local_port = ingress ? dport : sport;
	k->proto = IPPROTO_TCP;
	return 0;
}

SEC("xdp")
int zc_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct queue_stats *qs;
	struct flow_key k = {};
	__u32 rxq = ctx->rx_queue_index, q, *cpu;
	int fq;

	if (rxq < ZC_MAX_QUEUES) {
		qs = qstats(rxq);
		if (qs)
			qs->xdp_rxq++;
	}
	if (frame_key(data, end, &k, 1))
		goto pass;
	fq = flow_queue(&k);
	if (fq < 0 || fq >= ZC_MAX_QUEUES)
		goto pass;
	q = fq;
	cpu = bpf_map_lookup_elem(&queue_cpu, &q);
	if (!cpu || *cpu == 0)
		goto pass;
	qs = qstats(q);
	if (qs)
		qs->xdp_redirected++;
	count(ZC_XDP_REDIRECT);
	/* Lower bits of flags: the action when the CPU has no cpumap entry. */
	return bpf_redirect_map(&cpus, *cpu - 1, XDP_PASS);
pass:
	count(ZC_XDP_PASS);
	return XDP_PASS;
}

/* Runs on the destination CPU of a cpumap redirect, before the kernel builds
 * the skb: counts where packets were delivered. */
SEC("xdp/cpumap")
int zc_cpumap(struct xdp_md *ctx)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct queue_stats *qs;

	if (cpu < ZC_MAX_QUEUES) {
		qs = qstats(cpu);
		if (qs)
			qs->cpu_delivered++;
	}
	return XDP_PASS;
}

SEC("tc")
int zc_tc_egress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct queue_stats *qs;
	struct flow_key k = {};
	int q;

	if (frame_key(data, end, &k, 0))
		goto out;
	q = flow_queue(&k);
	if (q < 0 || q >= ZC_MAX_QUEUES) {
		count(ZC_TC_UNMAPPED);
		goto out;
	}
	/* queue_mapping = N + 1 asks for TX queue N (0 means "no choice");
	 * XPS on the device, or a TX queue the socket already cached, wins. */
	skb->queue_mapping = q + 1;
	qs = qstats(q);
	if (qs)
		qs->tc_mapped++;
	count(ZC_TC_MAPPED);
out:
	return ZC_TCX_NEXT;
}
