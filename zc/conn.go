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
	"time"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/memregops"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc/internal/connstate"
)

// ConnStats are one connection's counters.
type ConnStats struct {
	Queue         int    // the index of the queue that owns the connection (for its whole life)
	BytesSentZC   uint64 // sent with SEND_ZC and the kernel did not copy
	BytesZCCopied uint64 // sent with SEND_ZC but the kernel copied
	BytesSentCopy uint64 // sent by copying sends
	BytesRecv     uint64
	// BytesRecvMapped is the part of BytesRecv that arrived as mapped pages (RecvMapped).
	BytesRecvMapped uint64
	SendOps         uint64 // copying send operations (one may carry many buffers)
	SendZCOps       uint64
	ZCSwitches      uint64
	ZCProbes        uint64
	ZeroCopyOn      bool // whether the next large send would use SEND_ZC
	NotifsPending   int  // zero-copy notifications outstanding
	Queued          int  // bytes queued or in flight, not yet sent
	RecvHeld        int  // receive-buffer bytes held (not released, or forwarded and not sent)
	RecvPaused      bool // receiving is paused (by SetReceivePaused, held data, a full destination, or a net.Conn face that reads the socket itself)
	// BytesDropped counts bytes accepted for sending (Write, Send, SendData, SendFile) and
	// dropped unsent: the connection was reset, failed, closed with an error, or gave up
	// after CloseTimeout (Engine.Close's closes included). What a splice relay handed over
	// from its pipe and could not send is its RelayStats.Lost instead.
	BytesDropped uint64
	// TLS: a TLS connection's (ListenOptions.TLS, DialOptions.TLS) path and handshake;
	// zero (On false) for a plain connection.
	TLS struct {
		On          bool   // a TLS connection
		Kernel      bool   // the kernel encrypts and decrypts (TLS_TX and TLS_RX are set)
		Reason      string // why not, when Kernel is false
		Version     uint16 // tls.VersionTLS12 or tls.VersionTLS13
		CipherSuite uint16 // the crypto/tls cipher suite
		KeyUpdates  uint64 // TLS 1.3 KeyUpdates received and applied in the kernel
		Tickets     uint64 // TLS 1.3 session tickets received in the kernel and dropped
		TxRekeys    uint64 // TLS 1.3 TX key updates the engine made (KeyUpdate sent, next TX keys set): the peer asked, or RekeyAt was reached
		RekeyAt     uint64 // records under one TX key before the engine updates it (TLSOptions.RekeyRecords); 0: never (TLS 1.2, ChaCha20-Poly1305 by default, a kernel before Linux 6.14)
		// State is crypto/tls's view of the handshake (peer certificates, ALPN, ...).
		State tls.ConnectionState
	}
}

// sender is a connection's send side: allocated (under mu) by its first send, so an idle
// connection carries none of it. The loop reaches it only after taking work from the
// producer (under mu).
type sender struct {
	pend []seg // taken from the producer, not yet sent
	// pendBuf is pend's backing array from its first element: pend empties back onto it, so
	// a connection that sends one segment at a time (an echo) does not allocate a new
	// array for every send (kept while small: pendKeep)
	pendBuf []seg
	zwait   []zcWait
	zc      zcPolicy
	// Write's staging buffer (under the connection's mu): small writes coalesce in it.
	// Once a flush queued part of it and left room (flushStageLocked), the buffer is shared
	// (stageRef owns it): the part queued is a send's loan, Writes go on after it.
	stage    memreg.Buf
	stageRef *memreg.Ref
	stageOff int // bytes of the buffer already queued
	stageN   int // bytes of the buffer written
	hasStage bool
	// sources paused until our queue drains (SendData), under the connection's mu: only a
	// connection with queued bytes has any, so idle connections do not carry the slice
	destWaits []*Conn
	// counters, read by Stats from any goroutine
	sentZC, zcCopied, sentCopy, sendOps, sendZCOps atomic.Uint64
	dropped                                        atomic.Uint64 // ConnStats.BytesDropped
}

// txLocked returns the send side, making it (mu held).
func (c *Conn) txLocked() *sender {
	if c.tx == nil {
		t := &sender{}
		t.zc.init(&c.e.cfg)
		c.tx = t
		c.txp.Store(t)
	}
	return c.tx
}

// closeState is what a closing connection needs.
type closeState struct {
	// deadline: CloseTimeout after beginClose or after the last progress a graceful close
	// saw (a byte leaving, sentBytes, or the peer answering, peerAnswers: a peer that reads
	// or answers the kernel's probes is not reset for being slow), fixed once the engine
	// closes
	deadline time.Time
	timer    *loop.Timer // the close's watchdog
	// droppedBefore: BytesDropped when CloseTimeout passed (what the reset drops is the rest)
	droppedBefore uint64
	// acked: the peer's acknowledged bytes (TCP_INFO) at the last look (peerAnswers)
	acked uint64
	// progressAt: when a byte last left the queue or the peer last acknowledged one (or
	// beginClose); a peer that answers without taking anything for CloseStall is given up
	// (stalled)
	progressAt time.Time
	stalled    bool
	// kernelHeld: what the kernel held unacknowledged (SIOCOUTQ) when a close that gave up
	// reset the connection; CloseTimeoutError.Unsent counts it
	kernelHeld int
}

// seg is one buffer (or part of one) on its way out.
type seg struct {
	kind segKind     // what it sends from: the field that says which of loan, file, ext is set
	loan memreg.Loan // segLoan
	off  int32       // bytes already sent
	n    int32       // bytes to send
	src  *Conn       // a forwarded receive buffer: src's receive credit, released once sent
	sum  uint64      // Config.Debug.Buffers: the bytes' checksum at Send (0: none)
	// shared: the loan is one owner of a shared buffer (shared.go); src's credit goes back
	// with the buffer's last owner, not with this segment
	shared bool
	// own: what the segment sends from when it is not a loan (every kind but segLoan)
	own segOwner
}

