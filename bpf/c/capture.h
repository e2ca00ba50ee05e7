/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * capture.h - types shared by the zcnet capture programs (capture.bpf.c)
 * and, through bpf2go, by the Go package github.com/zcnet/zcnet/bpf/capture.
 * This header is the single source of truth for the ring-buffer record and
 * the maps' values; bpf/capture/layout_test.go checks the Go side against
 * it. The flow key is zcnet.h's struct flow_key (same encoding as the
 * steering tables: remote = the peer, ports in host order, IPv4 mapped).
 */
#ifndef ZCNET_CAPTURE_H
#define ZCNET_CAPTURE_H

#include <linux/types.h>

/* Most bytes copied from one packet (tcpdump's -s). The ring-buffer
 * reservation must have a size the verifier knows, so a packet is copied
 * into the smallest of a fixed set of record sizes (128 .. CAP_MAX_SNAP
 * bytes) that holds min(packet length, snap). 256 KiB is tcpdump's default
 * snap length and the largest packet Wireshark reads; it holds every frame
 * without BIG TCP (at most 14 + 4 + 40 + 65535 bytes) and BIG TCP packets
 * up to 256 KiB (lo on Linux 6.18 sends IPv4 GSO packets of ~95 KiB).
 * Longer packets are truncated and counted. */
#define CAP_MAX_SNAP 262144

/* Hook a record was taken at (cap_record.hook). */
#define CAP_HOOK_TC_INGRESS 1 /* tcx ingress: after XDP and GRO, before the stack */
#define CAP_HOOK_TC_EGRESS 2  /* tcx egress: after the stack, GSO packets unsplit */
#define CAP_HOOK_XDP 3        /* fexit of the interface's XDP program */

/* cap_record.flags */
#define CAP_F_TRUNCATED 1u /* caplen < len (snap length or CAP_MAX_SNAP) */

/*
 * cap_record: the header of every ring-buffer record, followed by caplen
 * bytes of the packet from its link-layer (Ethernet) header on. 48 bytes,
 * no implicit padding. Records can be longer than 48 + caplen (the record
 * size is rounded up to a size class); the bytes after caplen are garbage.
 */
struct cap_record {
	__u64 tstamp;   /* CLOCK_TAI ns, bpf_ktime_get_tai_ns() right after the
			 * reservation (so ring order and time order agree except
			 * for a race of a few instructions between CPUs) */
	__u64 hwtstamp; /* NIC hardware RX timestamp (skb_hwtstamps) when the
			 * driver set one (hardware RX timestamping enabled), else 0 */
	__u32 ifindex;  /* interface the hook ran for */
	__u32 len;      /* packet length at the hook (a GSO packet: all of it) */
	__u32 caplen;   /* bytes of the packet that follow this header */
	__u32 queue;    /* tc: skb->queue_mapping (0 = none recorded, else
			 * queue + 1); xdp: rx_queue_index + 1 */
	__u32 drops;    /* packets of this interface the program could not
			 * record on this CPU (ring full) since its previous
			 * record on this CPU and interface */
	__u32 cpu;      /* CPU the hook ran on */
	__u8 hook;      /* CAP_HOOK_* */
	__u8 verdict;   /* CAP_HOOK_XDP: the XDP program's action; else 0 */
	__u16 flags;    /* CAP_F_* */
	__u32 pad;      /* zero */
};

/* cap_config: the single entry of cap_settings. Written only by Go. */
struct cap_config {
	__u32 snap;   /* 1 .. CAP_MAX_SNAP; 0 = capture nothing */
	__u32 kinds;  /* CAP_K_* bits: which kinds of cap_flows entries exist,
		       * so a packet is looked up only for kinds that can match */
	__u32 wakeup; /* wake the reader only once this many bytes wait in the
		       * ring (it also polls on a timer): one wakeup per packet
		       * would cost more than the capture itself */
	__u32 pad;
};

/* Kinds of cap_flows entries, looked up in this order. */
#define CAP_K_EXACT 1u  /* the 4-tuple */
#define CAP_K_PEER 2u   /* remote port 0: every port of that peer */
#define CAP_K_LOCAL 4u  /* remote zero: every flow of a local address + port (a listener) */
#define CAP_K_PORT 8u   /* remote and local address zero: every flow of a local port */

/* cap_ifstats: per interface (key: ifindex), per CPU counters. Go creates
 * an entry for every interface it attaches to; packets on others are not
 * recorded. */
struct cap_ifstats {
	__u64 matched;   /* packets of the selected flows seen */
	__u64 captured;  /* of those, written to the ring */
	__u64 dropped;   /* of those, lost because the ring was full */
	__u64 truncated; /* captured with caplen < len */
	__u64 pending;   /* drops not yet reported in a record's drops field */
};

#endif /* ZCNET_CAPTURE_H */
