// Package becontract is the contract between zc's connection core and its backends (the
// io_uring, epoll and zcshim packages under zc/internal/be, and the fake kernel of zc's
// interleaving test): what a backend may read of a connection, a listener and its queue,
// what it reports back, the optional capabilities a backend may have, and the vocabulary
// they share (operation tags, batch limits, counters, the segment view of a send queue).
//
// It imports memreg, internal/loop and tcpglue, never zc: a backend that imports only this
// package (and the floors under it) cannot reach into zc's types, so the compiler keeps each
// backend in its room. zc implements Conn, Listener and Queue with adapters of its own types;
// a backend never sees the structs behind them.
//
// Every method of every interface here runs on the queue's goroutine unless it says so.
package becontract

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// Kind names a backend (the values of zc.Backend; the fake kernel reports KindAuto).
type Kind uint8

const (
	KindAuto Kind = iota
	KindIOUring
	KindPlain
	KindShim
)

// Backend is how one queue moves bytes.
type Backend interface {
	Kind() Kind
	// NewConnState makes the backend's own state of a new connection (the core keeps it for
	// the backend: Conn.BackendState). It may keep c (the owner of c's operations).
	NewConnState(c Conn) ConnState
	// Start attaches a connected socket to the queue (epoll registration, module attach).
	Start(c Conn) error
	ArmRecv(c Conn)  // start receiving (reports RecvStarted)
	StopRecv(c Conn) // stop receiving; what is in flight still completes
	// Send hands the head of c's send queue to the kernel, as much as the backend takes at once.
	Send(c Conn)
	Sending(c Conn) bool     // a send is in the kernel
	InFlightSegs(c Conn) int // how many head segments of the send queue it covers
	// CancelSend ends the send in the kernel early (an abort): it completes with what it
	// took. A send that waits for room would otherwise hold the socket open (no reset) and
	// its buffers lent for as long as the peer does not read.
	CancelSend(c Conn)
	// CloseSocket detaches and closes the socket; operations in flight then complete.
	CloseSocket(c Conn)
	FreeOp(c Conn, ud uint64)
	ZeroCopy() bool // sends can be zero-copy
	DirectOK() bool // a writer may write(2) the socket itself when nothing is queued
	// AppDirect: sends go from the application's memory itself (Seg.App); false: the backend
	// copies it into its own send buffers (Conn.RehomePend) first.
	AppDirect() bool
	// Dial starts connecting c (its socket is non-blocking, Conn.DialAddr holds the address).
	Dial(c Conn)
	CancelDial(c Conn)
	// DropDial forgets the connect in flight without waiting for its completion (the queue
	// is stopping).
	DropDial(c Conn)
	// Listen starts accepting on p's socket; StopListen stops it (p.Finish when done).
	Listen(p Listener)
	StopListen(p Listener)
	PauseListen(p Listener) // stop accepting until Listen is called again
	// RecvPool is the pool receive buffers come from.
	RecvPool() *memreg.Pool
	Close()
}

// ConnState is a backend's own state of a connection: opaque to the core.
type ConnState interface{ ConnState() }

// Optional capabilities of a backend: small interfaces, asserted once when the queue's
// backend is set, so that the core asks the queue's capabilities and never the backend's type.

// Splicer: the splice relay (and SendFile's splice) run on this backend: a splice(2) of a
// duplicate of a connection's socket sees the connection's own stream.
type Splicer interface {
	// WatchEpoll returns the epoll instance the queue's fd watches use (the backend's own,
	// or one whose readiness the ring reports).
	WatchEpoll() *loop.Epoll
}

// Ring: the backend owns an io_uring ring the core may put operations of its own in (polls
// of fd watches, their cancels, zcrx receivers, the mapped receive's poll).
type Ring interface {
	URing() *loop.URing
	// ArmPoll arms a multishot readability poll as c's receive (its completions reach the
	// connection's receive path: Conn.OnPoll).
	ArmPoll(c Conn)
	// CancelRecv cancels c's armed receive or poll: its last completion follows.
	CancelRecv(c Conn)
}