// A segOwner holds a segment's bytes when they are not a pool's loan: bytes in a zcrx area,
// held until sent (segExt: SendData of zcrx Data, zcrx.go; the credit goes back with the
// buffer's last reference, as for a shared loan); the application's memory, pinned until the
// kernel is done with it (segApp: SendBytes, sendbytes.go; its callback says so); a SendFile
// range or a relay's pipe (segFile, sendfile.go: a fileMover). The core and the backends
// reach the bytes and give them back through it, never asking which feature made them.
type segOwner interface {
	// segBytes is the memory the segment sends from (nil: none of ours, a segFile).
	segBytes() []byte
	// segDone gives the segment's hold back: sent, or abandoned with s.n-s.off bytes unsent
	// (loop only, or before the loop saw it). queued is false for a segment that was never
	// queued (the call that made it failed and says so: no callback).
	segDone(c *Conn, s seg, queued bool)
}

// A fileMover owns a segFile segment: bytes that are not in memory of ours (a file range, a
// relay's pipe), which it moves itself from the loop, alone at the head of tx.pend
// (takeCut), so a backend's send never sees them.
type fileMover interface {
	segOwner
	// sendHead moves the bytes of c.tx.pend[0], its segment (loop only).
	sendHead(c *Conn)
	// countsDrops reports whether the owner counts the bytes a drop loses itself (a relay's
	// pipe: RelayStats.Lost), rather than ConnStats.BytesDropped.
	countsDrops() bool
}

// segKind is what a segment sends from. The core and the backends ask the kind, never
// which pointer is nil.
type segKind uint8

const (
	segLoan segKind = iota // a buffer of a registered pool (seg.loan), shared or not
	segFile                // a file range or a pipe's bytes (seg.own, a fileMover): no memory of ours
	segExt                 // memory held by reference, not a pool's loan (seg.own: a zcrx buffer)
	segApp                 // the application's own memory (seg.own: SendBytes)
)

// loanSeg, fileRangeSeg and extSeg make a segment of each kind.
func loanSeg(loan memreg.Loan, off, n int32) seg {
	return seg{kind: segLoan, loan: loan, off: off, n: n}
}
func fileRangeSeg(f fileMover, n int32) seg { return seg{kind: segFile, own: f, n: n} }
func extSeg(ref segOwner, off, n int32) seg { return seg{kind: segExt, own: ref, off: off, n: n} }

// holdsMem reports whether the segment still holds memory to give back (a loan not yet
// returned, or an external reference).
func (s *seg) holdsMem() bool {
	switch s.kind {
	case segLoan:
		return s.loan.Region() != nil
	case segExt, segApp:
		return true
	}
	return false
}

// mem is the memory the segment sends from ([off, n) of it), nil once it went back.
func (s *seg) mem() []byte {
	switch s.kind {
	case segExt, segApp:
		return s.own.segBytes()
	}
	return s.loan.Data()
}

// ptr is the address of byte i of the segment's memory, for an iovec.
func (s *seg) ptr(i int) *byte {
	switch s.kind {
	case segExt, segApp:
		return &s.own.segBytes()[i]
	}
	return s.loan.Pointer(i)
}

// zcWait is a zero-copy send whose notification has not arrived: its buffer stays lent.
type zcWait struct {
	ud   uint64
	s    seg
	sent int
	// done: the send itself completed; notif: its notification is expected (and counted);
	// early: the notification came before the completion, copied its verdict.
	done, notif, early, copied bool
}

// Pause reasons (bits of Conn.paused).
const (
	pauseUser   = 1 << iota // SetReceivePaused
	pauseCredit             // MaxRecvHeld reached
	pauseDest               // a SendData destination is over MaxQueuedBytes (see destWaits)
	// pauseSelfRead: the application reads the socket itself (ReadSelf, readself.go); never
	// lifted, so the receive ring cannot race it for the socket's bytes
	pauseSelfRead
	// pauseSplice: a splice relay reads the socket (splice_relay.go); never lifted, so
	// neither the receive ring nor SetReceivePaused(false) can race it for the bytes
	pauseSplice
)

