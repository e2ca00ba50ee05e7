package zc

import (
	"crypto/tls"
	"fmt"
	"net/netip"
	"time"

	"github.com/zcnet/zcnet/tcpglue"
)

// ListenOptions are per-listener settings (Engine.Listen's optional last argument).
type ListenOptions struct {
	// KeepAlive overrides Config.KeepAlive for the accepted connections (0: the engine's;
	// negative: off).
	KeepAlive time.Duration
	// Shared joins an SO_REUSEPORT group that already listens on the address (another
	// listener of this process or another process with the same user). Without it, Listen on
	// an address something already listens on fails with EADDRINUSE, as Go's net does.
	Shared bool
	// Backlog for listen(2) (default 4096; the kernel caps it at net.core.somaxconn).
	Backlog int
	// SteerInterfaces names network interfaces (in the network namespace of the thread
	// calling Listen, where the listening sockets are created) on which the listener attaches
	// zcnet's XDP program, which redirects the packets of its flows through a cpumap to the
	// CPU of the queue that owns them (pinned queues only), and its tc egress program, which
	// sends them on the TX queue numbered like that queue. Both read the listener's flow
	// table (explicit entries and the connections sk_reuseport placed) and are detached on
	// Close. It needs BPF steering (SteerAuto or SteerBPF). Under SteerAuto an attachment
	// that fails (or XDP without redirect, or XPS overriding tc) is left out, explained in
	// ListenerStats.Steering and counted in Stats.Steering.AttachFallbacks; under SteerBPF
	// Listen fails with the typed error. A name that is no interface fails Listen in both modes. An
	// interface takes one XDP program: a second listener asking for the same interface gets
	// the kernel's refusal. On veth the XDP program runs in generic (skb) mode: in driver
	// mode the redirect would lose the checksum state of the peer's packets.
	SteerInterfaces []string
	// ZcrxNIC names a NIC whose RX queue the listener's flows get (Config.RecvPath =
	// RecvZcrx): hwq.Bind dedicates a queue to the listener's address (header split, RSS
	// carve-out, ntuple rule; undone when the listener closes) and the accepted connections
	// receive through a zcrx instance bound to it, shared by every engine queue. Where the
	// NIC or its driver cannot, they use the queues' own path, and
	// ListenerStats.ZcrxNICFallback says why; with Config.NoFallback Listen fails instead.
	// Not from a handler.
	ZcrxNIC string
	// ReadSelf leaves receiving to the application: zc never reads the socket (no Data,
	// OnData or OnEOF; MaxRecvHeld and SetReceivePaused do not apply) and the application
	// reads it with Conn.Read, on its own goroutine, waiting in Go's poller as a
	// *net.TCPConn's Read does: one copy, kernel to the caller's slice, and no hand-off to
	// the queue's goroutine. The socket's receive buffer is then the flow control. The
	// connection holds a second descriptor (the socket's duplicate in Go's poller) until
	// Close, or until Read returned what was left after the engine closed it. It needs
	// the io_uring or plain backend and RecvRing or RecvMapped (otherwise a
	// *NotSupportedError). The net.Conn face (zc/netconn) reads this way by default.
	ReadSelf bool
	// Exclusive makes the connection's first handler (the one the accept function returns)
	// its only reader for its whole life: SetHandler and Relay refuse the connection with
	// ErrInvalid (nothing changes; a FanOut may still publish to it: its wrapper passes every
	// event on to the handler). A layer that reads its connections itself sets it, so that
	// nothing takes bytes from under its reader: the net.Conn face (zc/netconn) does.
	Exclusive bool
	// TLS makes the accepted connections TLS servers: the handshake runs before the accept
	// function sees a connection, whose records the kernel then carries (TLSOptions).
	TLS *TLSOptions
}

// DialOptions are per-dial settings (the optional last argument of Engine.Dial and
// Engine.DialAsync; none is the zero DialOptions).
type DialOptions struct {
	// KeepAlive overrides Config.KeepAlive (0: the engine's; negative: off).
	KeepAlive time.Duration
	// LocalAddr, if valid, is bound before connecting.
	LocalAddr netip.AddrPort
	// ReadSelf leaves receiving to the application: zc never reads the socket (no Data,
	// OnData or OnEOF; MaxRecvHeld and SetReceivePaused do not apply) and the application
	// reads it with Conn.Read, on its own goroutine, waiting in Go's poller as a
	// *net.TCPConn's Read does: one copy, kernel to the caller's slice, and no hand-off to
	// the queue's goroutine. The socket's receive buffer is then the flow control. The
	// connection holds a second descriptor (the socket's duplicate in Go's poller) until
	// Close, or until Read returned what was left after the engine closed it. It needs
	// the io_uring or plain backend and RecvRing or RecvMapped (otherwise a
	// *NotSupportedError). The net.Conn face (zc/netconn) reads this way by default.
	ReadSelf bool
	// Exclusive makes the connection's first handler (the h given to the dial)
	// its only reader for its whole life: SetHandler and Relay refuse the connection with
	// ErrInvalid (nothing changes; a FanOut may still publish to it: its wrapper passes every
	// event on to the handler). A layer that reads its connections itself sets it, so that
	// nothing takes bytes from under its reader: the net.Conn face (zc/netconn) does.
	Exclusive bool
	// TLS makes the connection a TLS client: the handshake runs after the connect and
	// before Dial returns (or DialAsync's done runs), bounded by the context too
	// (TLSOptions).
	TLS *TLSOptions
}

