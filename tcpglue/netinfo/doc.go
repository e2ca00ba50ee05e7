// Package netinfo is the stack side of seed 003 (what an RDMA-over-IP transport needs from
// the IP stack), on rtnetlink through github.com/jsimonetti/rtnetlink/v2:
//
//   - SourceAddrs: the local addresses usable as the source towards a destination, the
//     kernel's own choice first, then the rest in the kernel's ranking (the rules are in
//     SourceAddrs' documentation);
//   - RouteTo and NextHop: the route (gateway, device, preferred source, path MTU) and the
//     next hop's link-layer address; ResolveNeighbor asks the kernel to resolve a missing
//     one (NTF_USE, no data packet) and waits, bounded by a context;
//   - ReservePort: a TCP port held by a bound, non-listening socket until it is released,
//     turned into a listener or handed over for bind-before-connect;
//   - LinkMTU, RouteTo(dst).MTU and WatchMTU: the MTU per device and per route, and a
//     subscription (RTNLGRP_LINK) reporting device MTU changes as they happen.
//
// The per-connection knobs (congestion control, pacing rate, user timeout, DSCP/ToS,
// TCP_INFO) are methods of *tcpglue.Socket.
//
// # Why jsimonetti/rtnetlink
//
// It rides on github.com/mdlayher/netlink, the socket layer hwq's generic netlink code
// uses too: one netlink stack, one error type (*netlink.OpError with the kernel's
// extended-ack message), sockets in Go's netpoller (deadlines; Close wakes a blocked
// Receive, which is how WatchMTU stops without leaking a goroutine) and netlink.Config.NetNS
// to open a socket in another namespace without locking threads. Where its typed messages
// fall short (an RTM_NEWNEIGH with NTF_USE and no link-layer address) this package writes
// the message on the same netlink.Conn. vishvananda/netlink covers more of rtnetlink but
// brings its own socket layer and package-level handles.
//
// # Lifecycle
//
// A Stack owns one rtnetlink socket (and a duplicate of the namespace descriptor it was
// opened with); its methods are safe for concurrent use. Close is idempotent; later calls
// fail with os.ErrClosed. A Port owns its socket, an MTUWatch its subscription and
// goroutine: Close them (both idempotent). Closing the Stack does not end them.
//
// # Errors
//
// Every failure is an *OpError{Op, Target, Err}. Kernel errors keep their errno (match
// with errors.Is: unix.ENETUNREACH for a destination without a route, unix.EADDRINUSE for
// a taken port via *PortInUseError, unix.EADDRNOTAVAIL for an address that is not local,
// unix.EHOSTUNREACH for an unresolvable neighbour via *NeighborError); a context that ends
// a wait gives an error matching ctx.Err().
package netinfo