// Conn is a TCP connection served by one queue for its whole life.
type Conn struct {
	e     *Engine
	q     *queue
	sock  *tcpglue.Socket // owns the descriptor: Socket/CloseWrite never see a reused fd
	fd    int             // the descriptor number, for the loop (-1 once closed)
	laddr netip.AddrPort  // values, not *net.TCPAddr: an idle connection carries no address objects
	raddr netip.AddrPort

	// inData: the loop runs this connection's OnData (callData). A Write then leaves its
	// bytes to the loop's send without asking which thread it runs on (a gettid): on the
	// loop that is what it would do, and a writer on another goroutine meanwhile only
	// stages instead of writing directly.
	inData atomic.Bool

	// Producer side (any goroutine), under mu.
	mu      sync.Mutex
	out     []seg
	queued  int           // bytes accepted and not yet sent
	werr    error         // sticky: sends fail with it
	spaceCh chan struct{} // made on the first blocked writer
	doneCh  chan struct{} // made by the first Done (under mu): idle connections carry none
	// closingCh: closed when a close is requested (requestCloseLocked), so that a writer
	// waiting for a send buffer stops at Close, not only at the end (made on first use)
	closingCh chan struct{}
	kicked    bool // the loop knows about our work, or has a send in flight
	closeReq  bool
	shutReq   bool
	// reqs mirrors closeReq and shutReq (reqClose, reqShut: set under mu with them, never
	// cleared), so the loop's look at the producer side (service, maybeShutdownWrite) takes
	// mu only once one was asked: whoever sets one schedules the connection afterwards, so
	// a look that missed it is followed by one that sees it
	reqs atomic.Uint32
	// holdClose: a graceful close waits (as for queued sends, up to CloseTimeout) for a
	// closeHolder to queue the bytes it holds for this connection (enqueueHeld) or to say
	// it has none (releaseHold)
	holdClose bool
	network   netKind
	// Loop side, here to share a word with the fields above (idle memory per connection).
	recvArmed bool
	eof       bool

	scheduled atomic.Bool
	closedAt  atomic.Bool  // finished: Done is (or returns) a closed channel
	resumeReq atomic.Bool  // a credit resume is posted
	pausedAt  atomic.Int32 // paused, readable anywhere (releaseHeld, Stats)
	held      atomic.Int64 // receive-buffer bytes held
	notifsOut atomic.Int64

	// Loop side.
	h  Handler
	tx *sender // the send side, made by the first send (idle connections carry none)
	// txp is tx as the loop first sees it: tx is made by a producer under mu, so the loop's
	// checks for it (pendLen, sending ...) load this instead of reading tx unsynchronized.
	txp        atomic.Pointer[sender]
	ops        int32             // operations in the kernel (recv, send, connect, poll)
	paused     int32             // pause reasons
	destPauses int32             // destinations we wait for
	qi         int32             // index in the queue's connection list (loop only; -1 when not in it)
	st         connstate.State   // where the connection is in its life, and its socket (life.go)
	rd         connstate.Receive // who reads it: handler, ReadSelf, the face, a relay; FanOut wrappers (life.go)
	bk         backendState      // the backend's own state of the connection (opaque to the core)
	parked     *parkedRecv       // receives that landed while the user paused (deliver, unparkRecv)
	closeErr   error
	cl         *closeState               // made by beginClose
	rx         recvPath                  // where received bytes land when not the queue's ring (nil): recv.go
	tls        tlsHooks                  // TLS state (tls.go); nil: plain TCP
	tlsDial    tlsSetupHooks             // a TLS dial: the handshake runs after the connect (tls.go)
	self       selfHooks                 // ReadSelf: the socket's duplicate that Read uses (readself.go)
	wdl        atomic.Pointer[time.Time] // SetWriteDeadline (nil: none)
	connect    *connectState

	steer *bpf.Steering // the listener's steering, to forget the flow (raddr->laddr) on close

	ctr struct {
		recv, recvMapped atomic.Uint64
	}
}

// netKind is the network a connection was made for ("tcp", "tcp4" or "tcp6"), in a byte.
type netKind uint8

const (
	netTCP netKind = iota
	netTCP4
	netTCP6
)

func netKindOf(network string) netKind {
	switch network {
	case "tcp4":
		return netTCP4
	case "tcp6":
		return netTCP6
	}
	return netTCP
}

func (k netKind) String() string {
	switch k {
	case netTCP4:
		return "tcp4"
	case netTCP6:
		return "tcp6"
	}
	return "tcp"
}

func newConn(e *Engine, q *queue, s *tcpglue.Socket, fd int, network string) *Conn {
	c := &Conn{e: e, q: q, sock: s, fd: fd, network: netKindOf(network), qi: -1}
	c.bk = q.be.newConnState(c)
	return c
}

// LocalAddr returns the local address, a *net.TCPAddr (its AddrPort method gives the
// netip form), or nil if it is unknown (the connection failed before its address was read).
func (c *Conn) LocalAddr() net.Addr { return tcpAddr(c.laddr) }

// RemoteAddr returns the peer's address, a *net.TCPAddr, or nil if it is unknown.
func (c *Conn) RemoteAddr() net.Addr { return tcpAddr(c.raddr) }

// tcpAddr is ap as a net.Addr: a nil interface, not a nil *net.TCPAddr in one, when ap is
// not valid (net.OpError and callers comparing with nil see "no address").
func tcpAddr(ap netip.AddrPort) net.Addr {
	if !ap.IsValid() {
		return nil
	}
	return net.TCPAddrFromAddrPort(ap)
}

// Done is closed once the connection is fully closed (OnClose has run).
func (c *Conn) Done() <-chan struct{} { return c.doneChan() }

var closedChan = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

func (c *Conn) doneChan() chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.doneCh == nil {
		if c.closedAt.Load() {
			return closedChan
		}
		c.doneCh = make(chan struct{})
	}
	return c.doneCh
}

// closingChan is closed once a close is requested (Close, an abort, the engine's close): a
// Write, BufferWait or ReadFrom waiting for a send buffer stops there with ErrClosed, as a
// Write blocked in Go's net does at Close. (Waiting for the end instead could wait for good:
// a graceful close waits for the queued bytes, whose room the waiting writer may need.)
func (c *Conn) closingChan() chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closingCh == nil {
		if c.closeReq {
			return closedChan
		}
		c.closingCh = make(chan struct{})
	}
	return c.closingCh
}

// requestCloseLocked marks a close requested (mu held) and wakes the writers waiting for a
// send buffer (closingChan).
func (c *Conn) requestCloseLocked() {
	if c.closeReq {
		return
	}
	c.closeReq = true
	c.reqs.Or(reqClose)
	if c.closingCh != nil {
		close(c.closingCh)
	}
}

// markDone closes Done (loop only, once).
func (c *Conn) markDone() {
	c.mu.Lock()
	c.closedAt.Store(true)
	if c.doneCh != nil {
		close(c.doneCh)
		c.q.YieldSoon()
	}
	c.mu.Unlock()
}

// Queued returns the bytes queued or in flight and not yet sent.
func (c *Conn) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.queued
}

// SetHandler replaces the handler. Call it from a handler method or the accept function (on
// another goroutine it is posted to the connection's queue: if the connection closes before
// the new handler is in place, the new handler's OnClose still runs). A nil handler is
// refused, and so is a connection whose handler is not the application's to replace (ErrInvalid): one a
// Relay forwards, a net.Conn face's, a FanOut subscriber (Remove it first). A SetHandler from
// another goroutine that a Relay overtakes on the connection's queue (the relay took it
// between the call and the install) gives way: the relay's handler stays.
func (c *Conn) SetHandler(h Handler) error {
	if h == nil {
		return c.opErr("sethandler", ErrInvalid)
	}
	if err := c.handlerOwned(); err != nil {
		return c.opErr("sethandler", err)
	}
	return c.setHandler(h, connstate.ReadHandler)
}

