package zc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/internal/ktls"
	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/rawfd"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc/internal/connstate"
)

// tlsInfo is a TLS connection's state after its handshake (ConnStats.TLS shows it).
type tlsInfo struct {
	Kernel      bool
	Reason      string
	Version     uint16
	CipherSuite uint16
	State       tls.ConnectionState
}

func init() {
	features.tlsSetup = func(e *Engine, o *TLSOptions, isClient, readSelf bool, zcrxNIC string) (tlsSetupHooks, error) {
		s, err := e.tlsSetupFor(o, isClient, readSelf, zcrxNIC)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}

// tlsPart is the index of the engine's tlsEngine in Engine.parts.
var tlsPart = registerEnginePart(func() enginePart { return new(tlsEngine) })

// tlsEng is the engine's TLS bookkeeping.
func (e *Engine) tlsEng() *tlsEngine { return e.parts[tlsPart].(*tlsEngine) }

// tlsState is c's TLS state (nil: plain TCP).
func (c *Conn) tlsState() *tlsConn {
	t, _ := c.tls.(*tlsConn)
	return t
}

// The core's calls into a TLS connection (tlsHooks), a listener's or a dial's TLS
// (tlsSetupHooks) and a handshake's result (tlsAttach).
func (t *tlsConn) directOK(c *Conn, n int) bool             { return c.tlsDirectOK(n) }
func (t *tlsConn) rekey(c *Conn) bool                       { return c.tlsRekey() }
func (t *tlsConn) sockClosed(c *Conn)                       { t.endRekeyWait(c) }
func (t *tlsConn) recvEnd(c *Conn, err error) (bool, error) { return c.tlsRecvEnd(err) }
func (t *tlsConn) closeNotify(c *Conn)                      { c.tlsCloseNotify() }
func (t *tlsConn) finished(c *Conn)                         { c.tlsFinished() }
func (t *tlsConn) inKernel() bool                           { return t.kernel }
func (s *tlsSetup) accept(l *Listener, from *queue, fd int) { l.startTLS(from, fd) }
func (s *tlsSetup) dial(c *Conn, cs *connectState)          { c.startTLSDial(cs) }
func (r *tlsResult) attach(c *Conn)                         { c.attachTLS(r) }

// stats is ConnStats.TLS.
func (t *tlsConn) stats() (s connTLSStats) {
	i := t.info
	s.On, s.Kernel, s.Reason = true, i.Kernel, i.Reason
	s.Version, s.CipherSuite, s.State = i.Version, i.CipherSuite, i.State
	if t.kernel {
		s.KeyUpdates, s.Tickets = t.ctl.KeyUpdates.Load(), t.ctl.Tickets.Load()
		s.TxRekeys, s.RekeyAt = t.txRekeys.Load(), t.rekeyAt
	}
	return s
}

// kernelTLS reports whether the kernel carries c's records (the connection capability the
// send path asks: no SEND_ZC, no MSG_WAITALL).
func (c *Conn) kernelTLS() bool {
	t := c.tlsState()
	return t != nil && t.kernel
}

// tlsSpliceRefusal says whether a splice relay may read and write kernel-TLS connection c.
// Measured in the 7.3 guest (TestTLSSpliceControlRecord): splice(2) out of a kernel-TLS
// socket moves data records and fails with EINVAL at a non-data record (an alert, a
// KeyUpdate, close_notify), which stays at the head: a recvmsg with room for the record
// type reads it (tlsRelayControl) and splicing resumes after it. Into the socket, the
// relay splices under txMu after an owed TX update (tlsSpliceInto). Kernels before Linux
// 6.14 (not measured, and a KeyUpdate cannot be followed there) forward with SendData.
// (The user-space path's socket pair splices.)
func (c *Conn) tlsSpliceRefusal() error {
	if !c.kernelTLS() || kernelTLSRekey() == nil {
		return nil
	}
	return &NotSupportedError{What: "splice relay of a kernel-TLS connection",
		Need: "Linux 6.14 (splice out of kernel TLS, its control records read between splices, new keys after a KeyUpdate); RelaySendData",
		Err:  kernelTLSRekey()}
}

// tlsRelayControl handles what ended a splice relay's splice out of kernel-TLS connection
// c (home queue; c's own receive is paused for good, so its control state is the relay's
// now): at a non-data record splice(2) fails with EINVAL and leaves the record at the head.
// The records there are read with recvmsg on fd (the relay's duplicate) and handled as the
// queue's receive does (tlsRecvEnd): an alert ends the relay with a *TLSAlertError, a
// KeyUpdate gives the kernel the next RX keys (a request is answered before the relay's
// next splice into c), a ticket is dropped; eof: close_notify. Splicing resumes after.
func (c *Conn) tlsRelayControl(fd int, serr error) (eof bool, err error) {
	t := c.tlsState()
	switch {
	case errors.Is(serr, unix.EINVAL), errors.Is(serr, unix.EIO), errors.Is(serr, unix.EKEYEXPIRED):
	case errors.Is(serr, unix.EBADMSG):
		return false, tlsFDAlert(c, fd, 20)
	case errors.Is(serr, unix.EMSGSIZE):
		return false, tlsFDAlert(c, fd, 22)
	default:
		return false, serr
	}
	ops := tlsFDOps{c: c, fd: fd}
	handled := 0
	for {
		_, typ, perr := tcpglue.RecvTLS(fd, t.scratch[:1], unix.MSG_DONTWAIT|unix.MSG_PEEK)
		switch {
		case errors.Is(perr, unix.EINTR):
			continue
		case errors.Is(perr, unix.EBADMSG):
			return false, tlsFDAlert(c, fd, 20)
		case perr == nil && typ != ktls.TypeApplicationData:
		case handled == 0:
			// No record to read where splice stopped: its error stands.
			return false, serr
		case errors.Is(perr, unix.EAGAIN), perr == nil:
			return false, nil // data (or nothing yet): splicing goes on
		default:
			return false, perr
		}
		n, typ, rerr := tcpglue.RecvTLS(fd, t.scratch, unix.MSG_DONTWAIT)
		switch {
		case errors.Is(rerr, unix.EBADMSG):
			return false, tlsFDAlert(c, fd, 20)
		case errors.Is(rerr, unix.EMSGSIZE):
			return false, tlsFDAlert(c, fd, 22)
		case rerr != nil:
			return false, rerr
		case typ == ktls.TypeApplicationData:
			return false, fmt.Errorf("TLS: %d bytes of data where a control record was", n)
		}
		handled++
		c.e.tlsEng().ctlRecords.Add(1)
		before := t.ctl.KeyUpdates.Load()
		ferr := t.ctl.Feed(typ, t.scratch[:n], ops)
		c.e.tlsEng().keyUpdates.Add(t.ctl.KeyUpdates.Load() - before)
		switch {
		case ferr == io.EOF:
			return true, nil // close_notify
		case ferr != nil:
			return false, ferr
		}
	}
}

// tlsSpliceInto splices up to n bytes from pipe into fd, kernel-TLS connection c's socket
// (a splice relay's duplicate; home queue): under txMu, after an owed TX update, and
// within the rekey bound (tlsSendCap). EAGAIN: no room (for the data or the KeyUpdate).
func (c *Conn) tlsSpliceInto(pipe, fd, n int) (int, error) {
	t := c.tlsState()
	t.txMu.Lock()
	defer t.txMu.Unlock()
	again, err := c.tlsUpdateTX(fd)
	switch {
	case err != nil:
		return 0, err
	case again:
		return 0, unix.EAGAIN
	}
	if m := c.tlsSendCap(); m >= 0 {
		n = min(n, m)
	}
	k, err := rawfd.Splice(pipe, fd, n)
	if k > 0 {
		t.tlsSent(k)
	}
	return k, err
}

// tlsFDOps are what ktls.Control needs of a kernel-TLS connection whose socket a splice
// relay reads (fd: its duplicate; home queue).
type tlsFDOps struct {
	c  *Conn
	fd int
}

func (o tlsFDOps) Alert(desc uint8) { tlsFDAlert(o.c, o.fd, desc) }
func (o tlsFDOps) Warn(desc uint8) {
	o.c.tlsState().txMu.Lock()
	tcpglue.SendTLSRecord(o.fd, ktls.TypeAlert, []byte{1, desc}, unix.MSG_DONTWAIT)
	o.c.tlsState().txMu.Unlock()
}
func (o tlsFDOps) SetRX(cr *tcpglue.TLSCrypto) error { return tcpglue.SetTLSRx(o.fd, cr) }
func (o tlsFDOps) KeyUpdateOwed() {
	// Answered before the relay's next splice into the socket (tlsSpliceInto).
	o.c.tlsState().asked.Store(true)
	o.c.tlsState().txOwed.Store(true)
}

// tlsFDAlert sends a fatal alert on fd, best effort, shuts the socket down both ways and
// returns the alert as the error.
func tlsFDAlert(c *Conn, fd int, desc uint8) error {
	c.tlsState().txMu.Lock()
	tcpglue.SendTLSRecord(fd, ktls.TypeAlert, []byte{2, desc}, unix.MSG_DONTWAIT)
	c.tlsState().txMu.Unlock()
	rawfd.Shutdown(fd)
	return &tcpglue.TLSAlertError{Alert: desc}
}

// tlsEngine is the engine's TLS bookkeeping: counters, and the goroutines a TLS
// connection runs outside the queues (handshakes; the user-space path's record pumps),
// which Engine.Close ends and waits for.
type tlsEngine struct {
	mu     sync.Mutex
	runs   map[*tlsRun]struct{}
	closed bool
	wg     sync.WaitGroup

	kernel, user, refused, hsErrs, ctlRecords, keyUpdates, keyUpdatesSent, txRekeys, closeNotifies atomic.Uint64
}

// tlsRun is one goroutine (or pair) outside the queues; stop wakes it.
type tlsRun struct {
	stop  func()
	early bool // a handshake: ended as the engine starts closing (a pump ends after the queues)
}

func (t *tlsEngine) add(stop func(), early bool) (*tlsRun, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, false
	}
	if t.runs == nil {
		t.runs = map[*tlsRun]struct{}{}
	}
	r := &tlsRun{stop: stop, early: early}
	t.runs[r] = struct{}{}
	t.wg.Add(1)
	return r, true
}

