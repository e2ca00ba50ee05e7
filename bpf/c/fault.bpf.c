// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * fault.bpf.c - a tc (tcx) fault injector for tests: drops (or corrupts) a
 * configurable fraction of the IP packets that match a protocol/port filter.
 * This kernel has no sch_netem, so reliability tests get their loss from here;
 * corruption flips bits of the last payload byte of a TCP segment, after TCP's
 * checksum was made (on loopback and veth the checksum is left to hardware that
 * is not there, so the receiver's TCP takes the segment): what a broken
 * middlebox or memory does, for the tests of an integrity check above TCP (TLS).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "zcnet.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define FAULT_TCX_NEXT -1 /* TCX_NEXT == TC_ACT_UNSPEC */
#define FAULT_TCX_DROP 2  /* TCX_DROP == TC_ACT_SHOT */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fault_config);
} fault_settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FAULT_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} fault_stats SEC(".maps");

static __always_inline void fcount(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&fault_stats, &idx);

	if (v)
		*v += 1;
}

SEC("tc")
int zc_fault(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct fault_config *cfg;
	__u16 *ports = 0;
	__u32 zero = 0;
	__u8 proto;

	cfg = bpf_map_lookup_elem(&fault_settings, &zero);
	if (!cfg || cfg->threshold == 0)
		return FAULT_TCX_NEXT;
	if ((void *)(eth + 1) > end)
		return FAULT_TCX_NEXT;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end || ip->ihl < 5)
			return FAULT_TCX_NEXT;
		proto = ip->protocol;
		if (!(ip->frag_off & bpf_htons(0x1fff)))
			ports = (void *)ip + ip->ihl * 4;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			return FAULT_TCX_NEXT;
		proto = ip6->nexthdr;
		ports = (void *)(ip6 + 1);
	} else {
		return FAULT_TCX_NEXT;
	}
	if (cfg->proto && proto != cfg->proto)
		return FAULT_TCX_NEXT;
	if (cfg->port) {
		if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
			return FAULT_TCX_NEXT;
		if (!ports || (void *)(ports + 2) > end)
			return FAULT_TCX_NEXT;
		if (bpf_ntohs(ports[0]) != cfg->port && bpf_ntohs(ports[1]) != cfg->port)
			return FAULT_TCX_NEXT;
	}
	if (cfg->action == FAULT_ACT_CORRUPT) {
		struct tcphdr *tcp = (void *)ports;
		__u32 start;
		__u8 b;

		if (proto != IPPROTO_TCP || !tcp || (void *)(tcp + 1) > end)
			return FAULT_TCX_NEXT;
		start = (__u32)((void *)tcp - data) + tcp->doff * 4;
		if (skb->len <= start)
			return FAULT_TCX_NEXT; /* no payload: nothing to corrupt */
		fcount(FAULT_SEEN);
		if (bpf_get_prandom_u32() >= cfg->threshold)
			return FAULT_TCX_NEXT;
		if (bpf_skb_load_bytes(skb, skb->len - 1, &b, 1))
			return FAULT_TCX_NEXT;
		b ^= 0x5a;
		if (bpf_skb_store_bytes(skb, skb->len - 1, &b, 1, 0))
			return FAULT_TCX_NEXT;
		fcount(FAULT_CORRUPTED);
		return FAULT_TCX_NEXT;
	}
	fcount(FAULT_SEEN);
	if (bpf_get_prandom_u32() < cfg->threshold) {
		fcount(FAULT_DROPPED);
		return FAULT_TCX_DROP;
	}
	return FAULT_TCX_NEXT;
}
