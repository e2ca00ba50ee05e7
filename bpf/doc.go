// Package bpf holds zcnet's eBPF programs and their loader: they decide
// which queue owns each TCP flow, so that a flow's socket, its queue (one
// io_uring ring on one CPU) and its packets stay together.
//
// # Programs
//
// All programs share one flow table (explicit entries written from Go:
// 4-tuple -> queue, or peer address + local port -> queue) and one learned
// connection table (filled by sk_reuseport, emptied by sockops when a
// connection closes). The C sources are in c/; zcnet.h is the single source
// of truth for every struct the programs share with Go.
//
//   - zc_reuseport (SK_REUSEPORT, REUSEPORT_SOCKARRAY): picks the listener
//     of a new connection. Order: flow-table entry, then the policy (DSCP
//     class -> queue, receiving CPU -> queue), then the kernel's keyed hash
//     of the 4-tuple scaled onto the queues (not sport % N: ephemeral ports
//     are mostly even). Drained queues are passed over; with every queue
//     drained new connections are refused (RST). Records the choice in the learned table.
//   - zc_sockops (SOCK_OPS on a cgroup v2): on established connections
//     applies the congestion-control / TCP_NODELAY policy chosen by the
//     peer's address (longest prefix), keeps RTT and retransmit statistics
//     per connection, and removes closed connections from the tables.
//   - zc_xdp (XDP): redirects packets of known flows to their queue's CPU
//     through a cpumap (software RSS/aRFS); counts packets per RX queue.
//     zc_cpumap runs on the target CPU and counts what arrived there.
//   - zc_tc_egress (tcx egress): writes skb->queue_mapping = queue+1, which
//     selects TX queue `queue`. XPS configured on the device, or a TX queue
//     the socket has already cached, overrides it.
//   - zc_xsk (XDP, c/xsk.bpf.c, its own maps): steering to raw queues
//     (hwq.RawQueue, AF_XDP). RawSteering holds up to MaxRawRules rules
//     (destination MAC, IPv4/IPv6 source and destination, protocol, ports,
//     DSCP, IPv6 flow label, VXLAN VNI on UDP 4789), each with counters; the
//     lowest matching rule redirects the frame to the XSKMAP entry of the RX
//     queue it arrived on, everything else is XDP_PASS. Rules are added and
//     removed while traffic flows (a rule's slot is written before its bit
//     in the active mask is set). zc_xsk_meta is the device-bound variant
//     that also puts the device's RX timestamp and hash before the frame
//     (XDP RX metadata kfuncs). A rule with Join also holds the group's
//     IGMP/MLD membership through a kernel socket (a rule alone joins
//     nothing). XDPAuto attaches native mode except on veth, where a native
//     program turns off the peer's TSO/GSO (NativeXDPCostError): there it
//     attaches generic mode; RawSteering.Mode says which, Fallback why.
//   - zc_fault (tcx, tests only): drops a configurable fraction of packets
//     matching a protocol/port filter; see Fault.
//
// # Use from zc
//
// Create one listening socket per queue, all plain IPPROTO_TCP (Go 1.26's
// net.Listen makes MPTCP sockets, which cannot join a socket array: use
// golang.org/x/sys/unix or ListenConfig.SetMultipathTCP(false)) with
// SO_REUSEPORT on one address, then:
//
//	s, err := bpf.NewSteering(listenerFDs, &bpf.Options{Policy: bpf.PolicyCPU})
//	if err != nil {
//		// errors.Is(err, bpf.ErrPermission) / bpf.ErrNotSupported: fall back
//		// to the kernel's own reuseport hashing, and count that visibly.
//	}
//	defer s.Close()
//	s.SetFlow(key, queue)   // pin a flow (or a whole peer: remote port 0)
//	s.Drain(queue, true)    // graceful shutdown of one queue
//	q, learned, _ := s.Lookup(key) // where an accepted flow was placed
//	st, _ := s.Stats()
//
// For sockops, XDP and tc add AttachCgroup, AttachXDP (with SetQueueCPU)
// and AttachTCEgress. Probe reports ahead of time whether any of this can
// work in this process.
//
// # Lifecycle
//
// NewSteering duplicates the listener fds; the caller keeps its own. The
// program stays attached to the group until Close, which detaches
// everything the Steering attached (group, cgroups, interfaces), closes its
// maps and, unless Options.KeepPinned, removes pinned maps. Close is
// idempotent; later calls and all methods after it return an error
// matching ErrClosed. Only one Steering can own a listener group at a time.
// Interface indexes are resolved in the calling thread's network namespace.
//
// # Errors
//
// Every error is an *OpError naming the operation. Match causes with
// errors.Is: ErrPermission (no CAP_BPF / CAP_NET_ADMIN), ErrNotSupported
// (the kernel lacks a feature), ErrInvalid (bad argument: nothing was
// changed), ErrNotFound (no such entry), ErrClosed. The errno stays
// reachable through the chain. Only nil, ErrPermission and ErrNotSupported
// from Probe are conclusive about the machine.
//
// # Regenerating
//
// The compiled objects and bpf2go's Go bindings are committed, so building
// needs no clang. `make bpf` regenerates them (installing clang, llvm and
// libbpf-dev from Debian when missing) and `make bpf-check` verifies that
// the committed files match a fresh build.
package bpf
