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
	hs       *hsConn
	tc       *tls.Conn
	isClient bool
	opts     Options
	cfgErr   error
	ulp      bool // the "tls" ULP is attached (by the handshake goroutine)

	hmu    sync.Mutex
	hsDone atomic.Bool
	hsErr  error
	kern   atomic.Pointer[kernel]
	info   Info // written by the handshake (under hmu) before hsDone

	rmu     sync.Mutex // the read side (kernel path)
	rerr    error      // sticky read error
	ctl     []byte     // a partial control record
	ctlType uint8

	// The kernel path's write side has two locks. wmu serializes the writers (Write,
	// ReadFrom, CloseWrite) and is held while they wait for room. smu is held only around
	// one non-blocking system call that sends, and around TX key changes: the reader
	// takes it to send an alert or to note a KeyUpdate the peer asked for, so a reader
	// never waits for a writer that waits for the peer.
	wmu        sync.Mutex
	smu        sync.Mutex
	closed     atomic.Bool
	keyUpdates atomic.Uint64
	txRekeys   atomic.Uint64
	tickets    atomic.Uint64
}

// kernel is a connection's kernel TLS state.
type kernel struct {
	rc      syscall.RawConn
	version uint16
	s       suite
	tx      dirKeys // TLS 1.3 TX secret (under smu)
	rx      dirKeys // TLS 1.3 RX secret (under rmu)

	txRecords uint64 // an upper bound of the records sent under the current TX keys (under smu)
	rekeyAt   uint64 // update the TX keys at this many records (0: never)
	txUpdate  bool   // a KeyUpdate is owed before the next data record (under smu)
}

// maxRecord is the largest plaintext a record carries.
const maxRecord = 16384

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
	if cfg == nil {
		return newConn(conn, nil, false, opts)
	}
	return newConn(conn, serverConfig(cfg), false, opts)
}

// Client returns the client side of a TLS connection on conn; see Server. cfg must set
// ServerName or InsecureSkipVerify, as for tls.Client.
func Client(conn net.Conn, cfg *tls.Config, opts *Options) *Conn {
	if cfg == nil {
		return newConn(conn, nil, true, opts)
	}
	c := cfg.Clone()
	kl := &keyLog{user: cfg.KeyLogWriter}
	c.KeyLogWriter = kl
	var cache *noResume12
	if cfg.ClientSessionCache != nil && (opts == nil || !opts.UserSpace) {
		cache = &noResume12{ClientSessionCache: cfg.ClientSessionCache}
		c.ClientSessionCache = cache
	}
	zc := newConn(conn, c, true, opts)
	if zc.hs != nil {
		kl.sec = zc.hs.sec
	}
	if cache != nil {
		cache.conn = zc
	}
	return zc
}

// noResume12 keeps TLS 1.2 sessions out of a client's session cache: crypto/tls writes no
// key log line for a resumed TLS 1.2 session, so its records could not move to the
// kernel. crypto/tls stores a TLS 1.2 session during the handshake and a TLS 1.3 one
// after it (from a NewSessionTicket), which is how the two are told apart.
type noResume12 struct {
	tls.ClientSessionCache
	conn *Conn
}

func (n *noResume12) Put(key string, cs *tls.ClientSessionState) {
	if cs != nil && n.conn != nil && !n.conn.hsDone.Load() {
		return
	}
	n.ClientSessionCache.Put(key, cs)
}

// serverConfig returns a copy of cfg whose key log reaches ztls (shared by the
// connections of one listener, so that they share its session ticket keys).
//
// It also declines TLS 1.2 session tickets (a full handshake instead): crypto/tls writes
// no key log line for a resumed TLS 1.2 session, so its records could not move to the
// kernel. TLS 1.3 resumption is unchanged.
func serverConfig(cfg *tls.Config) *tls.Config {
	b := cfg.Clone()
	b.KeyLogWriter = &keyLog{user: cfg.KeyLogWriter}
	unwrap := cfg.UnwrapSession
	b.UnwrapSession = func(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
		if cs.Version == tls.VersionTLS12 {
			return nil, nil
		}
		if unwrap != nil {
			return unwrap(identity, cs)
		}
		return b.DecryptTicket(identity, cs)
	}
	if gc := cfg.GetConfigForClient; gc != nil {
		b.GetConfigForClient = func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
			nc, err := gc(chi)
			if err != nil || nc == nil {
				return nc, err
			}
			if _, ok := nc.KeyLogWriter.(*keyLog); ok {
				return nc, nil
			}
			nc = nc.Clone()
			nc.KeyLogWriter = &keyLog{user: nc.KeyLogWriter}
			return nc, nil
		}
	}
	return b
}

