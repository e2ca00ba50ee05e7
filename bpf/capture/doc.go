// Package capture records the packets of chosen TCP flows from BPF
// programs next to zcnet's steering programs and writes them as pcapng,
// with kernel timestamps, the interface and the queue each packet was seen
// on.
//
// # What is captured, and where
//
// A capture selects flows with Selectors: Flow (a 4-tuple, or every flow
// between a peer and a local address+port when the peer's port is 0),
// Listener (every flow of a local address+port, or of a port on any local
// address), Steered (a bpf.Steering flow-table entry or learned
// connection). Flows are TCP over IPv4 or IPv6 (IPv6 extension headers
// are not followed), seen from this host as in package bpf: Remote is the
// peer, Local this host.
//
// It records at hooks (Options.Hooks) on the interfaces it is given:
//
//   - HookIngress: a tcx ingress program attached at the head of the
//     interface's chain: what the stack is about to receive (after XDP and
//     GRO).
//   - HookEgress: a tcx egress program attached at the tail, after zcnet's
//     steering program chose the TX queue: what the stack sends, GSO
//     packets unsplit.
//   - HookXDP: frames as the driver delivered them, with their RX queue and
//     the XDP verdict: through fexit on the interface's XDP program when it
//     has one (zcnet's zc_xdp or any other), else through the capture's own
//     XDP program, which passes every frame. Some kernels refuse fexit
//     programs even to root (this project's CI machine does: the error
//     matches ErrPermission); there, start the capture before the steering
//     XDP program is attached, or use HookIngress.
//
// The capture programs are separate from the steering programs and are
// attached only while a capture runs: when nothing is captured, packets
// pay nothing. Attaching and detaching does not disturb a flow (tcx and
// XDP links are swapped atomically; the programs never change a packet or
// its verdict).
//
// # Timestamps
//
// Every packet is stamped by the program with bpf_ktime_get_tai_ns(),
// read right after its ring-buffer record is reserved, so the ring's
// order and time order agree up to a few instructions between CPUs; the
// reader holds packets back for Options.ReorderWindow and writes them in
// timestamp order. CLOCK_TAI is converted to UTC with the offset between
// CLOCK_TAI and CLOCK_REALTIME measured when the capture starts. The skb's
// own tstamp is not used: at egress it is TCP's departure time on
// CLOCK_MONOTONIC (pacing), at ingress it is set only when some socket
// asked for receive timestamps, so it would mix clocks. These are
// software timestamps, and the pcapng interface description says so. A
// NIC's hardware RX timestamp (skb hwtstamps, present when hardware RX
// timestamping is enabled on the NIC) is kept in Packet.HWTimestamp and
// counted in Stats.HWStamped; ProbeInterface reports whether an interface
// can timestamp in hardware (ethtool's timestamping info). veth and lo
// cannot.
//
// # Ring buffer and losses
//
// Packets go through one BPF ring buffer (Options.RingSize). The verifier
// needs a constant size for a reservation, so a packet takes the smallest
// of a fixed set of record sizes (128 bytes .. MaxSnap = 256 KiB) that
// holds min(length, Options.Snap) bytes plus a 48-byte header. When the
// ring is full a packet is not recorded: the flow is not affected, the
// loss is counted per CPU and interface, and the next packet recorded on
// that CPU and interface carries the number lost before it (pcapng
// epb_dropcount and a comment). The interface statistics block written
// at Close has the totals (isb_ifrecv: packets of the selected flows seen,
// isb_ifdrop: lost).
//
// # Output
//
// pcapng is written with gopacket's pcapgo.NgWriter: a section header, an
// interface description per interface (link type Ethernet, if_tsresol 9 =
// nanoseconds, if_name, and a description of the hooks and the timestamp
// source), an enhanced packet block per packet (timestamp, captured and
// original length, direction flag, RX queue, XDP verdict, drop count and
// comment) and, at Close, an interface statistics block per interface.
//
// # Lifecycle
//
// New loads and attaches everything and starts a goroutine that reads the
// ring and writes to the io.Writer. Add and Remove change the selection
// while it runs. Close detaches the programs, writes what is left in the
// ring and the statistics, flushes, and frees every kernel object. Close
// is idempotent: later calls, Add and Remove return an error matching
// ErrClosed; Stats returns the final counts. New must run in the network
// namespace of the interfaces.
//
// # Privileges and errors
//
// Capture needs CAP_BPF and CAP_NET_ADMIN (CAP_PERFMON too for fexit), or
// root. Every error is an *OpError; match causes with errors.Is:
// ErrPermission (the text names the missing capabilities), ErrNotSupported
// (the kernel lacks tcx links or the ring buffer: Linux 6.6+), ErrInvalid
// (bad snap length, ring size, interface or selector: nothing changed),
// ErrNotFound (no such listener, Steering entry or selector), ErrClosed.
package capture