func (t *tlsEngine) done(r *tlsRun) {
	t.mu.Lock()
	_, ok := t.runs[r]
	delete(t.runs, r)
	t.mu.Unlock()
	if ok {
		t.wg.Done()
	}
}

// stopRuns wakes the runs (the handshakes only, or all) and refuses new ones.
func (t *tlsEngine) stopRuns(all bool) {
	t.mu.Lock()
	t.closed = true
	var stops []func()
	for r := range t.runs {
		if all || r.early {
			stops = append(stops, r.stop)
		}
	}
	t.mu.Unlock()
	for _, f := range stops {
		f()
	}
}

// closeStart: Engine.Close began; handshakes end now (tlsEngine is an enginePart).
func (t *tlsEngine) closeStart() { t.stopRuns(false) }

// closeEnd: the queues stopped; what is left ends, and Close waits for it.
func (t *tlsEngine) closeEnd() {
	t.stopRuns(true)
	t.wg.Wait()
}

// stats fills Stats.TLS.
func (t *tlsEngine) stats(s *Stats) {
	s.TLS.Kernel, s.TLS.User, s.TLS.Refused = t.kernel.Load(), t.user.Load(), t.refused.Load()
	s.TLS.HandshakeErrors, s.TLS.ControlRecords = t.hsErrs.Load(), t.ctlRecords.Load()
	s.TLS.KeyUpdates, s.TLS.KeyUpdatesSent, s.TLS.CloseNotifies = t.keyUpdates.Load(), t.keyUpdatesSent.Load(), t.closeNotifies.Load()
	s.TLS.TxRekeys = t.txRekeys.Load()
	if s.TLS.Kernel > 0 {
		s.TLS.KernelCounters, _ = ktls.KernelStats() // nil when the file cannot be read
	}
}