func newConn(conn net.Conn, cfg *tls.Config, isClient bool, opts *Options) *Conn {
	c := &Conn{raw: conn, isClient: isClient}
	if opts != nil {
		c.opts = *opts
	}
	if cfg == nil {
		c.cfgErr = ErrNilConfig
		return c
	}
	c.hs = &hsConn{Conn: conn, isClient: isClient, sec: &secrets{m: map[string][]byte{}}}
	if isClient {
		c.tc = tls.Client(c.hs, cfg)
	} else {
		c.tc = tls.Server(c.hs, cfg)
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
	if c.cfgErr != nil {
		return c.cfgErr
	}
	if c.closed.Load() {
		return net.ErrClosed
	}
	defer c.hs.unroute()
	if c.opts.NoFallback && !c.opts.UserSpace {
		// Refuse before the handshake's work when the socket cannot take the ULP.
		if err := c.attachULP(); err != nil {
			stats.refused.Add(1)
			c.raw.Close()
			return &NoKernelError{Reason: err.Error(), Err: err}
		}
	}
	if err := c.tc.HandshakeContext(ctx); err != nil {
		return userErr(err)
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
	c.hs.passthrough.Store(true)
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
	tx, rx, err := c.keys(st)
	if err != nil {
		return nil, false, err
	}
	k = &kernel{rc: rc, version: st.Version, s: suites[st.CipherSuite], tx: tx, rx: rx}
	if st.Version == tls.VersionTLS13 {
		k.rekeyAt = c.opts.RekeyRecords
		if k.rekeyAt == 0 && !k.s.chacha() {
			k.rekeyAt = 1 << 24
		}
	}
	var kerr error
	if cerr := rc.Control(func(fd uintptr) {
		if !c.ulp {
			if kerr = tcpglue.EnableTLS(int(fd)); kerr != nil {
				return
			}
		}
		if kerr = tcpglue.SetTLSRx(int(fd), rx.crypto); kerr != nil {
			return
		}
		if kerr = tcpglue.SetTLSTx(int(fd), tx.crypto); kerr != nil {
			hard = true
		}
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

// keys derives both directions' kernel state from the finished handshake.
func (c *Conn) keys(st tls.ConnectionState) (tx, rx dirKeys, err error) {
	c.hs.rmu.Lock()
	pend := len(c.hs.pending)
	c.hs.rmu.Unlock()
	if pend > 0 {
		return tx, rx, fmt.Errorf("crypto/tls left %d bytes of a record unread", pend)
	}
	return deriveKeys(c.isClient, st, c.hs.sec, &c.hs.obs)
}

// Info says where this connection's records are encrypted, and why.
func (c *Conn) Info() Info {
	if !c.hsDone.Load() {
		return Info{}
	}
	i := c.info
	i.KeyUpdates, i.Tickets, i.TxRekeys = c.keyUpdates.Load(), c.tickets.Load(), c.txRekeys.Load()
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
		return n, userErr(err)
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
		return n, userErr(err)
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
				k.sent(n, maxRecord)
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
	n, err := tcpglue.SendTLSRecord(fd, typeHandshake, []byte{msgKeyUpdate, 0, 0, 1, 0}, unix.MSG_DONTWAIT)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
		return unix.EAGAIN
	}
	if err == nil && n != 5 {
		err = fmt.Errorf("sent %d bytes of a 5-byte KeyUpdate", n)
	}
	if err == nil {
		next := nextSecret13(k.s, k.tx.secret)
		if err = tcpglue.SetTLSTx(fd, trafficKeys13(k.s, next, 0)); err == nil {
			k.tx.secret, k.txRecords, k.txUpdate = next, 0, false
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
		err = c.sendControl(k, typeAlert, []byte{1, 0}, true)
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
	c.sendControl(k, typeAlert, []byte{1, 0}, false) // between a writer's system calls
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
		case typ == typeApplicationData && n == 0:
			if len(c.ctl) > 0 {
				return 0, io.ErrUnexpectedEOF
			}
			return 0, io.EOF // the peer closed TCP without close_notify
		case typ == typeApplicationData:
			return n, nil
		default:
			c.rerr = c.control(k, typ, p[:n])
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
	c.sendControl(k, typeAlert, []byte{2, desc}, false)
	k.rc.Control(func(fd uintptr) { unix.Shutdown(int(fd), unix.SHUT_RDWR) })
}

// control handles (part of) a non-data record; a nil result means "read on".
func (c *Conn) control(k *kernel, typ uint8, b []byte) error {
	if len(c.ctl) > 0 && typ != c.ctlType {
		c.alert(k, 10)
		return &AlertError{Alert: 10}
	}
	c.ctlType = typ
	c.ctl = append(c.ctl, b...)
	if len(c.ctl) > 1<<16 {
		c.alert(k, 10)
		return &AlertError{Alert: 10}
	}
	switch typ {
	case typeAlert:
		for len(c.ctl) >= 2 {
			level, desc := c.ctl[0], c.ctl[1]
			c.ctl = c.ctl[2:]
			switch {
			case desc == 0:
				return io.EOF
			case desc == 90 && level == 1:
				continue // user_canceled, a warning: a close_notify follows
			}
			return &AlertError{Alert: desc, Received: true}
		}
	case typeHandshake:
		for len(c.ctl) >= 4 {
			l := int(c.ctl[1])<<16 | int(c.ctl[2])<<8 | int(c.ctl[3])
			if len(c.ctl) < 4+l {
				break
			}
			msg := c.ctl[:4+l]
			c.ctl = c.ctl[4+l:]
			if err := c.handshakeMsg(k, msg); err != nil {
				return err
			}
		}
	default:
		c.alert(k, 10)
		return &AlertError{Alert: 10}
	}
	if len(c.ctl) == 0 {
		c.ctl = nil
	}
	return nil
}

// Handshake message types after the handshake.
const (
	msgHelloRequest     = 0
	msgNewSessionTicket = 4
	msgKeyUpdate        = 24
)

// handshakeMsg handles a post-handshake message that arrived through the kernel.
func (c *Conn) handshakeMsg(k *kernel, msg []byte) error {
	tls13 := k.version == tls.VersionTLS13
	switch {
	case tls13 && msg[0] == msgNewSessionTicket:
		// crypto/tls cannot be handed a ticket from outside: no resumption for
		// connections whose records are in the kernel.
		c.tickets.Add(1)
		return nil
	case tls13 && msg[0] == msgKeyUpdate:
		if len(msg) != 5 || msg[4] > 1 {
			c.alert(k, 50)
			return &AlertError{Alert: 50}
		}
		return c.keyUpdate(k, msg[4] == 1)
	case !tls13 && msg[0] == msgHelloRequest:
		c.sendControl(k, typeAlert, []byte{1, 100}, false) // no_renegotiation, warning
		return ErrRenegotiation
	}
	c.alert(k, 10)
	return &AlertError{Alert: 10}
}

// keyUpdate applies a received KeyUpdate: the next RX keys (RFC 8446 §4.6.3, the kernel
// refuses reads with EKEYEXPIRED until it has them), and, when the peer asked for it,
// notes that a KeyUpdate of our own is owed (updateTXLocked sends it before our next data).
func (c *Conn) keyUpdate(k *kernel, requested bool) error {
	next := nextSecret13(k.s, k.rx.secret)
	var err error
	if cerr := k.rc.Control(func(fd uintptr) {
		err = tcpglue.SetTLSRx(int(fd), trafficKeys13(k.s, next, 0))
	}); cerr != nil {
		return c.opErr("keyupdate", cerr)
	}
	if err != nil {
		return fmt.Errorf("ztls: the peer updated its keys (KeyUpdate) and the kernel cannot follow: %w", err)
	}
	k.rx.secret = next
	c.keyUpdates.Add(1)
	if requested {
		// Owed before our next data record (RFC 8446 §4.6.3): the next write sends it.
		// The reader never waits for room to send.
		c.smu.Lock()
		k.txUpdate = true
		c.smu.Unlock()
	}
	return nil
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