// RecvInFlighter is a backend whose StopRecv reports RecvEnded while a receive it posted may
// still complete (the zcshim backend: a RECV in the module): it reports whether one is out.
type RecvInFlighter interface {
	RecvInFlight(c Conn) bool
}

// RingStatser is a backend with a provided-buffer ring, whose counters Stats adds up.
type RingStatser interface{ RingStats() RingStats }

// RingStats are a provided-buffer ring's and its pool's counters.
type RingStats struct {
	Out, Empty, Mismatch, Grows, GrowFails int64
	LastError                              error
}

// New makes a queue's backend: the loop's driver and the backend (the backend set the
// queue's send pool with Queue.SetSendPool).
type New func(q Queue) (loop.Driver, Backend, error)

// Tags of the operations in the kernel (loop.NewOp): the backends' and the core's own (the
// splice machinery's fd watches), one space so that no two mean the same.
const (
	TagRecv uint32 = iota + 1
	TagSend
	TagSendZC
	TagConnect
	TagPoll
	TagAccept
	TagDial // epoll: connect readiness
	TagShim // shim module completions
)

const (
	TagSpliceIn uint32 = 100 + iota
	TagSpliceOut
	TagFileOut
	TagSpliceEpoll
	TagRekeyOut // an owed TLS KeyUpdate's wait for room
)

// Limits the backends share.
const (
	MaxIov       = 64      // buffers per gathered send (SENDMSG, writev)
	MaxSendBatch = 1 << 20 // bytes per gathered send (latency stays low behind a big batch)
)

// CapIov trims iov to at most max bytes (max < 0: no bound) and returns how many entries
// remain (kernel TLS: Conn.TLSSendCap).
func CapIov(iov []unix.Iovec, max int) int {
	if max < 0 {
		return len(iov)
	}
	for i := range iov {
		l := int(iov[i].Len)
		if l >= max {
			iov[i].SetLen(max)
			return i + 1
		}
		max -= l
	}
	return len(iov)
}

// Config is what a backend needs of the engine's configuration, computed once by zc.
type Config struct {
	RecvBufSize, RecvBufs, RecvPoolMax int
	SendBufSize, SendBufs, SendPoolMax int
	NoBundles                          bool
	// DebugBuffers: Config.Debug.Buffers is on: pools keep their memory mapped, and send
	// buffers are scrubbed with Scrub.
	DebugBuffers bool
	Scrub        func([]byte)
	// PoolTag tags every pool the backend makes (the engine: which engine's buffer is it).
	PoolTag any
}

// Pool completes a backend's pool options with the debugging ones (send: a send pool).
func (c *Config) Pool(o memreg.PoolOptions, send bool) memreg.PoolOptions {
	o.Tag = c.PoolTag
	if c.DebugBuffers {
		o.KeepMapped = true
		if send {
			o.Scrub = c.Scrub
		}
	}
	return o
}

// Counters are the queue's counters a backend bumps (read by Stats from any goroutine).
type Counters struct {
	RecvRing, RecvPlain, RecvShim atomic.Uint64
	SendOps, SendZCOps            atomic.Uint64
	BufEmpty, PoolGrows           atomic.Uint64
	ZCProbes, ZCSmallWindow       atomic.Uint64
}

// Queue is the queue a backend serves, as it sees it.
type Queue interface {
	Loop() *loop.Queue
	Config() *Config
	Counters() *Counters
	// SetSendPool makes p the queue's send pool (the backend's constructor; OnFree must be
	// SendBufFreed); SendPool returns it.
	SetSendPool(p *memreg.Pool)
	SendPool() *memreg.Pool
	// SendBufFreed runs (any goroutine) when a send buffer returns to the pool.
	SendBufFreed()
	// ZcrxWanted says whether the queue receives with zcrx (the ring needs 32-byte
	// completions); SetupZcrx sets it up on u (try: ZcrxWanted).
	ZcrxWanted() bool
	SetupZcrx(u *loop.URing, try bool) error
	// SpliceEpoll returns the private epoll instance of the queue's splice watches whose
	// readiness ring u reports.
	SpliceEpoll(u *loop.URing) *loop.Epoll
}