// tlsSetup is a listener's or a dial's TLS: the options and the config the handshakes use
// (a listener's is shared by its connections, so that they share session ticket keys).
type tlsSetup struct {
	opts     TLSOptions
	cfg      *tls.Config
	isClient bool
}

// kernelTLSProbe is whether this kernel takes the "tls" ULP (probed once).
var kernelTLSProbe = sync.OnceValue(func() error { _, err := tcpglue.ProbeTLS(); return err })

// kernelTLSRekey is whether this kernel takes new TX keys on a socket (Linux 6.14).
var kernelTLSRekey = sync.OnceValue(tcpglue.ProbeTLSRekey)

// tlsSetupFor checks TLS options against the engine and the other options.
func (e *Engine) tlsSetupFor(o *TLSOptions, isClient, readSelf bool, zcrxNIC string) (*tlsSetup, error) {
	if o == nil {
		return nil, nil
	}
	switch {
	case o.Config == nil:
		return nil, &ConfigError{Field: "TLS.Config", Value: nil, Reason: "a *tls.Config is required"}
	case o.NoFallback && o.UserSpace:
		return nil, &ConfigError{Field: "TLS.UserSpace", Value: true, Reason: "contradicts TLS.NoFallback"}
	case o.HandshakeTimeout < 0:
		return nil, &ConfigError{Field: "TLS.HandshakeTimeout", Value: o.HandshakeTimeout, Reason: "negative"}
	case o.RekeyRecords > 0 && o.RekeyRecords < 4:
		return nil, &ConfigError{Field: "TLS.RekeyRecords", Value: o.RekeyRecords, Reason: "leaves no record for data under a key (4 or more)"}
	case e.backend == BackendShim:
		return nil, errs.NotSupported("TLS connections", "the io_uring or plain backend (the zcshim module's sends bypass kernel TLS)", nil)
	case readSelf:
		return nil, errs.NotSupported("ReadSelf with TLS", "a receive by the queue (records are decrypted there)", nil)
	case zcrxNIC != "" || e.cfg.RecvPath == RecvZcrx:
		return nil, errs.NotSupported("zcrx receive with TLS", "plain TCP (the NIC's payload is ciphertext)", nil)
	case e.cfg.RecvPath == RecvMapped:
		return nil, errs.NotSupported("mapped receive with TLS", "plain TCP (TCP_ZEROCOPY_RECEIVE maps ciphertext)", nil)
	case e.cfg.SendPath == SendZeroCopy:
		return nil, errs.NotSupported("SendZeroCopy with TLS", "plain TCP (kernel TLS refuses SEND_ZC: EOPNOTSUPP)", nil)
	}
	if o.NoFallback {
		if err := kernelTLSProbe(); err != nil {
			return nil, errs.NotSupported("kernel TLS (TLSOptions.NoFallback forbids user space)", "", err)
		}
	}
	s := &tlsSetup{opts: *o, isClient: isClient, cfg: o.Config}
	if s.opts.HandshakeTimeout == 0 {
		s.opts.HandshakeTimeout = 10 * time.Second
	}
	if !isClient {
		s.cfg = ktls.ServerConfig(o.Config)
	}
	return s, nil
}