// setHandler installs h for the reader by: the application's handler (SetHandler) or a
// Relay's. A posted install of the application's that finds a Relay or the face reading the
// connection by then (it took the connection on the loop between the call and the install)
// gives way: their handler stays.
func (c *Conn) setHandler(h Handler, by connstate.Reader) error {
	if c.q.OnLoop() {
		if c.ended() {
			return c.opErr("sethandler", ErrClosed)
		}
		c.h = h
		return nil
	}
	if c.closedAt.Load() {
		return c.opErr("sethandler", ErrClosed)
	}
	if err := c.q.Post(func() {
		if !c.ended() {
			if r := c.rd.Reader(); by == connstate.ReadHandler && (r == connstate.ReadRelay || r == connstate.ReadFace) {
				return
			}
			c.h = h
			return
		}
		// It closed meanwhile: the new handler still hears of it (no handler waits forever).
		defer func() {
			if v := recover(); v != nil {
				c.q.ctr.handlerPanics.Add(1)
			}
		}()
		h.OnClose(c, c.closeErr)
	}); err != nil {
		return c.opErr("sethandler", ErrClosed)
	}
	return nil
}

// Stats returns the connection's counters.
func (c *Conn) Stats() ConnStats {
	s := ConnStats{
		Queue:     c.q.idx,
		BytesRecv: c.ctr.recv.Load(), BytesRecvMapped: c.ctr.recvMapped.Load(),
		NotifsPending: int(c.notifsOut.Load()), RecvHeld: int(c.held.Load()),
	}
	c.mu.Lock()
	s.Queued = c.queued
	tx := c.tx
	c.mu.Unlock()
	if tx != nil {
		s.BytesSentZC, s.BytesZCCopied, s.BytesSentCopy = tx.sentZC.Load(), tx.zcCopied.Load(), tx.sentCopy.Load()
		s.SendOps, s.SendZCOps = tx.sendOps.Load(), tx.sendZCOps.Load()
		s.ZCSwitches, s.ZCProbes = tx.zc.switches.Load(), tx.zc.probes.Load()
		s.BytesDropped = tx.dropped.Load()
		s.ZeroCopyOn = c.q.be.zeroCopy() && tx.zc.on()
	} else {
		s.ZeroCopyOn = c.q.be.zeroCopy() && c.e.cfg.SendPath != SendCopy
	}
	s.RecvPaused = c.pausedAt.Load() != 0 || int64(s.RecvHeld) >= c.credit()
	if c.tls != nil {
		s.TLS = c.tls.stats()
	}
	return s
}

// Socket runs fn with the connection's socket, holding a reference so the descriptor cannot
// be closed (and reused) during fn. The per-flow knobs of the kernel's TCP stack are
// tcpglue.Socket's methods, run this way: TCPInfo (RTT, congestion window, retransmits,
// delivery and pacing rates), SetCongestion ("cubic", "bbr", ... one of
// tcpglue.AvailableCongestion), SetMaxPacingRate (SO_MAX_PACING_RATE, bytes per second),
// SetUserTimeout (TCP_USER_TIMEOUT), SetTOS (IP_TOS / IPV6_TCLASS), for example
//
//	err := c.Socket(func(s *tcpglue.Socket) error { return s.SetCongestion("bbr") })
//
// Bad values are *tcpglue.ValueError (ErrInvalid-like), what the kernel lacks matches
// ErrNotSupported.
// fn must not close the socket or use it for I/O. After the connection closed it returns an
// error wrapping ErrClosed.
func (c *Conn) Socket(fn func(s *tcpglue.Socket) error) error {
	err := c.sock.Control(func(int) error { return fn(c.sock) })
	if err != nil {
		var oe *tcpglue.OpError
		if errors.As(err, &oe) && errors.Is(oe.Err, net.ErrClosed) && oe.Op == "control" {
			return c.opErr("control", ErrClosed)
		}
		return c.opErr("control", err)
	}
	return nil
}

func (c *Conn) opErr(op string, err error) error {
	if err == io.EOF {
		return err
	}
	var oe *OpError
	if errors.As(err, &oe) && oe.Op == op {
		return err
	}
	return &OpError{Op: op, Net: c.network.String(), Addr: tcpAddr(c.raddr), Err: err}
}

// onLoop reports whether the caller runs on any of the engine's queue goroutines.
func (c *Conn) onLoop() bool { return c.e.onAnyLoop() }

// ---- buffers ---------------------------------------------------------------------------

// Buffer returns an empty send buffer from the connection's queue pool (growing the pool
// when it may, unless this connection already has MaxQueuedBytes queued). Fill it and pass it
// to Send, or Release it. It fails with an error matching memreg.ErrExhausted when no buffer
// is free (then OnWritable, or a returning buffer, says when to try again).
func (c *Conn) Buffer() (memreg.Buf, error) {
	if c.isClosing() {
		return memreg.Buf{}, c.opErr("buffer", ErrClosed)
	}
	b, err := c.q.getBuf(c, c)
	if err != nil {
		return b, c.opErr("buffer", err)
	}
	return b, nil
}

// BufferWait is Buffer that waits (up to timeout, 0 = forever) for a buffer to come back;
// waiters are served in arrival order. When the timeout passes it returns an error matching
// os.ErrDeadlineExceeded (at once for a negative timeout and no free buffer). On a queue
// goroutine it returns ErrWouldBlock instead of waiting.
func (c *Conn) BufferWait(timeout time.Duration) (memreg.Buf, error) {
	if c.isClosing() {
		return memreg.Buf{}, c.opErr("buffer", ErrClosed)
	}
	onLoop := c.onLoop()
	var waiter *Conn
	if onLoop {
		waiter = c // refused on a queue goroutine: OnWritable follows
	}
	b, err := c.q.getBuf(c, waiter)
	if err == nil {
		return b, nil
	}
	if !errors.Is(err, memreg.ErrExhausted) {
		return b, c.opErr("buffer", err)
	}
	if onLoop {
		return b, c.opErr("buffer", ErrWouldBlock)
	}
	if timeout < 0 {
		return b, c.opErr("buffer", errTimeout) // already past, as a deadline in the past
	}
	var dl func() time.Time
	if timeout > 0 {
		d := time.Now().Add(timeout)
		dl = func() time.Time { return d }
	}
	b, err = c.q.waitSendBuf(c.closingChan(), nil, dl)
	if err != nil {
		return b, c.opErr("buffer", err)
	}
	return b, nil
}

