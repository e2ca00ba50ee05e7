package ztls

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/ktls"
	"github.com/zcnet/zcnet/tcpglue"
)

// Options choose where a connection's records are encrypted. The zero value (or a nil
// *Options) means: in the kernel where it can, in user space (crypto/tls) where not.
type Options struct {
	// NoFallback forbids the user-space fallback: a connection kernel TLS cannot serve
	// fails its handshake with a *NoKernelError (matching ErrNotSupported) that says what
	// is missing, and is closed: before the handshake when the socket cannot take the
	// "tls" ULP (no handshake work is spent; the peer sees the connection close), after
	// it (with a close_notify) when the negotiated cipher suite or the keys are refused.
	NoFallback bool
	// UserSpace keeps every record in crypto/tls (for shapes where kernel TLS loses).
	UserSpace bool
	// RekeyRecords is how many TLS 1.3 records the kernel may encrypt under one key before
	// ztls updates its TX keys (a KeyUpdate, then new TLS_TX keys: Linux 6.14). Zero means
	// RFC 8446 §5.5's limit for AES-GCM (2^24 records here, under the RFC's 2^24.5) and
	// none for ChaCha20-Poly1305. ztls counts an upper bound of the records (every write
	// may end one early), so an update may come sooner. Kernels before 6.14 cannot change
	// keys: there the limit is not enforced (crypto/tls does not enforce it either).
	RekeyRecords uint64
}

// Info says where a connection's records are encrypted, and why.
type Info struct {
	Kernel      bool   // the kernel encrypts and decrypts (TLS_TX and TLS_RX are set)
	Reason      string // why not, when Kernel is false after the handshake
	Version     uint16 // tls.VersionTLS12 or tls.VersionTLS13
	CipherSuite uint16 // the crypto/tls cipher suite
	KeyUpdates  uint64 // TLS 1.3 KeyUpdates received and applied in the kernel
	TxRekeys    uint64 // TLS 1.3 TX key updates the kernel path made (RekeyRecords' and those the peer asked for)
	Tickets     uint64 // TLS 1.3 session tickets received in the kernel and dropped (no resumption)
}

// Stats counts connections by where their records went, process-wide.
type Stats struct {
	Kernel  uint64 // handshakes that moved the records into the kernel
	User    uint64 // handshakes that stayed in crypto/tls (Info.Reason says why)
	Refused uint64 // handshakes refused because kernel TLS could not serve them and NoFallback was set
}

var stats struct{ kernel, user, refused atomic.Uint64 }

// ReadStats returns the process-wide counters.
func ReadStats() Stats {
	return Stats{Kernel: stats.kernel.Load(), User: stats.user.Load(), Refused: stats.refused.Load()}
}

// Conn is a TLS connection whose handshake crypto/tls runs and whose records the kernel
// encrypts and decrypts (or, where it cannot, crypto/tls: Info says which). It is a
// net.Conn; methods are safe for concurrent use like a *tls.Conn's: one Read and one
// Write may run at once.
type Conn struct {
	raw      net.Conn
	hs       *ktls.Handshake // nil: no *tls.Config
	tc       *tls.Conn
	isClient bool
	opts     Options
	ulp      bool // the "tls" ULP is attached (by the handshake goroutine)

	hmu    sync.Mutex
	hsDone atomic.Bool
	hsErr  error
	kern   atomic.Pointer[kernel]
	info   Info // written by the handshake (under hmu) before hsDone

	rmu  sync.Mutex // the read side (kernel path)
	rerr error      // sticky read error

	// The kernel path's write side has two locks. wmu serializes the writers (Write,
	// ReadFrom, CloseWrite) and is held while they wait for room. smu is held only around
	// one non-blocking system call that sends, and around TX key changes: the reader
	// takes it to send an alert or to note a KeyUpdate the peer asked for, so a reader
	// never waits for a writer that waits for the peer.
	wmu      sync.Mutex
	smu      sync.Mutex
	closed   atomic.Bool
	txRekeys atomic.Uint64
}

// kernel is a connection's kernel TLS state.
type kernel struct {
	rc      syscall.RawConn
	version uint16
	s       ktls.Suite
	tx      ktls.DirKeys // TLS 1.3 TX secret (under smu)
	ctl     ktls.Control // the received non-data records and the RX secret (under rmu)

	txRecords uint64 // an upper bound of the records sent under the current TX keys (under smu)
	rekeyAt   uint64 // update the TX keys at this many records (0: never)
	txUpdate  bool   // a KeyUpdate is owed before the next data record (under smu)
}