// keepAlive applies keep-alive d (> 0: idle time and interval, 9 probes, as Go's net; < 0:
// off) to s.
func keepAlive(s *tcpglue.Socket, d time.Duration) error {
	if d > maxKeepAlive {
		return &ConfigError{Field: "KeepAlive", Value: d, Reason: fmt.Sprintf("at most %v (the kernel's TCP_KEEPIDLE limit)", maxKeepAlive)}
	}
	if d < 0 {
		return s.SetKeepAlive(false)
	}
	if err := s.SetKeepAlive(true); err != nil {
		return err
	}
	d = max(d, time.Second)
	return s.SetKeepAliveParams(d, d, 9)
}

// maxKeepAlive is the largest keep-alive idle time and interval Linux takes (32767 s).
const maxKeepAlive = 32767 * time.Second

func (e *Engine) keepAliveFor(d time.Duration) time.Duration {
	if d == 0 {
		return e.cfg.KeepAlive
	}
	return d
}

// TLSOptions make a listener's or a dial's connections TLS connections (ListenOptions.TLS,
// DialOptions.TLS). crypto/tls runs the handshake before the connection joins its queue
// (the accept function, or Dial's return, comes after it); then the kernel encrypts and
// decrypts the records (kernel TLS: TCP_ULP "tls" with the negotiated keys), so handlers
// receive decrypted Data and Send, Write, SendFile, SendData and FanOut's shared sends are
// encrypted by the kernel: no byte is encrypted or copied in user space, and SendFile stays
// sendfile. Sends are copying sends (kernel TLS refuses SEND_ZC). A Relay between a TLS
// connection and a plain one (TLS termination) splices both ways from Linux 6.14: the
// kernel decrypts into the pipe and encrypts out of it, and the relay reads the control
// records (alerts, KeyUpdates, close_notify) between splices; before 6.14 it forwards with
// SendData (RelayStats.Fallback says why). After the handshake the engine follows the
// peer's KeyUpdates and updates its own TX keys (RekeyRecords) where the kernel can (6.14).
//
// Where the kernel cannot (no tls module, as on kernels built without CONFIG_TLS; a cipher
// suite other than AES-GCM or ChaCha20-Poly1305) the connection runs crypto/tls in user
// space instead, visibly (ConnStats.TLS says which and why, Stats.TLS counts both) and only
// when allowed (NoFallback). On that path a goroutine pair carries the records between the
// TCP socket and a socket pair whose other end is the connection's: the API is the same,
// but every byte is copied twice more and encrypted in user space, and the connection's
// socket is that pair's end, so Socket, TCPInfo and the socket options act on it (and
// fail).
type TLSOptions struct {
	// Config is crypto/tls's configuration: with a certificate for a listener, with
	// ServerName (or InsecureSkipVerify) for a dial. Required.
	Config *tls.Config
	// NoFallback forbids the user-space fallback: a connection kernel TLS cannot serve is
	// refused with a *NotSupportedError (matching ErrNotSupported) saying what is missing:
	// Listen or Dial fails at once where the kernel has no TLS at all, a dial whose
	// negotiated suite the kernel refuses fails with it, and such an accepted connection is
	// closed (after a close_notify) and counted in Stats.TLS.Refused.
	NoFallback bool
	// UserSpace keeps every record in crypto/tls (for shapes where kernel TLS loses).
	UserSpace bool
	// HandshakeTimeout bounds the handshake (default 10 s).
	HandshakeTimeout time.Duration
	// RekeyRecords is how many TLS 1.3 records the kernel may encrypt under one key
	// before the engine updates the connection's TX keys: between two sends it sends a
	// KeyUpdate and gives the kernel the next keys (the application notices nothing;
	// ConnStats.TLS.TxRekeys and Stats.TLS.TxRekeys count them). Zero means RFC 8446
	// §5.5's limit for AES-GCM (2^24 records, under the RFC's 2^24.5) and none for
	// ChaCha20-Poly1305; tests lower it (4 at least). The engine counts an upper bound of
	// the records (every send may end one early) and cuts sends to stay under it, so an
	// update may come sooner than the kernel's own count would need. A kernel takes new
	// TX keys from Linux 6.14: before it the bound is not enforced (as crypto/tls does
	// not enforce it), visibly: ConnStats.TLS.RekeyAt is 0. TLS 1.2 has no KeyUpdate.
	RekeyRecords uint64
}