// ---- sending ---------------------------------------------------------------------------

// Send queues the first n bytes of b for sending and takes ownership of b: the handle is
// stale once Send returns, and the buffer returns to its pool when the kernel is done with it
// (after the zero-copy notification when the send was zero-copy). On error the buffer is
// released (no leak), except memreg.ErrStale for a handle not owned by the caller. n must be
// 1..len(b.Bytes()) (0: ErrEmpty, negative: ErrInvalid, more: ErrTooLarge). Send does not
// block: above MaxQueuedBytes it still queues (wait for
// OnWritable, or check Queued, to keep a stream bounded).
func (c *Conn) Send(b memreg.Buf, n int) error {
	if !b.Valid() {
		return c.opErr("send", memreg.ErrStale)
	}
	if err := c.e.checkOwn(b.Region()); err != nil {
		b.Release()
		return c.opErr("send", err)
	}
	switch {
	case n == 0:
		b.Release()
		return c.opErr("send", ErrEmpty)
	case n < 0:
		b.Release()
		return c.opErr("send", fmt.Errorf("negative length %d: %w", n, ErrInvalid))
	case n > len(b.Bytes()):
		b.Release()
		return c.opErr("send", ErrTooLarge)
	}
	var sum uint64
	if dbg := c.e.dbg; dbg != nil && dbg.buffers() {
		sum = dbg.sum(b.Bytes()[:n])
	}
	loan, err := b.Lend()
	if err != nil {
		if errors.Is(err, memreg.ErrClosed) {
			// The engine closed (its pools with it): the buffer is still the caller's.
			b.Release()
			err = ErrClosed
		}
		return c.opErr("send", err)
	}
	s := loanSeg(loan, 0, int32(n))
	s.sum = sum
	return c.enqueue(s)
}

// SendData forwards received bytes without copying them (a proxy's or echo server's fast
// path): the receive buffer is sent as is and returns to its pool when the kernel is done
// with it. d is released by the call, whatever its result, with one exception below. The
// bytes count toward this connection's MaxQueuedBytes and stay charged to the receiving
// connection's MaxRecvHeld until sent; when this connection is over MaxQueuedBytes the
// receiving connection stops receiving until this one drains below half of it (then
// OnWritable runs here). So a relay needs no flow-control code of its own, and cannot
// deadlock. A reference made by Data.Retain is sent the same way, sharing the buffer with
// the other references (Stats.Send.SharedSends). Data in a zcrx area (RecvZcrx) is sent
// from the area itself and its buffer goes back to the kernel once the send is done
// (Stats.Send.BytesZcrxSent).
//
// Data whose memory cannot be lent to a send (mapped Data; zcrx Data to a connection on
// the shim backend) is copied into send buffers (Stats.Send.BytesDataCopied), all or
// nothing: when the send pool refuses (an error
// matching memreg.ErrExhausted; OnWritable follows when a buffer is free, as for Buffer)
// or the bytes are more than the pool can ever hold (ErrTooLarge), nothing is queued and
// d is not released: it is still the caller's, to send again or release.
func (c *Conn) SendData(d Data) error {
	if d.n == 0 {
		d.Release()
		return c.opErr("send", ErrEmpty)
	}
	if d.src != nil {
		return d.src.send(c, d) // the source knows how its bytes go out
	}
	if !d.buf.Valid() {
		return c.opErr("send", memreg.ErrStale)
	}
	if err := c.e.checkOwn(d.buf.Region()); err != nil {
		d.Release()
		return c.opErr("send", err)
	}
	var sum uint64
	if dbg := c.e.dbg; dbg != nil {
		dbg.released(d) // SendData took it: no Release to come
		if dbg.buffers() {
			sum = dbg.sum(d.Bytes())
		}
	}
	// shared: retained, the loan is one owner among others
	loan, shared, err := memregops.LendShared(d.buf)
	if err != nil {
		d.Release()
		if errors.Is(err, memreg.ErrClosed) {
			err = ErrClosed
		}
		return c.opErr("send", err)
	}
	if shared {
		c.e.shareCtr.sends.Add(1)
		c.e.shareCtr.bytes.Add(uint64(d.n))
	}
	s := loanSeg(loan, 0, int32(d.n))
	s.src, s.sum, s.shared = d.c, sum, shared
	return c.enqueue(s)
}

// enqueue adds s to the producer queue.
func (c *Conn) enqueue(s seg) error {
	c.mu.Lock()
	if c.werr != nil {
		err := c.werr
		c.mu.Unlock()
		c.dropSeg(s)
		return c.opErr("send", err)
	}
	c.flushStageLocked(true) // the segment follows: Writes after it go on in the buffer
	tx := c.txLocked()
	c.out = append(c.out, s)
	c.queued += int(s.n - s.off) // off > 0: a slice of a shared buffer (Data.Slice)
	over := c.queued > c.e.cfg.MaxQueuedBytes
	if over && s.src != nil && s.src != c {
		tx.destWaits = append(tx.destWaits, s.src)
	}
	kick := c.kickLocked()
	c.mu.Unlock()
	if over && s.src != nil && s.src != c {
		s.src.pauseForDest()
	}
	if kick {
		c.schedule()
	}
	return nil
}