// sent counts what one send of n bytes may have cost in records (under smu): full records
// plus one ended early. It marks a KeyUpdate owed when the limit is reached.
func (k *kernel) sent(n int, perRecord int) {
	k.txRecords += uint64(n/perRecord) + 1
	if k.rekeyAt > 0 && k.txRecords >= k.rekeyAt && rekeyOK() {
		k.txUpdate = true
	}
}

// rekeyOK is whether this kernel takes new keys on a socket (Linux 6.14), probed once.
var rekeyOK = sync.OnceValue(func() bool { return tcpglue.ProbeTLSRekey() == nil })

// Server returns the server side of a TLS connection on conn (an accepted *net.TCPConn
// for kernel TLS; any other net.Conn runs in user space). The handshake runs on the first
// Read or Write, or on Handshake. cfg must hold a certificate, as for tls.Server. A nil
// opts is the zero Options.
func Server(conn net.Conn, cfg *tls.Config, opts *Options) *Conn {
	c := newConn(conn, false, opts)
	if cfg != nil {
		c.hs = ktls.Server(conn, serverConfig(cfg))
		c.tc = c.hs.TC
	}
	return c
}

// Client returns the client side of a TLS connection on conn; see Server. cfg must set
// ServerName or InsecureSkipVerify, as for tls.Client.
func Client(conn net.Conn, cfg *tls.Config, opts *Options) *Conn {
	c := newConn(conn, true, opts)
	if cfg != nil {
		c.hs = ktls.Client(conn, cfg, c.opts.UserSpace)
		c.tc = c.hs.TC
	}
	return c
}

// serverConfig returns a copy of cfg whose key log reaches ztls (shared by the
// connections of one listener, so that they share its session ticket keys); it declines
// TLS 1.2 resumption (ktls.ServerConfig).
func serverConfig(cfg *tls.Config) *tls.Config { return ktls.ServerConfig(cfg) }

func newConn(conn net.Conn, isClient bool, opts *Options) *Conn {
	c := &Conn{raw: conn, isClient: isClient}
	if opts != nil {
		c.opts = *opts
	}
	return c
}

// Handshake runs the handshake if it has not run yet (see HandshakeContext).
func (c *Conn) Handshake() error { return c.HandshakeContext(context.Background()) }

// HandshakeContext runs the TLS handshake with crypto/tls and then moves the records into
// the kernel, or keeps them in crypto/tls and says why (Info). With Options.NoFallback a
// connection kernel TLS cannot serve fails with a *NoKernelError and is closed. Later
// calls return the first call's result.
func (c *Conn) HandshakeContext(ctx context.Context) error {
	if c.hsDone.Load() {
		return c.hsErr
	}
	c.hmu.Lock()
	defer c.hmu.Unlock()
	if c.hsDone.Load() {
		return c.hsErr
	}
	c.hsErr = c.handshake(ctx)
	c.hsDone.Store(true)
	return c.hsErr
}

func (c *Conn) handshake(ctx context.Context) error {
	if c.hs == nil {
		return ErrNilConfig
	}
	if c.closed.Load() {
		c.hs.Unroute()
		return net.ErrClosed
	}
	if c.opts.NoFallback && !c.opts.UserSpace {
		// Refuse before the handshake's work when the socket cannot take the ULP.
		if err := c.attachULP(); err != nil {
			stats.refused.Add(1)
			c.hs.Unroute()
			c.raw.Close()
			return &NoKernelError{Reason: err.Error(), Err: err}
		}
	}
	if err := c.hs.Run(ctx); err != nil {
		return err
	}
	st := c.tc.ConnectionState()
	c.info.Version, c.info.CipherSuite = st.Version, st.CipherSuite
	k, hard, err := c.toKernel(st)
	if err == nil {
		c.kern.Store(k)
		c.info.Kernel = true
		stats.kernel.Add(1)
		return nil
	}
	c.info.Reason = err.Error()
	if hard {
		// Keys went into the kernel half way: neither side can carry the records.
		c.raw.Close()
		return fmt.Errorf("ztls: moving records into the kernel: %w", err)
	}
	if c.opts.NoFallback {
		stats.refused.Add(1)
		c.tc.Close() // close_notify from crypto/tls, which still holds the keys
		return &NoKernelError{Reason: err.Error(), Err: err}
	}
	stats.user.Add(1)
	c.hs.Passthrough()
	return nil
}