// tlsConn is a connection's TLS state (Conn.tls).
type tlsConn struct {
	info   tlsInfo
	kernel bool

	// The kernel path (loop only, except the counters in ctl).
	ctl      ktls.Control
	suite    ktls.Suite
	txSecret []byte     // TLS 1.3 TX traffic secret (the next TX keys derive from it)
	kuWait   *rekeyWait // an owed KeyUpdate's wait for room (nil: none ever waited)
	// KeyUpdates that found no room (each then waits for writability, once: the tests'
	// observable that no KeyUpdate is tried again without an event).
	kuNoRoom atomic.Uint64

	// TX rekey: set on the loop, read by Stats and by direct writes (under the conn's mu).
	rekeyAt   uint64        // update the TX keys at this many records (0: never)
	txRecords atomic.Uint64 // an upper bound of the records sent under the current TX keys
	txOwed    atomic.Bool   // a KeyUpdate is owed: the peer asked, or rekeyAt was reached
	asked     atomic.Bool   // the owed KeyUpdate answers the peer's request
	txRekeys  atomic.Uint64 // TX key updates made
	// txMu orders TX key changes with the sends of whoever else writes the socket: a
	// splice relay's home queue, which splices into it under txMu (txSecret is under it).
	txMu sync.Mutex

	notified bool   // close_notify sent
	scratch  []byte // the control records' receive buffer

	// The user-space path.
	pump *tlsPump
}

// tlsResult is what a handshake hands the queue.
type tlsResult struct {
	t            *tlsConn
	sock         *tcpglue.Socket // the user-space path's end of the pair (the TCP descriptor stays the handshake's)
	fd           int
	laddr, raddr netip.AddrPort
	err          error
}

// drop releases what a result holds that no connection took (loop or not).
func (r *tlsResult) drop() {
	if r.sock != nil {
		r.sock.Close()
	}
	if r.t != nil && r.t.pump != nil {
		r.t.pump.finished()
	}
}

// tlsDup returns a duplicate of the connected TCP socket fd as a net.Conn in Go's poller,
// for crypto/tls's handshake (taken on the loop, before the handshake's goroutine starts,
// so that the loop may close fd meanwhile: the socket stays the duplicate's).
func tlsDup(fd int) (net.Conn, error) {
	d, err := rawfd.Dup(fd)
	if err != nil {
		return nil, os.NewSyscallError("dup", err)
	}
	f := os.NewFile(uintptr(d), "tls")
	nc, err := net.FileConn(f) // a duplicate of its own
	f.Close()
	return nc, err
}