// enqueueHeld queues s, the bytes a closeHolder held for this connection, even though a
// graceful close began (which waits for them), and ends the hold. Once the close gave up
// waiting (an abort, CloseTimeout) or never waited, s is dropped (finishSeg) and the
// error is ErrClosed's.
func (c *Conn) enqueueHeld(s seg) error {
	c.mu.Lock()
	if !c.holdClose {
		c.mu.Unlock()
		return c.enqueue(s)
	}
	c.holdClose = false
	c.flushStageLocked(true) // the segment follows: Writes after it go on in the buffer
	c.txLocked()
	c.out = append(c.out, s)
	c.queued += int(s.n - s.off)
	kick := c.kickLocked()
	c.mu.Unlock()
	if kick {
		c.schedule()
	}
	return nil
}

// releaseHold ends a closeHolder's hold without bytes: the close goes on (any goroutine).
func (c *Conn) releaseHold() {
	c.mu.Lock()
	held := c.holdClose
	c.holdClose = false
	c.mu.Unlock()
	if held {
		c.scheduled.Store(true)
		if c.q.Schedule((*connSched)(c)) != nil {
			c.scheduled.Store(false)
		}
	}
}

// Write copies p into send buffers and queues them; it blocks while the connection has
// MaxQueuedBytes queued or no buffer is free (on a queue goroutine it returns ErrWouldBlock
// instead, with the count of what it took; OnWritable follows). A connection with nothing
// queued writes what the socket takes at once (write(2)) when no buffer is free, so a
// handler's small reply goes out even with the pool empty. Small writes are coalesced while
// a send is in flight. It returns once p is queued, not once it is sent.
func (c *Conn) Write(p []byte) (int, error) { return c.write(p, nil, nil) }

// WriteContext is Write bounded by ctx: it returns when p is queued, or with what was queued
// so far and ctx's error (wrapped: errors.Is(err, context.Canceled) or
// context.DeadlineExceeded, whose Timeout() is true) when ctx ends first. Bytes it reports
// written are queued and will be sent; none are lost or sent twice. On a queue goroutine it
// never waits: as Write, it returns ErrWouldBlock (OnWritable follows).
func (c *Conn) WriteContext(ctx context.Context, p []byte) (int, error) {
	if ctx == nil {
		return 0, c.opErr("write", fmt.Errorf("nil context: %w", ErrInvalid))
	}
	if err := ctx.Err(); err != nil {
		return 0, c.opErr("write", err)
	}
	var dl func() time.Time
	d, hasDL := ctx.Deadline()
	if hasDL {
		dl = func() time.Time { return d }
	}
	n, err := c.write(p, dl, ctx.Done())
	switch {
	case errors.Is(err, errTimeout) && hasDL && !time.Now().Before(d):
		// ctx's deadline, seen by our timer before ctx's own (otherwise it was the
		// connection's write deadline: os.ErrDeadlineExceeded stays)
		err = c.opErr("write", context.DeadlineExceeded)
	case errors.Is(err, errCanceled):
		err = c.opErr("write", ctx.Err())
	}
	return n, err
}

// write is Write bounded by the deadline dl returns (nil or zero: none) and the connection's
// write deadline; both are re-read while waiting so that a deadline set meanwhile applies.
func (c *Conn) write(p []byte, dl func() time.Time, cancel <-chan struct{}) (int, error) {
	if t := c.wdl.Load(); t != nil && !t.IsZero() {
		if !time.Now().Before(*t) {
			return 0, c.opErr("write", os.ErrDeadlineExceeded)
		}
	}
	written := 0
	c.mu.Lock()
	direct := c.mayWriteDirectLocked(p) && !c.inData.Load()
	onOwnLoop := direct && c.q.OnLoop() // asked once (a gettid): the buffer's wait below needs it too
	if direct && !onOwnLoop {
		// Not on the connection's queue goroutine: write(2) right here, as Go's net does,
		// instead of waking the queue (a cross-thread hand-off per write). On the queue
		// goroutine the loop batches every Write of this round into one send instead.
		k, err := c.directWrite(p)
		if err != nil {
			c.mu.Unlock()
			return 0, c.opErr("write", err)
		}
		written += k
		p = p[k:]
	}
	for len(p) > 0 {
		if c.werr != nil {
			err := c.werr
			c.mu.Unlock()
			return written, c.opErr("write", err)
		}
		if c.queued >= c.e.cfg.MaxQueuedBytes {
			kick := c.kickLocked()
			ch := c.spaceLocked()
			c.mu.Unlock()
			if kick {
				c.schedule()
			}
			if err := c.waitSpace(ch, cancel, c.withWriteDeadline(dl)); err != nil {
				return written, c.opErr("write", err)
			}
			c.mu.Lock()
			continue
		}
		if !c.staged() {
			// Never wait for the loop (a pool growth) while holding mu: the loop takes it.
			kick := c.kickLocked()
			c.mu.Unlock()
			if kick {
				c.schedule()
			}
			// Which goroutine this is (a gettid) matters only when no buffer is free: then a
			// queue goroutine is refused with the promise of OnWritable, and the refusal is
			// asked for again with that promise (a buffer back meanwhile is taken then).
			onLoop := onOwnLoop
			b, err := c.q.getBuf(c, nil)
			if err != nil && errors.Is(err, memreg.ErrExhausted) {
				if onLoop = onLoop || c.onLoop(); onLoop {
					b, err = c.q.getBuf(c, c) // refused on a queue goroutine: OnWritable follows
				}
			}
			if err != nil {
				if !errors.Is(err, memreg.ErrExhausted) {
					return written, c.opErr("write", err)
				}
				if onLoop {
					// No buffer to stage in: write(2) what the socket takes now if it may,
					// as a writer off the queue would (a small header a handler writes
					// goes out with the pool empty). The rest waits for the OnWritable the
					// refusal promised (which comes, harmless, also when nothing is left).
					k, err := 0, error(nil)
					c.mu.Lock()
					if c.mayWriteDirectLocked(p) {
						k, err = c.directWrite(p)
					}
					c.mu.Unlock()
					if written += k; err == nil && k == len(p) {
						return written, nil
					}
					if err == nil {
						err = ErrWouldBlock
					}
					return written, c.opErr("write", err)
				}
				if b, err = c.q.waitSendBuf(c.closingChan(), cancel, c.withWriteDeadline(dl)); err != nil {
					return written, c.opErr("write", err)
				}
			}
			c.mu.Lock()
			if c.staged() || c.werr != nil {
				b.Release() // another writer staged meanwhile, or the connection closed
				continue
			}
			t := c.txLocked()
			t.stage, t.stageRef, t.stageOff, t.stageN, t.hasStage = b, nil, 0, 0, true
		}
		t := c.tx
		buf := t.stageBytes()
		k := copy(buf[t.stageN:], p)
		t.stageN += k
		c.queued += k
		p = p[k:]
		written += k
		if t.stageN == len(buf) {
			c.flushStageLocked(false)
		}
	}
	// The staged buffer stays open for the next Writes of this round: the loop takes it
	// (takeWork) with everything queued before it, in one send.
	kick := c.kickLocked()
	c.mu.Unlock()
	if kick {
		c.schedule()
	}
	return written, nil
}