// toKernel derives the keys and hands them to the kernel. hard reports a failure after
// the kernel took the RX keys (the connection cannot fall back).
func (c *Conn) toKernel(st tls.ConnectionState) (k *kernel, hard bool, err error) {
	if c.opts.UserSpace {
		return nil, false, errors.New("user space requested (Options.UserSpace)")
	}
	sc, ok := c.raw.(syscall.Conn)
	if !ok {
		return nil, false, fmt.Errorf("the connection (%T) has no socket descriptor", c.raw)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, false, err
	}
	tx, rx, err := c.hs.Keys()
	if err != nil {
		return nil, false, err
	}
	k = &kernel{rc: rc, version: st.Version, s: ktls.Suites[st.CipherSuite], tx: tx}
	k.ctl.Version, k.ctl.Suite, k.ctl.RX = st.Version, k.s, rx.Secret
	if st.Version == tls.VersionTLS13 {
		k.rekeyAt = c.opts.RekeyRecords
		if k.rekeyAt == 0 && !k.s.ChaCha() {
			k.rekeyAt = 1 << 24
		}
	}
	var kerr error
	if cerr := rc.Control(func(fd uintptr) {
		hard, kerr = ktls.Install(int(fd), c.ulp, tx, rx)
	}); cerr != nil {
		return nil, false, cerr
	}
	if kerr != nil {
		return nil, hard, kerr
	}
	return k, false, nil
}

// attachULP attaches the "tls" ULP before the handshake (NoFallback: a kernel without TLS
// refuses the connection before any handshake work). Until keys are set the socket passes
// bytes through unchanged.
func (c *Conn) attachULP() error {
	sc, ok := c.raw.(syscall.Conn)
	if !ok {
		return fmt.Errorf("the connection (%T) has no socket descriptor", c.raw)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var uerr error
	if err := rc.Control(func(fd uintptr) { uerr = tcpglue.EnableTLS(int(fd)) }); err != nil {
		return err
	}
	if uerr != nil {
		return uerr
	}
	c.ulp = true
	return nil
}

// Info says where this connection's records are encrypted, and why.
func (c *Conn) Info() Info {
	if !c.hsDone.Load() {
		return Info{}
	}
	i := c.info
	i.TxRekeys = c.txRekeys.Load()
	if k := c.kern.Load(); k != nil {
		i.KeyUpdates, i.Tickets = k.ctl.KeyUpdates.Load(), k.ctl.Tickets.Load()
	}
	return i
}

// ConnectionState returns crypto/tls's view of the handshake (version, cipher suite,
// peer certificates, ALPN). It is the zero value before the handshake.
func (c *Conn) ConnectionState() tls.ConnectionState {
	if c.tc == nil || !c.hsDone.Load() {
		return tls.ConnectionState{}
	}
	return c.tc.ConnectionState()
}

// NetConn returns the connection under TLS.
func (c *Conn) NetConn() net.Conn { return c.raw }

// Read reads decrypted data. A close_notify from the peer is io.EOF; an alert is a
// *AlertError; a TLS 1.2 renegotiation request is ErrRenegotiation.
func (c *Conn) Read(p []byte) (int, error) {
	if err := c.Handshake(); err != nil {
		return 0, err
	}
	k := c.kern.Load()
	if k == nil {
		n, err := c.tc.Read(p)
		return n, ktls.UserErr(err)
	}
	return c.kread(k, p)
}

// Write writes data as TLS records (encrypted by the kernel on the kernel path).
func (c *Conn) Write(p []byte) (int, error) {
	if err := c.Handshake(); err != nil {
		return 0, err
	}
	k := c.kern.Load()
	if k == nil {
		n, err := c.tc.Write(p)
		return n, ktls.UserErr(err)
	}
	return c.kwrite(k, p)
}

// kwrite is Write on the kernel path: write(2) in Go's poller, one system call at a time
// under smu, with an owed KeyUpdate sent first.
func (c *Conn) kwrite(k *kernel, p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.kwriteLocked(k, p)
}

// kwriteLocked is kwrite under wmu; with no bytes it only sends an owed KeyUpdate.
func (c *Conn) kwriteLocked(k *kernel, p []byte) (int, error) {
	off := 0
	for {
		var err error
		perr := k.rc.Write(func(fd uintptr) bool {
			c.smu.Lock()
			defer c.smu.Unlock()
			if err = c.updateTXLocked(k, int(fd)); err != nil {
				return !errors.Is(err, unix.EAGAIN)
			}
			if off == len(p) {
				return true
			}
			var n int
			n, err = unix.Write(int(fd), p[off:])
			if n > 0 {
				off += n
				k.sent(n, ktls.MaxRecord)
			}
			return !errors.Is(err, unix.EAGAIN)
		})
		switch {
		case perr != nil:
			return off, c.opErr("write", perr)
		case errors.Is(err, unix.EINTR):
		case err != nil:
			return off, c.opErr("write", os.NewSyscallError("write", err))
		case off == len(p):
			return off, nil
		}
	}
}

// updateTXLocked sends an owed KeyUpdate (update_not_requested) under the current TX keys
// and gives the kernel the next ones (under smu). EAGAIN means no room yet: it stays owed.
// The KeyUpdate answers the peer's request or RekeyRecords' limit, whichever came first.
func (c *Conn) updateTXLocked(k *kernel, fd int) error {
	if !k.txUpdate {
		return nil
	}
	n, err := tcpglue.SendTLSRecord(fd, ktls.TypeHandshake, ktls.KeyUpdateMsg, unix.MSG_DONTWAIT)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
		return unix.EAGAIN
	}
	if err == nil && n != 5 {
		err = fmt.Errorf("sent %d bytes of a 5-byte KeyUpdate", n)
	}
	if err == nil {
		next := ktls.NextSecret13(k.s, k.tx.Secret)
		if err = tcpglue.SetTLSTx(fd, ktls.TrafficKeys13(k.s, next, 0)); err == nil {
			k.tx.Secret, k.txRecords, k.txUpdate = next, 0, false
			c.txRekeys.Add(1)
			return nil
		}
	}
	// The KeyUpdate may be out: the peer would then expect the next keys, and records
	// under the old ones would fail. The connection cannot go on.
	c.raw.Close()
	return fmt.Errorf("ztls: updating the TX keys: %w", err)
}