// Listener is one queue's part of a listener, as a backend sees it.
type Listener interface {
	FD() int
	// Armed: accepting is armed (the backend's own flag, which the core reads);
	// UD: the backend's operation of it.
	Armed() bool
	SetArmed(bool)
	UD() uint64
	SetUD(uint64)
	Closing() bool
	Paused() bool     // accepting suspended by the application
	BackingOff() bool // an accept failed for lack of resources: accepting waits
	Accepted(fd int)
	// AcceptFailed reports an accept error; it says whether accepting should pause (then
	// PauseAccept resumes it after a backoff).
	AcceptFailed(err unix.Errno) bool
	PauseAccept()
	Finish() // the part no longer accepts
}

// Conn is a connection as a backend sees it: facts it may read, its send queue, and the
// reports of what happened.
type Conn interface {
	// ---- facts
	FD() int
	Socket() *tcpglue.Socket
	BackendState() ConnState
	SockClosed() bool // the socket is closed (the backend's CloseSocket ran)
	InClose() bool    // closing began (or the connection finished)
	Ended() bool      // the connection finished
	RecvArmed() bool
	Paused() bool // receiving is paused (by the user, by credit, for a relay)
	SawEOF() bool
	KernelTLS() bool
	// RecvRoom is the receive credit left: how many more bytes the connection may hold.
	RecvRoom() int64
	// DialAddr is the address a dial connects to (nil: no dial under way).
	DialAddr() *tcpglue.RawSockaddr

	// ---- the send queue
	PendLen() int
	Pend(i int) Seg
	// RehomePend replaces segment i's memory with loan, holding its first n bytes (a
	// backend that copied the segment into a buffer of its own); it returns the new view.
	RehomePend(i int, loan memreg.Loan, n int) Seg
	ZC() ZCPolicy
	// TLSRekey sends an owed KeyUpdate before more data (kernel TLS); false: sending waits.
	TLSRekey() bool
	// TLSSendCap bounds the bytes of one send (kernel TLS's rekey bound; -1: none).
	TLSSendCap() int

	// ---- reports
	RecvStarted()
	RecvEnded()
	OpStarted()
	OpEnded()
	Deliver(buf memreg.Buf, n int)
	GotEOF(err error)
	CheckCredit()
	AdvanceClose()
	Rearm() // arm receiving again where the core wants it (credit, pause)
	Fail(op string, err error)
	Advance(n int)
	SendProgress()
	CountSend(zc bool)
	ZCStart(ud uint64)
	ZCNotified(ud uint64, copied bool)
	ZCCompleted(ud uint64, res int, notif, keep bool)
	Pump()
	DialDone(res int32)
	// ArmOwnRecv / StopOwnRecv arm or stop the connection's own receive path (mapped,
	// zcrx) through the ring; false: it receives into the ring's buffers.
	ArmOwnRecv(r Ring) bool
	StopOwnRecv(r Ring) bool
	// OnPoll hands a completion of the poll ArmPoll armed to the receive path.
	OnPoll(ev loop.Event)
}

// Seg is a backend's view of one queued segment: its unsent bytes.
type Seg struct {
	// Loan: the segment is a buffer of a registered pool (IsLoan); Off bytes of it are sent.
	Loan   memreg.Loan
	IsLoan bool
	App    bool  // the application's own memory (SendBytes)
	Off    int   // bytes already sent
	Ptr    *byte // the first unsent byte
	Len    int   // unsent bytes
}

// ZCPolicy is a connection's adaptive zero-copy decision, as a backend asks it.
type ZCPolicy interface {
	// Use decides the path of one send of n bytes (it may start a probe).
	Use(n int) bool
	// WouldUse reports whether Use(n) would pick zero-copy now, changing nothing.
	WouldUse(n int) bool
	// Probing reports whether Use(n) would start a zero-copy probe; Reprobing that the
	// probe would follow copying sends (the policy is off).
	Probing(n int) bool
	Reprobing() bool
	// SmallWindow keeps the connection on copying sends (ZCSegmentsSmall said so).
	SmallWindow()
	// CountCopy counts a buffer of n bytes sent by copy along with a batch.
	CountCopy(n int)
}

