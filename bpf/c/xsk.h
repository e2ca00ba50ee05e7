/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * xsk.h - types shared by the raw-queue steering program (xsk.bpf.c) and, through bpf2go,
 * by the Go package github.com/zcnet/zcnet/bpf (RawSteering). Single source of truth: the
 * Go structs are generated from it (bpf2go -type) and their sizes checked by the tests.
 *
 * Byte order: addresses and MACs as on the wire; ports, the VNI and the flow label in host
 * order. An IPv4 address is stored as an IPv4-mapped IPv6 address (::ffff:a.b.c.d).
 */
#ifndef ZCNET_XSK_H
#define ZCNET_XSK_H

#include <linux/types.h>

/* Rules one program holds (bits of xsk_config.active). */
#define XSK_MAX_RULES 32
/* Queues the XSKMAP can name (key: the RX queue index a frame arrived on). */
#define XSK_MAX_QUEUES 64

/* xsk_rule.match: which fields a frame must equal. A rule with no bit set matches nothing
 * (the loader refuses it). */
#define XSK_M_DST_MAC (1u << 0)    /* Ethernet destination (a multicast MAC, say) */
#define XSK_M_SRC (1u << 1)        /* IPv4/IPv6 source address */
#define XSK_M_DST (1u << 2)        /* IPv4/IPv6 destination address (a group) */
#define XSK_M_PROTO (1u << 3)      /* IP protocol (after IPv6's fixed header only) */
#define XSK_M_SRC_PORT (1u << 4)   /* UDP/TCP source port */
#define XSK_M_DST_PORT (1u << 5)   /* UDP/TCP destination port */
#define XSK_M_DSCP (1u << 6)       /* DSCP: ToS / traffic class >> 2 */
#define XSK_M_FLOW_LABEL (1u << 7) /* IPv6 flow label (20 bits) */
#define XSK_M_VNI (1u << 8)        /* VXLAN network identifier (UDP port 4789, I flag set) */
#define XSK_M_IPV4 (1u << 9)       /* the frame is IPv4 */
#define XSK_M_IPV6 (1u << 10)      /* the frame is IPv6 */

/* xsk_rule: one slot of the rules array, 56 bytes, no implicit padding. Written by Go while
 * its bit in xsk_config.active is clear, so the program never reads a half-written rule. */
struct xsk_rule {
	__u32 match;      /* XSK_M_* bits */
	__u32 vni;        /* XSK_M_VNI: 24-bit VNI */
	__u8 dst_mac[6];  /* XSK_M_DST_MAC */
	__u8 proto;       /* XSK_M_PROTO: IPPROTO_UDP, IPPROTO_TCP, ... */
	__u8 dscp;        /* XSK_M_DSCP: 0..63 */
	__u8 src[16];     /* XSK_M_SRC */
	__u8 dst[16];     /* XSK_M_DST */
	__u16 src_port;   /* XSK_M_SRC_PORT, host order */
	__u16 dst_port;   /* XSK_M_DST_PORT, host order */
	__u32 flow_label; /* XSK_M_FLOW_LABEL: 20 bits */
};

/* xsk_config: the single entry of the config array. Written only by Go. */
struct xsk_config {
	__u64 active; /* bit i: rules[i] is in force; the lowest matching slot wins */
	__u32 flags;  /* XSK_F_* */
	__u32 pad;    /* zero */
};

/* xsk_config.flags */
#define XSK_F_META 1u /* ask the device for RX metadata (kfuncs) and put xsk_meta before the frame */

/* xsk_rule_stats: per rule, per CPU (PERCPU_ARRAY); Go sums the CPUs. */
struct xsk_rule_stats {
	__u64 packets;   /* frames that matched the rule and were redirected */
	__u64 bytes;     /* their bytes (Ethernet header included) */
	__u64 no_socket; /* matched, but no raw queue is bound to the RX queue: passed to the stack */
};

/* Global counters (PERCPU_ARRAY indexes). */
#define XSK_C_SEEN 0      /* frames the program ran on */
#define XSK_C_PASS 1      /* matched no rule: XDP_PASS to the kernel stack */
#define XSK_C_REDIRECT 2  /* redirected to a raw queue */
#define XSK_C_NO_SOCKET 3 /* matched a rule, no raw queue on that RX queue: XDP_PASS */
#define XSK_C_META_TS 4   /* RX timestamp read from the device */
#define XSK_C_META_HASH 5 /* RX hash read from the device */
#define XSK_COUNTERS 8

/* xsk_meta: written before the frame (bpf_xdp_adjust_meta) when XSK_F_META is set and the
 * device answered at least one kfunc. 24 bytes; flags say which fields hold values. */
struct xsk_meta {
	__u64 rx_timestamp; /* bpf_xdp_metadata_rx_timestamp, ns (device clock) */
	__u32 rx_hash;      /* bpf_xdp_metadata_rx_hash */
	__u32 rx_hash_type; /* enum xdp_rss_hash_type */
	__u32 flags;        /* XSK_META_* */
	__u32 magic;        /* XSK_META_MAGIC: the metadata was written by this program */
};

#define XSK_META_TIMESTAMP 1u
#define XSK_META_HASH 2u
#define XSK_META_MAGIC 0x7a63786du /* "zcxm" */

#endif