// writeDeadline is the write deadline (zero: none).
func (c *Conn) writeDeadline() time.Time {
	if t := c.wdl.Load(); t != nil {
		return *t
	}
	return time.Time{}
}

// withWriteDeadline returns a deadline function giving the earlier of dl's deadline and
// the connection's write deadline.
func (c *Conn) withWriteDeadline(dl func() time.Time) func() time.Time {
	return func() time.Time {
		w := c.writeDeadline()
		if dl == nil {
			return w
		}
		d := dl()
		if w.IsZero() || (!d.IsZero() && d.Before(w)) {
			return d
		}
		return w
	}
}

// idleLocked reports whether nothing of ours is queued or in the kernel (mu held).
func (c *Conn) idleLocked() bool {
	return c.opened() && !c.kicked && c.werr == nil && len(c.out) == 0 && !c.staged() && c.queued == 0
}

// mayCopy reports whether a write of n bytes may go out by copy: not on the shim backend
// (its sends are the module's zero-copy sends), not under SendZeroCopy, not when the adaptive
// policy would send it zero-copy now.
// mayWriteDirectLocked: p may go out with write(2) on the caller's thread (mu held): nothing
// of the connection is queued or in flight, so the stream stays in order (mu keeps the loop
// from starting a send meanwhile), and the send policy copies a write of this size. The
// socket is non-blocking: what it does not take goes through the queue.
func (c *Conn) mayWriteDirectLocked(p []byte) bool {
	return c.idleLocked() && len(p) > 0 && c.mayCopy(len(p)) && (c.tls == nil || c.tls.directOK(c, len(p)))
}

func (c *Conn) mayCopy(n int) bool {
	if !c.q.be.directOK() {
		return false
	}
	switch c.e.cfg.SendPath {
	case SendZeroCopy:
		return false
	case SendCopy:
		return true
	}
	return n < c.e.cfg.ZCThreshold || !c.txLocked().zc.on()
}

// directWrite writes p on the non-blocking socket; EAGAIN is not an error (0 written).
func (c *Conn) directWrite(p []byte) (int, error) {
	n, err := c.sock.TryWrite(p)
	if err != nil {
		if errors.Is(err, net.ErrClosed) {
			return 0, ErrClosed
		}
		return 0, err
	}
	if n > 0 {
		if c.tls != nil {
			c.tls.tlsSent(n)
		}
		c.txLocked().sentCopy.Add(uint64(n))
		c.q.ctr.sentCopy.Add(uint64(n))
		c.q.ctr.directWrites.Add(1)
	}
	return n, nil
}

func (c *Conn) spaceLocked() chan struct{} {
	if c.spaceCh == nil {
		c.spaceCh = make(chan struct{}, 1)
	}
	return c.spaceCh
}

// waitSpace waits for a signal on ch (room under MaxQueuedBytes), the connection's end
// (ErrClosed), cancel (errCanceled; nil: never) or the deadline dl returns (errTimeout).
func (c *Conn) waitSpace(ch chan struct{}, cancel <-chan struct{}, dl func() time.Time) error {
	if c.onLoop() {
		return ErrWouldBlock
	}
	var t <-chan time.Time
	var deadline time.Time
	if dl != nil {
		deadline = dl()
	}
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return errTimeout
		}
		tm := time.NewTimer(d)
		defer tm.Stop()
		t = tm.C
	}
	// Re-check periodically as well: the pool's signal is shared by every writer of the queue,
	// and a deadline may change.
	tick := time.NewTimer(10 * time.Millisecond)
	defer tick.Stop()
	select {
	case <-ch:
	case <-c.doneChan():
		return ErrClosed
	case <-cancel:
		return errCanceled
	case <-t:
		return errTimeout
	case <-tick.C:
	}
	return nil
}

// stageKeep is the room a flushed staging buffer must have left to stay open for the
// next Writes (shared with the send of its first part) rather than go whole.
const stageKeep = 512