// Addr is the address of the segment's first unsent byte.
func (s Seg) Addr() uintptr { return uintptr(unsafe.Pointer(s.Ptr)) }

// Bytes are the segment's unsent bytes.
func (s Seg) Bytes() []byte { return unsafe.Slice(s.Ptr, s.Len) }

// A zero-copy skb charges every page it references in full to its truesize, however few of
// its bytes it sends. Over loopback the receiving socket gets the sender's skb and charges
// that truesize to its receive buffer. When the peer's window is small the sender cuts
// segments to half of it (1 KiB for a 2 KiB window), each charging 4-8 KiB: the receiver's
// measured payload/truesize ratio falls, the window clamp it derives from it (receive
// buffer × ratio) drops below the sender's MSS, and from then on, copied sends included, the
// connection moves one sub-MSS segment per persist timer (about 4 KiB/s on 6.18; the same
// with MSG_ZEROCOPY and no io_uring). doc/notes/issue-18-sndbuf.md has the evidence.
const (
	zcMinSegment = 4096 // smallest send MSS for which zero-copy is tried
	// zcHeaderRoom: IP and TCP headers with options, at most; an MSS further than this below
	// the path MTU was cut by the peer's window, not by the path.
	zcHeaderRoom = 100
)

// ZCSegmentsSmall reports whether a connection whose TCP_INFO says send MSS mss and path MTU
// pmtu would send zero-copy in segments too small for it: the MSS is cut by the peer's window
// to less than a page. A path MSS (1448 on Ethernet) is not: its segments are cut from
// large GSO skbs and the peer never sees the sender's skbs.
func ZCSegmentsSmall(mss, pmtu uint32) bool {
	return mss > 0 && mss < zcMinSegment && mss+zcHeaderRoom < pmtu
}

// AfterRecv is what a ring backend does once a receive completion was reported (Deliver,
// GotEOF, or nothing for a cancel): unless the connection ended, it settles the receive
// credit, lets a closing connection advance its close, and re-arms a receive that is not
// armed. The uring backend and the interleaving test's fake kernel share it.
func AfterRecv(c Conn) {
	if c.Ended() {
		return
	}
	c.CheckCredit()
	if c.InClose() {
		c.AdvanceClose()
		return
	}
	if !c.RecvArmed() {
		c.Rearm()
	}
}

// AfterSend is what a ring backend does with a SEND completion of res, once it freed the
// operation and cleared its send state: the bytes sent advance the send queue; EAGAIN (a
// non-blocking socket can make io_uring give up when the send buffer is full) sets
// *pollFirst, so that the segment goes again after a wait for room; any other error but a
// cancel fails the connection. *pollFirst is set before SendProgress, which may send again.
// The uring backend and the interleaving test's fake kernel share it.
func AfterSend(c Conn, res int32, pollFirst *bool) {
	switch {
	case res > 0:
		c.Advance(int(res))
	case res == -int32(unix.EAGAIN):
		*pollFirst = true
	case res < 0 && res != -int32(unix.ECANCELED):
		c.Fail("write", unix.Errno(-res))
	}
	c.SendProgress()
}

// AfterSendZC is AfterSend for a SEND_ZC completion (not its notification) of operation ud:
// more is the completion's F_MORE. A notification follows when the kernel says so, and also
// for a send cancelled because an earlier linked request failed (it completes with
// -ECANCELED without F_MORE, yet its notification comes: the pages were never queued, so it
// is harmless, but the count must expect it). On EAGAIN the segment stays and goes again
// after a wait for room (*pollFirst). SendProgress also returns a finished connection's
// late send's buffers.
func AfterSendZC(c Conn, ud uint64, res int32, more bool, pollFirst *bool) {
	notif := more || res == -int32(unix.ECANCELED)
	again := res == -int32(unix.EAGAIN)
	if again {
		*pollFirst = true
	}
	c.ZCCompleted(ud, int(res), notif, again)
	if res < 0 && res != -int32(unix.ECANCELED) && !again {
		c.Fail("write", unix.Errno(-res))
	}
	c.SendProgress()
}
