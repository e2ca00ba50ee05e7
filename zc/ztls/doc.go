// Package ztls is TLS with the records in the kernel: crypto/tls runs the handshake, and
// then the connection's keys, IVs and exact record sequence numbers go to the kernel
// (TCP_ULP "tls", TLS_TX, TLS_RX, through package tcpglue), which encrypts what is
// written and decrypts what is read. Writes are plain send(2)s, and Conn.ReadFrom of an
// *os.File is sendfile(2): no byte is encrypted or copied in user space.
//
// Where the kernel cannot carry a connection (no tls module, as on kernels built without
// CONFIG_TLS; a cipher suite other than AES-GCM or ChaCha20-Poly1305; a net.Conn that is
// not a socket) the same Conn runs crypto/tls in user space, visibly: Conn.Info says which
// path and why, ReadStats counts both, and Options.NoFallback turns the fallback into a
// *NoKernelError matching ErrNotSupported.
//
// # Lifecycle
//
// Server, Client, NewListener's Accept and Dial return a *Conn, a net.Conn. The handshake
// runs on the first Read or Write, or on Handshake (Dial runs it). Close sends close_notify
// and closes the socket; it is idempotent (later calls return an error wrapping
// net.ErrClosed). One Read and one Write may run at once.
//
// # The switch to the kernel
//
// During the handshake ztls reads the socket one TLS record at a time, so crypto/tls never
// holds a byte past the peer's Finished: TLS 1.3 session tickets and the peer's first data
// stay in the socket and are decrypted by the kernel (sequence numbers start at 0 for
// what is received). The secrets come from crypto/tls's key log (Config.KeyLogWriter:
// ztls installs its own writer, which passes every line on to yours), with no access to
// crypto/tls internals: TLS 1.3 keys and IVs by HKDF-Expand-Label from the traffic
// secrets, TLS 1.2 from the master secret's key block. What was sent under the new keys
// during the handshake sets the first TX sequence number: the server's session ticket in
// TLS 1.3 (1), the Finished in TLS 1.2 (1).
//
// # After the handshake
//
// A close_notify from the peer is io.EOF; any other alert is a *AlertError (on both
// paths). A TLS 1.3 KeyUpdate is applied in the kernel (new RX keys; new TX keys too when
// the peer asks, after our own KeyUpdate); kernels before 6.14 cannot change keys, and
// the read fails with an error saying so. On 6.14 and later the kernel path also updates
// its own TX keys before AES-GCM's record limit (Options.RekeyRecords). KernelStats reads
// the kernel's TLS counters. A TLS 1.2 renegotiation request gets a
// no_renegotiation alert and ErrRenegotiation. Session tickets received on the kernel
// path are dropped (Info.Tickets): a client whose records are in the kernel does not
// resume sessions.
//
// # Errors
//
// A handshake failure is crypto/tls's error (a received alert as *AlertError); a refused
// kernel path under NoFallback is *NoKernelError; a nil *tls.Config is ErrNilConfig.
// Reads and writes on the kernel path fail with *net.OpError wrapping the errno or
// os.ErrDeadlineExceeded, like a *net.TCPConn's.
package ztls
