// Package hwq gives userspace access to a NIC's hardware queues (seed 004 of the design
// card): it discovers devices, their RX/TX queues and NAPI instances, reads and changes
// channels, ring parameters (header split), RSS tables and contexts, feature flags and
// ntuple rules, answers per NIC what the hardware can do for zero-copy, and dedicates an
// RX queue to one TCP flow.
//
// # Kernel interfaces
//
//   - the generic netlink family "netdev" (include/uapi/linux/netdev.h): dev-get (Linux
//     6.3), queue-get and napi-get (6.9); dumps are read until NLMSG_DONE and retried when
//     the kernel marks them interrupted;
//   - the generic netlink family "ethtool" (ethtool_netlink_generated.h): channels, rings
//     (tcp-data-split, hds-thresh), features, tsinfo, RSS get (6.0), RSS set/create/delete
//     (6.17);
//   - the SIOCETHTOOL ioctl where ethtool netlink has no command: ntuple rules
//     (ETHTOOL_SRXCLSRLINS/DEL, GRXCLSRLALL), RSS tables and contexts before 6.17
//     (ETHTOOL_SRSSH), driver information (ETHTOOL_GDRVINFO);
//   - rtnetlink for the list of links.
//
// Netlink goes through github.com/mdlayher/genetlink and github.com/mdlayher/netlink and
// rtnetlink through github.com/jsimonetti/rtnetlink/v2. github.com/mdlayher/ethtool covers
// link info, link modes, FEC, wake-on-LAN and private flags but none of channels, rings,
// RSS, tsinfo or ntuple, so those messages are encoded here. Every attribute number and ioctl
// layout cites its uapi header and is compared with the C headers by the tests.
//
// # Lifecycle
//
// A Client owns one generic netlink socket, one rtnetlink socket and one ioctl socket, all
// bound to the network namespace chosen at Open (Options.NetNS) for their whole life. Its
// methods are safe for concurrent use; Close is idempotent and nil-safe, and later calls
// fail with an *OpError wrapping os.ErrClosed.
//
// Bind returns a *Binding: the dedicated queue (Ifindex and Queue are what
// IORING_REGISTER_ZCRX_IFQ and netdev bind-rx take) and the list of changes it made.
// Binding.Close undoes them in reverse order, tries every step even when one fails, and is
// idempotent. Bind checks every requirement before its first change, so a device that
// cannot be bound is left as it was; a step failing midway undoes the steps before it.
//
// # Raw queues (AF_XDP)
//
// OpenRawQueue opens a raw queue: an AF_XDP socket bound to one RX/TX queue pair of a
// device, with a memreg region as its UMEM (the region's buffers are the frames: received
// frames are memreg.Bufs the application releases, frames to send are built in place in
// buffers from RawQueue.Get), the four rings (fill, completion, RX, TX) mapped into the
// process, need_wakeup honoured (the kernel is kicked only when it asks). Steps and
// fallbacks, each visible in RawQueue.Mode and counted:
//
//   - bind in zero-copy mode first; where the driver refuses (veth, lo, most virtual
//     devices) bind in copy mode, with the reason in Mode().CopyReason and
//     CopyModeFallbacks counting it. RawQueueOptions.RequireZeroCopy turns the fallback
//     into an error matching ErrNotSupported;
//   - the steering program (bpf.RawSteering: rules on multicast group, MAC, VXLAN VNI,
//     DSCP, IPv6 flow label, 5-tuple; everything else passes to the kernel stack) is
//     attached in native XDP mode first and in generic (skb) mode where the driver has no
//     XDP, with Mode().XDPReason and bpf.RawFallbacks; bpf.XDPDriver refuses the fallback.
//     On veth the default is generic mode: a native program there turns off the peer's
//     TSO/GSO, and kernel TCP into the interface ran at 0.24–0.30× its speed (generic:
//     0.85–0.9×); Mode().XDPReason is then a *bpf.NativeXDPCostError, the probe says the
//     same, and RawQueueOptions.XDP = bpf.XDPDriver asks for native mode and its cost.
//     Several raw queues of one interface share one program (NewRawSteering,
//     RawQueueOptions.Steering, which must be the program of this very interface in its
//     namespace: another one is refused with ErrInvalid): the XSKMAP is keyed by the RX
//     queue a frame arrived on, so a stream that RSS spreads over queues needs a raw queue
//     on each of them.
//
// Close tears everything down on every path: the queue's XSKMAP entry, its own steering
// program (link, program, maps), the socket (the UMEM registration goes with it), the ring
// mappings; buffers on the fill and TX rings go back to the region, received frames the
// application holds stay valid until released. XDP programs are attached through BPF links
// and sockets are fds: a killed process leaves nothing attached. The kernel releases a
// closed socket's queue in a workqueue after close(2) returns, so an open right after a close
// (of this process or a killed one) may meet EBUSY for a moment: the bind retries for up to a
// second.
//
// The region is shared between receiving and sending: the fill ring takes free buffers as
// it needs them but never the last RawQueueOptions.TxReserve of them (a quarter of the
// region by default), so Get finds a buffer whenever no frame is in flight or held, and Get
// takes completed sends off the completion ring before it says ErrExhausted.
//
// Driving a raw queue: TryReceive never blocks and suits a loop that polls several queues
// or runs its own event loop; Receive takes what is there and otherwise waits in ppoll(2)
// (Close and SetReadDeadline wake it). Each receive refills the fill ring from the region's
// free buffers first and takes the frames' buffers under one lock of the region;
// RawQueue.Release gives a batch back the same way (Buf.Release does one). Send queues frames on the TX ring and kicks the kernel with sendto(2)
// from the calling goroutine (in copy mode each call moves a batch of up to 32 frames);
// Flush kicks again and returns completed buffers to the region. RawQueueOptions.RxCoalesce
// trades latency for CPU at moderate rates: while frames keep coming, Receive waits that
// long on a timer and takes a batch, instead of being woken by the kernel for each frame
// (each wake-up also costs the sending side's kernel path). In steady state
// TryReceive, Receive with frames waiting, Send and Flush allocate nothing and read no
// clock. The socket is deliberately not in Go's netpoller: in copy mode the kernel's
// xsk_poll transmits the TX ring, so a poller thread woken by each completion would kick
// the socket on a second thread while Send kicks it on the caller's, and the two fight over
// the socket's lock. The raw queue is not tied to zc's io_uring Engine: an Engine queue
// goroutine could poll its fd (SyscallConn) with IORING_OP_POLL_ADD and call TryReceive on
// readiness (one ring round trip per batch, no extra goroutine); neither copies frames.
// The kernel reports an interface that went away only through the socket's error, once,
// not through poll (xsk_poll has no EPOLLERR): a waiting Receive reads it every
// DeviceCheck, a polling TryReceive every 1,024 empty polls, and from then on every call
// returns ErrNoDevice.
//
// The per-NIC report (Probe) says what a raw queue will be on each device: zero-copy or
// copy mode, native or generic XDP, and which RX metadata (timestamp, hash, VLAN tag) the
// driver gives a device-bound XDP program (RawQueueOptions.Metadata, Frame.Meta).
//
// # Capabilities
//
// ProbeNIC, ProbeAll and Client.Probe answer per NIC, by reading only: queues, header
// split, ntuple, RSS, zcrx, devmem, AF_XDP zero-copy, hardware timestamps, and seed 003's
// "this NIC is special" flag. Each Answer is yes, no or unknown with its reason. zcrx and
// devmem are "no" when the NIC cannot split headers and "unknown" otherwise: whether a
// driver accepts a memory provider only a registration attempt (IORING_REGISTER_ZCRX_IFQ,
// netdev bind-rx) can tell, and that attempt belongs to the zcrx code.
//
// # Errors
//
// Every failure is an *OpError{Op, Iface, Err}. A raw queue on an interface that does not
// exist or went away gives an error matching ErrNoDevice. A device, driver or kernel that cannot do
// what was asked gives an error matching ErrNotSupported (the one zcnet sentinel); errors.As
// with *NotSupportedError names the feature ("header split (ethtool -G tcp-data-split
// on)", "ntuple filters", "RSS indirection table (ethtool -x/-X)") and what it needs. A
// refused Bind joins one such error per missing feature. Other kernel errors are
// *netlink.OpError (errno plus the kernel's extended-ack message) or *os.SyscallError;
// rejected arguments are *ValueError, which matches ErrInvalid (bpf.ErrInvalid). After
// Close a raw queue's calls fail with os.ErrClosed.
package hwq
