/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * zcnet.h - types shared by the zcnet BPF programs and, through bpf2go, by
 * the Go package github.com/zcnet/zcnet/bpf. This header is the single
 * source of truth: the Go structs are generated from it (bpf2go -type) and
 * their sizes are checked by bpf/layout_test.go.
 *
 * Byte order: addresses are in network order (as on the wire), ports are in
 * host order. An IPv4 address is stored as an IPv4-mapped IPv6 address
 * (::ffff:a.b.c.d), so one key type serves both families.
 *
 * Direction: "remote" is the peer, "local" is this host, whichever way the
 * packet travels. Ingress programs (sk_reuseport, XDP) read remote from the
 * source fields; the egress program (tc) reads it from the destination.
 */
#ifndef ZCNET_H
#define ZCNET_H

#include <linux/types.h>

/* Most queues one steering set can address (bit positions in drained). */
#define ZC_MAX_QUEUES 64
/* Most CPUs the receive-CPU policy and the XDP cpumap can name. */
#define ZC_MAX_CPUS 256
/* Entries in the explicit flow table and the learned connection table. */
#define ZC_MAX_FLOWS 65536
/* Length of a congestion control name, including the terminating NUL. */
#define ZC_CC_NAME_LEN 16

/* flow_key: one TCP flow seen from this host. 40 bytes, no implicit padding. */
struct flow_key {
	__u8 remote[16];   /* peer address, network order, v4-mapped for IPv4 */
	__u8 local[16];    /* local address, same encoding */
	__u16 remote_port; /* host order; 0 in a table entry = any peer port */
	__u16 local_port;  /* host order */
	__u8 proto;        /* IPPROTO_TCP */
	__u8 pad[3];       /* must be zero */
};

/* Policy bits in config.policy. The flow table is always consulted first and
 * a hash of the 4-tuple is always the last resort. */
#define ZC_POLICY_DSCP 1u /* DSCP class -> queue (dscp_queue) */
#define ZC_POLICY_CPU 2u  /* receiving CPU -> queue (cpu_queue) */

/* config: the single entry of the config array. Written only by Go. */
struct config {
	__u32 nqueues; /* listeners in the group: queues 0..nqueues-1 */
	__u32 policy;  /* ZC_POLICY_* bits */
	__u64 drained; /* bit q set: queue q takes no new connections */
};

/* conn: an entry of the learned connection table (sk_reuseport writes it
 * for each new connection, sockops removes it when the connection closes). */
struct conn {
	__u32 queue;
	__u32 flags; /* ZC_CONN_* */
};

#define ZC_CONN_ESTABLISHED 1u /* sockops saw the handshake complete */

/* cc_key / cc_policy: the sockops policy, an LPM trie keyed by the remote
 * address (v4-mapped for IPv4, so an IPv4 /24 is prefixlen 96+24). */
struct cc_key {
	__u32 prefixlen;
	__u8 addr[16];
};

#define ZC_CC_SET_CC 1u   /* set congestion control to cc_policy.cc */
#define ZC_CC_NODELAY 2u  /* set TCP_NODELAY */

struct cc_policy {
	char cc[ZC_CC_NAME_LEN]; /* NUL-terminated algorithm name */
	__u32 flags;             /* ZC_CC_* */
	__u32 pad;
};

/* flow_stats: per-connection statistics kept by sockops while the connection
 * lives (deleted when it closes). */
struct flow_stats {
	__u32 queue;         /* queue the connection was steered to, or ~0 */
	__u32 srtt_us;       /* smoothed RTT from the last RTT callback */
	__u32 total_retrans; /* retransmitted segments so far */
	__u32 flags;         /* ZC_FS_* */
	__u64 rtt_samples;   /* RTT callbacks seen */
	__u64 retrans_events; /* retransmit callbacks seen */
};

#define ZC_FS_CC_SET 1u      /* congestion control was set by policy */
#define ZC_FS_CC_FAILED 2u   /* setting it failed (name unknown/not allowed) */
#define ZC_FS_NODELAY 4u     /* TCP_NODELAY was set */
#define ZC_FS_PASSIVE 8u     /* accepted connection (else connected) */

/* queue_stats: per queue, per CPU counters. */
struct queue_stats {
	__u64 steered;        /* new connections sk_reuseport sent to this queue */
	__u64 established;    /* connections sockops saw established here */
	__u64 closed;         /* connections sockops saw closed here */
	__u64 xdp_redirected; /* packets XDP redirected to this queue's CPU */
	__u64 tc_mapped;      /* packets tc egress put on this queue's TX queue */
	__u64 xdp_rxq;        /* packets XDP saw arrive on RX queue index == this */
	__u64 cpu_delivered;  /* packets the cpumap program ran for on CPU == this */
	__u64 pad;
};

/* Counter indexes of the stats per-CPU array. */
enum zc_counter {
	ZC_RP_FLOW = 0,    /* reuseport: chosen by a flow-table entry */
	ZC_RP_DSCP,        /* reuseport: chosen by DSCP policy */
	ZC_RP_CPU,         /* reuseport: chosen by receiving-CPU policy */
	ZC_RP_HASH,        /* reuseport: chosen by hash */
	ZC_RP_DRAIN_SKIP,  /* reuseport: a choice skipped because its queue is drained */
	ZC_RP_ALL_DRAINED, /* reuseport: SYN dropped, every queue drained */
	ZC_RP_NO_LISTENER, /* reuseport: chosen slot empty, kernel hash used */
	ZC_RP_BAD_PACKET,  /* reuseport: headers unreadable, kernel hash used */
	ZC_SO_ESTABLISHED, /* sockops: established callbacks */
	ZC_SO_CC_SET,      /* sockops: congestion control set */
	ZC_SO_CC_FAILED,   /* sockops: bpf_setsockopt(TCP_CONGESTION) failed */
	ZC_SO_NODELAY,     /* sockops: TCP_NODELAY set */
	ZC_SO_RTT,         /* sockops: RTT callbacks */
	ZC_SO_RETRANS,     /* sockops: retransmit callbacks */
	ZC_SO_CLOSED,      /* sockops: connections closed */
	ZC_XDP_PASS,       /* xdp: no flow entry or no CPU for its queue */
	ZC_XDP_REDIRECT,   /* xdp: redirected to a CPU */
	ZC_TC_MAPPED,      /* tc: queue_mapping written */
	ZC_TC_UNMAPPED,    /* tc: no flow entry */
	ZC_COUNTERS        /* number of counters */
};

/* fault_config: the single entry of the fault injector's config array. */
struct fault_config {
	__u32 threshold; /* act when bpf_get_prandom_u32() < threshold; 0 = off */
	__u16 port;      /* only packets with this TCP/UDP port (either side); 0 = any */
	__u8 proto;      /* only this IP protocol; 0 = any */
	__u8 action;     /* enum fault_action */
};

/* What the fault injector does to a packet it picks. */
enum fault_action {
	FAULT_ACT_DROP = 0,    /* drop it */
	FAULT_ACT_CORRUPT = 1, /* TCP with payload only: flip bits of its last payload byte */
};

/* Counter indexes of the fault injector's per-CPU array. */
enum fault_counter {
	FAULT_SEEN = 0,  /* packets that matched the filter (corrupt: TCP with payload) */
	FAULT_DROPPED,   /* of those, dropped */
	FAULT_CORRUPTED, /* of those, corrupted */
	FAULT_COUNTERS
};

#endif /* ZCNET_H */