// withFD runs fn on nc's descriptor.
func withFD(nc net.Conn, fn func(fd int) error) error {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return fmt.Errorf("%T has no descriptor", nc)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// goTLS runs fn (a handshake on nc) on a goroutine of its own that Engine.Close wakes
// (nc's deadline passes) and waits for; false when the engine is closing (nc closed).
func (e *Engine) goTLS(nc net.Conn, fn func()) bool {
	run, ok := e.tlsEng().add(func() { nc.SetDeadline(time.Unix(1, 0)) }, true)
	if !ok {
		nc.Close()
		return false
	}
	go func() {
		defer e.tlsEng().done(run)
		fn()
	}()
	return true
}

// tlsHandshake runs the TLS handshake on nc (tlsDup's; it closes it), then moves the
// records into the kernel (the socket's keys are set; the connection's own descriptor
// carries them) or, where it cannot and the options allow, starts the user-space path,
// whose socket pair end (res.sock) replaces the connection's descriptor: the caller closes
// its descriptor then (the pump's nc holds the TCP socket). It runs on its own goroutine:
// crypto/tls blocks.
func (e *Engine) tlsHandshake(ctx context.Context, s *tlsSetup, nc net.Conn) (res tlsResult) {
	fail := func(err error) tlsResult {
		res.err = err
		return res
	}
	closeNC := true
	defer func() {
		if closeNC {
			nc.Close()
		}
	}()
	nc.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	if ap, err := netip.ParseAddrPort(nc.LocalAddr().String()); err == nil {
		res.laddr = ap
	}
	if ap, err := netip.ParseAddrPort(nc.RemoteAddr().String()); err == nil {
		res.raddr = ap
	}
	ulp := false
	if s.opts.NoFallback {
		// Refuse before the handshake's work when the socket cannot take the ULP.
		if err := withFD(nc, tcpglue.EnableTLS); err != nil {
			e.tlsEng().refused.Add(1)
			return fail(errs.NotSupported("kernel TLS (TLSOptions.NoFallback forbids user space)", "", err))
		}
		ulp = true
	}
	var h *ktls.Handshake
	if s.isClient {
		h = ktls.Client(nc, s.cfg, s.opts.UserSpace)
	} else {
		h = ktls.Server(nc, s.cfg)
	}
	if err := h.Run(ctx); err != nil {
		e.tlsEng().hsErrs.Add(1)
		if e.tlsEng().isClosed() {
			err = fmt.Errorf("%w (the engine closed during the TLS handshake)", ErrClosed)
		}
		return fail(fmt.Errorf("TLS handshake: %w", err))
	}
	nc.SetDeadline(time.Time{})
	st := h.TC.ConnectionState()
	t := &tlsConn{info: tlsInfo{Version: st.Version, CipherSuite: st.CipherSuite, State: st}}
	res.t = t
	reason := errors.New("user space requested (TLSOptions.UserSpace)")
	if !s.opts.UserSpace {
		tx, rx, err := h.Keys()
		if err == nil {
			var hard bool
			if err = withFD(nc, func(fd int) error {
				var ierr error
				hard, ierr = ktls.Install(fd, ulp, tx, rx)
				return ierr
			}); err == nil {
				t.kernel, t.info.Kernel = true, true
				t.suite, t.txSecret = ktls.Suites[st.CipherSuite], tx.Secret
				t.ctl.Version, t.ctl.Suite, t.ctl.RX = st.Version, t.suite, rx.Secret
				if st.Version == tls.VersionTLS13 && kernelTLSRekey() == nil {
					t.rekeyAt = s.opts.RekeyRecords
					if t.rekeyAt == 0 && !t.suite.ChaCha() {
						t.rekeyAt = 1 << 24
					}
				}
				e.tlsEng().kernel.Add(1)
				return res // nc closes: the socket stays fd's
			}
			if hard {
				// Keys went into the kernel half way: neither side can carry the records.
				return fail(fmt.Errorf("TLS: moving the records into the kernel: %w", err))
			}
		}
		reason = err
	}
	t.info.Reason = reason.Error()
	if s.opts.NoFallback {
		e.tlsEng().refused.Add(1)
		h.TC.Close() // close_notify from crypto/tls, which still holds the keys
		closeNC = false
		res.t = nil
		return fail(errs.NotSupported("kernel TLS (TLSOptions.NoFallback forbids user space)", "", reason))
	}
	// The user-space path: crypto/tls keeps the records, a pump carries them between the
	// TCP socket (nc, now the only owner of the socket once the caller closes fd) and a
	// socket pair whose other end becomes the connection's.
	h.Passthrough()
	sock, far, err := tcpglue.StreamPair(true)
	if err != nil {
		return fail(err)
	}
	app, err := net.FileConn(far)
	far.Close()
	if err != nil {
		sock.Close()
		return fail(err)
	}
	p, err := e.startPump(h.TC, nc, app)
	if err != nil {
		sock.Close()
		app.Close()
		return fail(err)
	}
	closeNC = false
	t.pump = p
	res.sock, res.fd = sock, sock.Fd()
	e.tlsEng().user.Add(1)
	return res
}

func (t *tlsEngine) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// attachTLS makes c a TLS connection (before it opens): no SEND_ZC, ever.
func (c *Conn) attachTLS(r *tlsResult) {
	c.tls = r.t
	c.mu.Lock()
	c.txLocked().zc.path = SendCopy // the send policy never picks SEND_ZC for it
	c.mu.Unlock()
	if r.t.kernel {
		r.t.scratch = make([]byte, ktls.MaxRecord+256)
	}
	if r.sock != nil {
		// The connection's socket is the pair's end: its addresses are the TCP socket's.
		c.laddr, c.raddr = r.laddr, r.raddr
	}
}

// tlsRecvEnd handles the end of a receive on a TLS connection (gotEOF, loop only). On the
// kernel path a non-data record ends a receive with EIO (EKEYEXPIRED after a KeyUpdate the
// kernel has no keys for yet): one recvmsg with room for the record type reads it, and
// ktls.Control handles it (an alert ends the connection with a *tcpglue.TLSAlertError, a
// close_notify is the EOF, a KeyUpdate gives the kernel the next RX keys, a session ticket
// is dropped); resume then says receiving goes on. On the user-space path the pump's
// error (an alert) replaces the pair's plain EOF.
func (c *Conn) tlsRecvEnd(err error) (resume bool, _ error) {
	t := c.tlsState()
	if !t.kernel {
		if perr := t.pump.error(); perr != nil {
			return false, perr
		}
		return false, err
	}
	switch {
	case err == nil:
		if t.ctl.Pending() {
			return false, io.ErrUnexpectedEOF
		}
		return false, nil // the peer closed TCP without close_notify
	case errors.Is(err, unix.EIO), errors.Is(err, unix.EKEYEXPIRED):
	case errors.Is(err, unix.EBADMSG):
		c.tlsAlert(20)
		return false, &tcpglue.TLSAlertError{Alert: 20}
	case errors.Is(err, unix.EMSGSIZE):
		c.tlsAlert(22)
		return false, &tcpglue.TLSAlertError{Alert: 22}
	default:
		return false, err
	}
	for {
		n, typ, rerr := tcpglue.RecvTLS(c.fd, t.scratch, unix.MSG_DONTWAIT)
		switch {
		case errors.Is(rerr, unix.EINTR):
			continue
		case errors.Is(rerr, unix.EAGAIN):
			return true, nil // the rest of the record is on its way
		case errors.Is(rerr, unix.EBADMSG):
			c.tlsAlert(20)
			return false, &tcpglue.TLSAlertError{Alert: 20}
		case errors.Is(rerr, unix.EMSGSIZE):
			c.tlsAlert(22)
			return false, &tcpglue.TLSAlertError{Alert: 22}
		case rerr != nil:
			return false, rerr
		case typ == ktls.TypeApplicationData && n == 0:
			if t.ctl.Pending() {
				return false, io.ErrUnexpectedEOF
			}
			return false, nil
		case typ == ktls.TypeApplicationData:
			// Data after all (the record at the head changed): deliver it.
			c.q.ctr.RecvPlain.Add(uint64(n))
			c.deliver(heapDataOf(t.scratch[:n]))
			return !c.ended(), nil
		}
		c.e.tlsEng().ctlRecords.Add(1)
		before := t.ctl.KeyUpdates.Load()
		ferr := t.ctl.Feed(typ, t.scratch[:n], tlsOps{c})
		c.e.tlsEng().keyUpdates.Add(t.ctl.KeyUpdates.Load() - before)
		switch {
		case ferr == io.EOF:
			return false, nil // close_notify
		case ferr != nil:
			return false, ferr
		}
		// Look at what follows before receiving goes on: a recvmsg moves the kernel's
		// record parser on, which after a KeyUpdate only a read does (readiness stays
		// unreported until then, and an epoll backend would wait for it forever). A data
		// record is left where it is (MSG_PEEK); a control record is read here.
		_, ptyp, perr := tcpglue.RecvTLS(c.fd, t.scratch[:1], unix.MSG_DONTWAIT|unix.MSG_PEEK)
		if perr == nil && ptyp != ktls.TypeApplicationData {
			continue
		}
		return true, nil
	}
}

// tlsOps are what ktls.Control needs of a kernel-TLS connection (loop only).
type tlsOps struct{ c *Conn }

func (o tlsOps) Alert(desc uint8) { o.c.tlsAlert(desc) }
func (o tlsOps) Warn(desc uint8) {
	tcpglue.SendTLSRecord(o.c.fd, ktls.TypeAlert, []byte{1, desc}, unix.MSG_DONTWAIT)
}
func (o tlsOps) SetRX(cr *tcpglue.TLSCrypto) error { return tcpglue.SetTLSRx(o.c.fd, cr) }
func (o tlsOps) KeyUpdateOwed() {
	c := o.c
	c.tlsState().asked.Store(true)
	c.tlsState().txOwed.Store(true)
	// The KeyUpdate goes out between two sends, from pump: not now, while a send of the
	// io_uring backend may still be in the kernel (its records must go under the old keys,
	// before the KeyUpdate).
	c.q.Post(func() {
		if !c.ended() {
			c.pump()
		}
	})
}

// tlsAlert sends a fatal alert, best effort, and shuts the socket down both ways (after a
// record fails authentication the kernel sends nothing more: the peer must see the end).
func (c *Conn) tlsAlert(desc uint8) {
	tcpglue.SendTLSRecord(c.fd, ktls.TypeAlert, []byte{2, desc}, unix.MSG_DONTWAIT)
	c.sock.Shutdown(unix.SHUT_RDWR)
}

// tlsSent counts what a send of n bytes may have cost in records under the current TX keys
// (its records, plus one that an earlier send left open) and owes a KeyUpdate once fewer
// than three records are left under the bound (tlsSendCap keeps sends within it). The
// loop calls it for what left the queue; a direct write (under mu) too.
func (t *tlsConn) tlsSent(n int) {
	if !t.kernel || t.rekeyAt == 0 || n <= 0 {
		return
	}
	if t.txRecords.Add(uint64((n+ktls.MaxRecord-1)/ktls.MaxRecord)+1)+3 > t.rekeyAt {
		t.txOwed.Store(true)
	}
}

// tlsSendCap is how many bytes the next send of c may carry under the current TX keys so
// that the bound of records holds (at most 1 GiB; -1: no bound). A send of n bytes costs
// at most ceil(n/MaxRecord)+1 records, and tlsSent owes the update before fewer than three
// are left, so there is room for a record at least (MaxRecord also when an update is owed
// and waits: the caller sends it first).
func (c *Conn) tlsSendCap() int {
	t := c.tlsState()
	if t == nil {
		return -1
	}
	return t.sendCap()
}

// sendCap is tlsSendCap of the connection t serves.
func (t *tlsConn) sendCap() int {
	if !t.kernel || t.rekeyAt == 0 {
		return -1
	}
	n, left := t.txRecords.Load(), uint64(1)
	if n+3 <= t.rekeyAt {
		left = min(t.rekeyAt-n-2, 1<<16)
	}
	return int(left) * ktls.MaxRecord
}

// tlsDirectOK: a direct write of n bytes keeps the bound of records (no update owed, n
// within tlsSendCap); otherwise the write goes through the queue, which updates first.
func (c *Conn) tlsDirectOK(n int) bool {
	t := c.tlsState()
	if t == nil || !t.kernel {
		return true
	}
	m := c.tlsSendCap()
	return !t.txOwed.Load() && (m < 0 || n <= m)
}

// tlsRekeyDue: a KeyUpdate is owed (direct writes wait for it: they go through the queue).
func (c *Conn) tlsRekeyDue() bool {
	t := c.tlsState()
	return t != nil && t.kernel && t.txOwed.Load()
}

// tlsRekey sends an owed KeyUpdate (update_not_requested) under the current TX keys and
// gives the kernel the next ones (loop only, with no send of the connection in the kernel:
// pump and the plain backend's send loop call it between sends). It reports whether
// sending may go on: false when the KeyUpdate found no room (it waits for the socket's
// writability, and sending waits for it: the wait's event pumps, and the KeyUpdate is
// tried again then) or failed (the connection fails). The KeyUpdate answers the peer's
// request (RFC 8446 §4.6.3: before our next data) or RekeyRecords' bound, whichever came
// first. The kernel closes a record still open before a control record, so the KeyUpdate
// lands between records. Under mu: a direct write cannot slip in between the KeyUpdate and
// the new keys (direct writes wait for an owed one: tlsDirectOK sends them to the queue).
func (c *Conn) tlsRekey() bool {
	t := c.tlsState()
	if t == nil || !c.tlsRekeyDue() {
		if t != nil {
			t.endRekeyWait(c) // a splice relay's send of the KeyUpdate ended the wait
		}
		return true
	}
	if t.kuWait != nil && t.kuWait.w.armed() {
		return false // the socket's writability brings us back
	}
	if c.ended() || c.st.Socket() != connstate.SockOpen {
		return true // nothing more goes out under these keys
	}
	c.mu.Lock()
	t.txMu.Lock()
	again, err := c.tlsUpdateTX(c.fd)
	t.txMu.Unlock()
	c.mu.Unlock()
	switch {
	case again:
		t.kuNoRoom.Add(1)
		if t.kuWait == nil {
			t.kuWait = &rekeyWait{c: c}
		}
		if err := t.kuWait.w.arm(c, t.kuWait, tagRekeyOut); err != nil {
			c.fail(c.opErr("write", fmt.Errorf("TLS: waiting for room for a KeyUpdate: %w", err)))
			return false
		}
		return false
	case err != nil:
		c.fail(c.opErr("write", err))
		return false
	}
	t.endRekeyWait(c)
	return true
}

// rekeyWait is an owed KeyUpdate's wait for room in the socket (loop only): armed when the
// KeyUpdate found no room, once; its event pumps, which sends the KeyUpdate, then what
// waited behind it. It ends (endRekeyWait: its duplicate of the socket closed) once the
// KeyUpdate is out, and when the socket is closed (Close, a reset, Engine.Close).
type rekeyWait struct {
	c *Conn
	w sockWait
}

// OnEvent: the socket has room, or an error (the KeyUpdate's send then fails the
// connection), or the wait was cancelled.
func (r *rekeyWait) OnEvent(_ *loop.Queue, ev loop.Event) {
	c := r.c
	if r.w.fired(c, ev) && !c.ended() && !c.st.SockClosed() {
		c.pump()
	}
	if c.inClose() {
		c.advanceClose()
	}
}

// endRekeyWait ends the KeyUpdate's wait for room, if one is out or its duplicate open
// (loop only).
func (t *tlsConn) endRekeyWait(c *Conn) {
	if t.kuWait != nil {
		t.kuWait.w.release(c)
	}
}

// tlsUpdateTX sends an owed KeyUpdate on fd (c's socket or a duplicate) and gives the
// kernel the next TX keys (under txMu, with no send of c in the kernel). again: no room
// for the KeyUpdate yet (it stays owed). An error leaves the connection unusable: the
// KeyUpdate may be out, and the peer then expects the next keys.
func (c *Conn) tlsUpdateTX(fd int) (again bool, err error) {
	t := c.tlsState()
	if !t.txOwed.Load() {
		return false, nil
	}
	n, err := tcpglue.SendTLSRecord(fd, ktls.TypeHandshake, ktls.KeyUpdateMsg, unix.MSG_DONTWAIT)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
		return true, nil
	}
	if err == nil && n != len(ktls.KeyUpdateMsg) {
		err = fmt.Errorf("sent %d bytes of a %d-byte KeyUpdate", n, len(ktls.KeyUpdateMsg))
	}
	if err == nil {
		next := ktls.NextSecret13(t.suite, t.txSecret)
		if err = tcpglue.SetTLSTx(fd, ktls.TrafficKeys13(t.suite, next, 0)); err == nil {
			t.txSecret = next
			t.txRecords.Store(0)
			t.txOwed.Store(false)
			t.txRekeys.Add(1)
			c.e.tlsEng().txRekeys.Add(1)
			if t.asked.Swap(false) {
				c.e.tlsEng().keyUpdatesSent.Add(1)
			}
			return false, nil
		}
	}
	return false, fmt.Errorf("TLS: updating the TX keys: %w", err)
}

