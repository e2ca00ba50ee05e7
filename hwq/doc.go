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
// Every failure is an *OpError{Op, Iface, Err}. A device, driver or kernel that cannot do
// what was asked gives an error matching ErrNotSupported (the one zcnet sentinel); errors.As
// with *NotSupportedError names the feature ("header split (ethtool -G tcp-data-split
// on)", "ntuple filters", "RSS indirection table (ethtool -x/-X)") and what it needs. A
// refused Bind joins one such error per missing feature. Other kernel errors are
// *netlink.OpError (errno plus the kernel's extended-ack message) or *os.SyscallError;
// arguments rejected before any system call are *ValueError.
package hwq