// flushTX sends an owed KeyUpdate, waiting for room (under wmu).
func (c *Conn) flushTX(k *kernel) error {
	_, err := c.kwriteLocked(k, nil)
	return err
}

// ReadFrom copies r to the connection. With kernel TLS it goes through the socket's own
// ReadFrom, so an *os.File is sent with sendfile(2) and a socket with splice(2), and the
// kernel encrypts: no byte passes through user space. In user space it is io.Copy.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if err := c.Handshake(); err != nil {
		return 0, err
	}
	k := c.kern.Load()
	rf, ok := c.raw.(io.ReaderFrom)
	if k == nil || !ok || !kernelSource(r) {
		return io.Copy(writerOnly{c}, r)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.flushTX(k); err != nil {
		return 0, err
	}
	// The socket's ReadFrom makes its own system calls (sendfile, splice): a KeyUpdate
	// the peer asks for meanwhile goes out after it (RFC 8446 wants it before our next
	// data record; peers do not check).
	n, err := rf.ReadFrom(r)
	c.smu.Lock()
	k.sent(int(n), 4096) // sendfile and splice may end a record at every page
	c.smu.Unlock()
	if err == nil {
		err = c.flushTX(k)
	}
	return n, err
}

type writerOnly struct{ io.Writer }

// kernelSource reports whether the socket's ReadFrom moves r's bytes in the kernel
// (sendfile from a file, splice from a socket); other readers are copied through Write,
// so that the write lock is not held across their reads.
func kernelSource(r io.Reader) bool {
	if lr, ok := r.(*io.LimitedReader); ok {
		r = lr.R
	}
	switch r.(type) {
	case *os.File, *net.TCPConn, *net.UnixConn:
		return true
	}
	return false
}

// CloseWrite sends close_notify and shuts the write side of the socket down.
func (c *Conn) CloseWrite() error {
	if !c.hsDone.Load() {
		return errors.New("ztls: CloseWrite before the handshake")
	}
	if c.hsErr != nil {
		return c.hsErr
	}
	k := c.kern.Load()
	if k == nil {
		return c.tc.CloseWrite()
	}
	c.wmu.Lock()
	err := c.flushTX(k)
	if err == nil {
		err = c.sendControl(k, ktls.TypeAlert, []byte{1, 0}, true)
	}
	c.wmu.Unlock()
	if cw, ok := c.raw.(interface{ CloseWrite() error }); ok {
		return errors.Join(err, cw.CloseWrite())
	}
	return err
}

// Close sends close_notify (if the handshake finished and the socket has room: Close does
// not wait for a blocked peer) and closes the connection.
func (c *Conn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return &net.OpError{Op: "close", Net: "tcp", Source: c.raw.LocalAddr(), Addr: c.raw.RemoteAddr(), Err: net.ErrClosed}
	}
	k := c.kern.Load()
	if k == nil {
		if c.tc != nil {
			return c.tc.Close()
		}
		return c.raw.Close()
	}
	c.sendControl(k, ktls.TypeAlert, []byte{1, 0}, false) // between a writer's system calls
	return c.raw.Close()
}

