// Package tcpglue is zcnet's layer over the kernel's own TCP stack: plain
// IPPROTO_TCP sockets (IPv4 and IPv6, never MPTCP), listening sockets and
// SO_REUSEPORT groups for per-queue steering, typed socket options, TCP_INFO
// snapshots and the TCP_ZEROCOPY_RECEIVE mapped receive window.
//
// It does no io_uring itself. Package zc accepts and connects through
// io_uring with the descriptors (Socket.Fd, FromFD) and kernel-layout socket
// addresses (RawSockaddr) produced here; Accept, Connect, Dial, Read and Write
// are the plain-socket fallback path.
//
// # Why not net.Listen
//
// Since Go 1.26 net.Listen and net.Dial create MPTCP sockets by default. On
// those, io_uring SEND_ZC fails with EOPNOTSUPP and SO_ATTACH_REUSEPORT_EBPF /
// REUSEPORT_SOCKARRAY updates fail, so zcnet creates every socket here with
// socket(AF_INET[6], SOCK_STREAM|SOCK_CLOEXEC, IPPROTO_TCP).
//
// # Lifecycle
//
// A *Socket owns exactly one descriptor. Constructors say so: NewSocket,
// Listen, ListenGroup, Dial and Accept create one; FromFD (checked) and
// FromAcceptedFD (unchecked, for io_uring ACCEPT results) take ownership of
// an existing descriptor, only on success; Disown hands the descriptor back
// to the caller. Close is idempotent and nil-safe; later calls and every
// other method then fail with an *OpError wrapping net.ErrClosed. Methods are
// safe for concurrent use and hold a reference on the descriptor while they
// run, so Close never pulls a descriptor out from under a system call: a
// Close during a blocked call shuts the socket down to wake it, and the
// descriptor is closed when the call returns. Fd returns the raw number for
// io_uring; the Socket must stay open and reachable until the kernel is done
// with it. A Socket dropped without Close is closed by a runtime cleanup, but
// that is a safety net, not the API.
//
// A RecvWindow (TCP_ZEROCOPY_RECEIVE) borrows its Socket, and its mapping
// keeps the socket's file alive until the window is closed: close both, in
// either order (closing the Socket first wakes a blocked Recv). Slices of
// mapped data it returns are valid until the next Recv, Release or Close on
// the window.
//
// # Kernel TLS
//
// EnableTLS, SetTLSTx and SetTLSRx move the record layer of an established
// connection into the kernel (TCP_ULP "tls", TLS_TX, TLS_RX) once a user-space
// handshake has produced the keys (package zc/ztls does that with crypto/tls).
// RecvTLS reads with the record type of what it read, so alerts and handshake
// messages are seen as such; SendTLSRecord sends them. ProbeTLS says whether
// the kernel has TLS and which ciphers it accepts. A kernel-TLS socket refuses
// zero-copy sends: send, sendfile and splice work, and the kernel encrypts.
//
// # Errors
//
// Every failure is an *OpError{Op, Fd, Addr, Err} (use errors.As). Err is
//   - an *os.SyscallError wrapping the unix.Errno the kernel returned (match
//     with errors.Is(err, unix.ECONNREFUSED) etc.);
//   - net.ErrClosed for a closed Socket or window;
//   - *ValueError for an argument rejected before any system call (negative
//     sizes, a ToS above 255, an MSS out of 88..32767, a non-TCP descriptor);
//   - *AddrError for an address that cannot be parsed or resolved, or is of
//     the wrong family (an IPv6 address for "tcp4");
//   - *CongestionError for a congestion control algorithm the kernel refused,
//     listing the available ones;
//   - something matching ErrNotSupported when the kernel lacks a feature.
//
// End of stream is io.EOF, bare (not wrapped), from Read and RecvWindow.Recv.
// On a non-blocking socket "try again" is an error matching unix.EAGAIN.
package tcpglue