// tlsCloseNotify sends close_notify before the write side ends (Close, CloseWrite; kernel
// path, loop only, once). Best effort: a full socket buffer (a peer that reads nothing)
// does not hold the close up.
func (c *Conn) tlsCloseNotify() {
	t := c.tlsState()
	if t == nil || !t.kernel || t.notified || c.st.SockClosed() {
		return
	}
	t.notified = true
	if _, err := tcpglue.SendTLSRecord(c.fd, ktls.TypeAlert, []byte{1, 0}, unix.MSG_DONTWAIT); err == nil {
		c.e.tlsEng().closeNotifies.Add(1)
	}
}

// tlsFinished: the connection finished (loop only); the user-space path's pump ends once
// it carried what the connection sent.
func (c *Conn) tlsFinished() {
	if t := c.tlsState(); t != nil && t.pump != nil {
		t.pump.finished()
	}
}

// heapData is a dataSource for the few bytes a kernel-TLS control read finds to be data:
// Go memory, reference counted, its receive credit returned with the last reference.
type heapData struct {
	b    []byte
	refs atomic.Int32
}

func heapDataOf(b []byte) Data {
	h := &heapData{b: append([]byte(nil), b...)}
	h.refs.Store(1)
	return Data{src: h, n: len(b)}
}

func (h *heapData) bytes() []byte {
	if h.refs.Load() <= 0 {
		return nil
	}
	return h.b
}
func (h *heapData) credit(Data) int64 { return int64(len(h.b)) }