// sendControl sends one non-data record through the kernel, each try under smu. With
// wait (a writer, under wmu) it waits for room in Go's poller. Without, it gives up when
// the socket has no room (an alert is best effort), and it does not take the
// descriptor's write lock either, which a writer waiting for room holds: the reader and
// Close call it that way and so never wait for a writer.
func (c *Conn) sendControl(k *kernel, typ uint8, b []byte, wait bool) error {
	var err error
	f := func(fd uintptr) bool {
		c.smu.Lock()
		_, err = tcpglue.SendTLSRecord(int(fd), typ, b, unix.MSG_DONTWAIT)
		c.smu.Unlock()
		return !wait || !errors.Is(err, unix.EAGAIN)
	}
	var perr error
	if wait {
		perr = k.rc.Write(f)
	} else {
		perr = k.rc.Control(func(fd uintptr) { f(fd) })
	}
	if perr != nil {
		return perr
	}
	return err
}

// kread is Read on the kernel path: data records straight into p (as many as p holds,
// the kernel's recvmsg), control records handled here.
func (c *Conn) kread(k *kernel, p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if len(p) == 0 {
		return 0, c.rerr
	}
	for c.rerr == nil {
		var (
			n   int
			typ uint8
			err error
		)
		perr := k.rc.Read(func(fd uintptr) bool {
			n, typ, err = tcpglue.RecvTLS(int(fd), p, unix.MSG_DONTWAIT)
			return !errors.Is(err, unix.EAGAIN)
		})
		if perr != nil {
			return 0, c.opErr("read", perr) // deadline, closed
		}
		switch {
		case errors.Is(err, unix.EBADMSG):
			c.alert(k, 20)
			c.rerr = &AlertError{Alert: 20}
		case errors.Is(err, unix.EMSGSIZE):
			c.alert(k, 22)
			c.rerr = &AlertError{Alert: 22}
		case err != nil:
			return 0, c.opErr("read", err)
		case typ == ktls.TypeApplicationData && n == 0:
			if k.ctl.Pending() {
				return 0, io.ErrUnexpectedEOF
			}
			return 0, io.EOF // the peer closed TCP without close_notify
		case typ == ktls.TypeApplicationData:
			return n, nil
		default:
			c.rerr = k.ctl.Feed(typ, p[:n], ops{c, k})
		}
	}
	return 0, c.rerr
}

func (c *Conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.raw.LocalAddr(), Addr: c.raw.RemoteAddr(), Err: err}
}

// alert sends a fatal alert, best effort, and shuts the socket down both ways: the
// connection is over, and the peer must see its end even when the alert cannot go out
// (after a record fails authentication the kernel refuses every later send).
func (c *Conn) alert(k *kernel, desc uint8) {
	c.sendControl(k, ktls.TypeAlert, []byte{2, desc}, false)
	k.rc.Control(func(fd uintptr) { unix.Shutdown(int(fd), unix.SHUT_RDWR) })
}

// ops are what ktls.Control needs of the kernel path's reader.
type ops struct {
	c *Conn
	k *kernel
}

func (o ops) Alert(desc uint8) { o.c.alert(o.k, desc) }
func (o ops) Warn(desc uint8)  { o.c.sendControl(o.k, ktls.TypeAlert, []byte{1, desc}, false) }

func (o ops) SetRX(cr *tcpglue.TLSCrypto) error {
	var err error
	if cerr := o.k.rc.Control(func(fd uintptr) { err = tcpglue.SetTLSRx(int(fd), cr) }); cerr != nil {
		return cerr
	}
	return err
}

// KeyUpdateOwed: our KeyUpdate is owed before our next data record (RFC 8446 §4.6.3):
// the next write sends it. The reader never waits for room to send.
func (o ops) KeyUpdateOwed() {
	o.c.smu.Lock()
	o.k.txUpdate = true
	o.c.smu.Unlock()
}

// LocalAddr returns the local network address.
func (c *Conn) LocalAddr() net.Addr { return c.raw.LocalAddr() }

// RemoteAddr returns the remote network address.
func (c *Conn) RemoteAddr() net.Addr { return c.raw.RemoteAddr() }

// SetDeadline sets the read and write deadlines (handshake included).
func (c *Conn) SetDeadline(t time.Time) error { return c.raw.SetDeadline(t) }

// SetReadDeadline sets the read deadline.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.raw.SetReadDeadline(t) }

// SetWriteDeadline sets the write deadline.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.raw.SetWriteDeadline(t) }