// flushStageLocked moves what Write staged to the producer queue (mu held). With keep (a
// segment is queued behind it: Send, SendBytes ...) a buffer with room left stays open: its
// written part goes as a loan of the shared buffer, and the next Writes fill the rest (a
// Write and a Send or SendBytes in turn, as a header before each body, use one buffer, not
// one each). Otherwise (the loop takes the work, a close, a full buffer) all of it goes. A
// staging buffer a flush finds with nothing new is released.
func (c *Conn) flushStageLocked(keep bool) {
	t := c.tx
	if t == nil || !t.hasStage {
		return
	}
	if t.stageN == t.stageOff {
		t.releaseStage()
		return
	}
	if keep && t.stageRef == nil && len(t.stage.Bytes())-t.stageN >= stageKeep {
		if ref, err := t.stage.Share(nil); err == nil {
			t.stage.Release() // the Ref owns the buffer now
			t.stage, t.stageRef = memreg.Buf{}, ref
		}
	}
	if t.stageRef != nil {
		loan, err := t.stageRef.Lend()
		if err != nil {
			c.queued -= t.stageN - t.stageOff
			t.releaseStage()
			return
		}
		s := loanSeg(loan, int32(t.stageOff), int32(t.stageN))
		s.shared = true
		c.out = append(c.out, s)
		t.stageOff = t.stageN
		if !keep || len(t.stageRef.Bytes())-t.stageN < stageKeep {
			t.releaseStage()
		}
		return
	}
	t.hasStage = false
	loan, err := t.stage.Lend()
	if err != nil {
		c.queued -= t.stageN
		t.stage.Release()
		return
	}
	c.out = append(c.out, loanSeg(loan, 0, int32(t.stageN)))
}

// stageBytes is the staging buffer's memory (mu held).
func (t *sender) stageBytes() []byte {
	if t.stageRef != nil {
		return t.stageRef.Bytes()
	}
	return t.stage.Bytes()
}

// releaseStage lets go of the staging buffer (mu held): what was written of it is queued
// already, or dropped by the caller.
func (t *sender) releaseStage() {
	t.hasStage = false
	if t.stageRef != nil {
		t.stageRef.Release()
		t.stageRef = nil
	} else {
		t.stage.Release()
	}
	t.stageOff, t.stageN = 0, 0
}

// staged reports whether Write's staging buffer holds a buffer (mu held).
func (c *Conn) staged() bool { return c.tx != nil && c.tx.hasStage }

// kickLocked decides whether the loop must be told about new work (mu held).
func (c *Conn) kickLocked() bool {
	if c.kicked || (len(c.out) == 0 && !c.staged()) {
		return false
	}
	c.kicked = true
	return true
}

// schedule asks the connection's queue to look at it (any goroutine).
func (c *Conn) schedule() {
	if c.scheduled.CompareAndSwap(false, true) {
		if c.q.Schedule((*connSched)(c)) != nil {
			c.scheduled.Store(false)
		}
	}
}

// Close closes the connection: queued sends still go out while the peer takes them or
// answers, however slowly it reads (once it is silent for CloseTimeout the connection is
// reset, the rest is dropped and OnClose gets an error matching ErrCloseTimeout, whose
// *CloseTimeoutError counts every byte the peer did not acknowledge), then the socket is
// closed; OnClose runs when everything is released (Done is closed then). It never blocks,
// so its own result cannot say whether the queued bytes went out: OnClose's error does,
// and so does Engine.Close's or Engine.CloseContext's (an error, never nil, when a
// connection lost bytes it had accepted). A second Close returns an error wrapping
// ErrClosed.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closeReq {
		c.mu.Unlock()
		if c.self != nil {
			// The engine closed it (Engine.Close, a reset): the application's Close still
			// releases the duplicate that kept unread bytes readable.
			c.self.appClosed()
		}
		return c.opErr("close", ErrClosed)
	}
	c.requestCloseLocked()
	if c.werr == nil {
		c.werr = ErrClosed
	}
	if !c.kicked {
		c.flushStageLocked(false)
	}
	c.mu.Unlock()
	if c.self != nil {
		// A Read waiting in the poller wakes with ErrClosed; only now, so that whatever its
		// goroutine calls next (Write, ReadFrom, Close) finds the connection closed.
		c.self.appClosed()
	}
	c.scheduled.Store(true)
	if err := c.q.Schedule((*connSched)(c)); err != nil {
		return c.opErr("close", ErrClosed)
	}
	return nil
}

// CloseWrite half-closes the sending side once queued sends are out (SHUT_WR). Sends after
// it (Write, Send, SendData, SendFile) fail with an error matching ErrClosed.
func (c *Conn) CloseWrite() error {
	c.mu.Lock()
	if c.werr != nil {
		err := c.werr
		c.mu.Unlock()
		if err == errWriteClosed {
			err = ErrClosed
		}
		return c.opErr("closewrite", err)
	}
	c.werr = errWriteClosed
	c.shutReq = true
	c.reqs.Or(reqShut)
	c.flushStageLocked(false)
	c.kicked = true
	c.mu.Unlock()
	c.scheduled.Store(true)
	if err := c.q.Schedule((*connSched)(c)); err != nil {
		return c.opErr("closewrite", ErrClosed)
	}
	return nil
}

// Post runs fn on the connection's queue goroutine, serialized with its handler methods (for
// example to start a Writable sender). It fails with ErrClosed once the connection is closing,
// and with ErrInvalid for a nil fn.
func (c *Conn) Post(fn func()) error {
	if fn == nil {
		return c.opErr("post", ErrInvalid)
	}
	c.mu.Lock()
	closing := c.closeReq
	c.mu.Unlock()
	if closing {
		return c.opErr("post", ErrClosed)
	}
	if err := c.q.Post(func() {
		if !c.inClose() && !c.ended() {
			c.callPosted(fn)
		}
	}); err != nil {
		return c.opErr("post", ErrClosed)
	}
	return nil
}

// SetReceivePaused stops (true) or restarts (false) receiving: while paused no OnData
// arrives and the kernel's receive window fills, pushing back on the peer.
func (c *Conn) SetReceivePaused(on bool) error {
	apply := func() {
		if c.ended() {
			return
		}
		if on {
			c.pause(pauseUser)
		} else {
			c.unpause(pauseUser)
		}
	}
	if c.q.OnLoop() {
		if c.ended() || c.inClose() {
			return c.opErr("pause", ErrClosed)
		}
		apply()
		return nil
	}
	if c.isClosing() {
		return c.opErr("pause", ErrClosed)
	}
	if err := c.q.Post(apply); err != nil {
		return c.opErr("pause", ErrClosed)
	}
	return nil
}

func (c *Conn) isClosing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeReq
}