// send copies the bytes (Go memory: nothing a send can lend).
func (h *heapData) send(c *Conn, d Data) error { return c.sendCopy(d) }
func (h *heapData) release(d Data) error {
	for {
		n := h.refs.Load()
		if n <= 0 {
			return fmt.Errorf("zc: release: %w", memreg.ErrStale)
		}
		if h.refs.CompareAndSwap(n, n-1) {
			if n == 1 && d.c != nil {
				d.c.releaseHeld(int64(len(h.b)))
			}
			return nil
		}
	}
}
func (h *heapData) retain(Data) (dataSource, error) {
	for {
		n := h.refs.Load()
		if n <= 0 {
			return nil, fmt.Errorf("zc: retain: %w", memreg.ErrStale)
		}
		if h.refs.CompareAndSwap(n, n+1) {
			return h, nil
		}
	}
}

// startTLS runs an accepted connection's handshake on a goroutine of its own; the
// connection is made on its queue after it (loop only).
func (l *Listener) startTLS(from *queue, fd int) {
	target := l.target(from)
	nc, err := tlsDup(fd)
	if err != nil {
		rawfd.Close(fd)
		l.acceptErrs.Add(1)
		from.ctr.acceptErrs.Add(1)
		return
	}
	ok := l.e.goTLS(nc, func() {
		res := l.e.tlsHandshake(context.Background(), l.tls.(*tlsSetup), nc)
		if res.err != nil {
			rawfd.Close(fd)
			return
		}
		if res.sock != nil {
			rawfd.Close(fd) // the pump holds the TCP socket
			fd = res.sock.Fd()
		}
		if err := target.Post(func() { l.createTLS(target, fd, &res) }); err != nil {
			l.dropTLS(fd, &res)
		}
	})
	if !ok {
		rawfd.Close(fd)
	}
}

func (l *Listener) dropTLS(fd int, res *tlsResult) {
	if res.sock == nil {
		rawfd.Close(fd)
	}
	res.drop()
}

// createTLS makes a TLS connection after its handshake (loop only).
func (l *Listener) createTLS(q *queue, fd int, res *tlsResult) {
	if l.e.closed.Load() {
		l.dropTLS(fd, res)
		return
	}
	s := res.sock
	if s == nil {
		var err error
		if s, err = tcpglue.FromAcceptedFD(fd, l.family, true); err != nil {
			l.dropTLS(fd, res)
			return
		}
	}
	l.open(q, s, fd, res)
}

// startTLSDial runs a dial's handshake after its connect, on a goroutine of its own; the
// connection opens on its queue after it, or the dial fails (loop only).
func (c *Conn) startTLSDial(cs *connectState) {
	nc, err := tlsDup(c.fd)
	if err != nil {
		c.dialFailed(err)
		return
	}
	s := c.tlsDial.(*tlsSetup)
	ok := c.e.goTLS(nc, func() {
		res := c.e.tlsHandshake(cs.ctx, s, nc)
		if err := c.q.Post(func() { c.tlsDialDone(cs, &res) }); err != nil {
			res.drop()
		}
	})
	if !ok {
		c.dialFailed(ErrClosed)
	}
}

// tlsDialDone: the dial's handshake ended (loop only).
func (c *Conn) tlsDialDone(cs *connectState, res *tlsResult) {
	if c.connect != cs || c.ended() {
		res.drop() // the dial ended meanwhile (the engine's close)
		return
	}
	if res.err != nil {
		if err := cs.ctx.Err(); err != nil {
			res.err = fmt.Errorf("%w: %w", err, res.err)
		}
		c.dialFailed(res.err)
		return
	}
	if res.sock != nil {
		c.sock.Close() // the pump holds the TCP socket
		c.sock, c.fd = res.sock, res.sock.Fd()
	}
	c.attachTLS(res)
	c.dialDone(0)
}
