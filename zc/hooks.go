package zc

import (
	"crypto/tls"
	"time"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/memreg"
)

// The core's hook points: what the core calls of the features built on it, declared here so
// that the core names only these declarations and the features, in their own files,
// implement them (the features depend on the core, never the other way). Three kinds:
//
//   - the features table: entry points the core calls at fixed points of a Listen, a Dial,
//     New or a connection's opening, in the core's order; each feature's file sets its own
//     in an init function;
//   - hooks hung on a connection or an engine while a feature serves it (Conn.tls,
//     Conn.self, Engine.dbg): nil otherwise, and every call site checks that first, so a
//     connection without the feature pays one nil check per hook point;
//   - parts: a feature's state on an engine, a listener or a queue, made with it and held
//     behind an interface (closing and Stats go through it); the feature finds its own part
//     again by the index its registration returned.
//
// What features put into the core's own structures is driven through interfaces declared
// beside them: a segment's segOwner and fileMover (conn.go), a Data's dataSource and a
// connection's recvPath (recv.go), a queue's connHold (queue.go).
//
// No hook is called per completion or per send unless the connection uses the feature, and
// no hook call on a connection's path allocates. (Engine.Stats and Listener.Stats hand their
// result to the parts, which moves it to the heap: one allocation per Stats call.)

// features are the entry points the core calls, at fixed points of an engine's, a listener's
// and a connection's life, into the features an option asks for. Each feature's file sets
// its own in an init function (all are set: they are one package), so the core names none of
// a feature's declarations; the order of the calls is the core's (New, Listen, Dial and a
// connection's opening say it).
var features struct {
	// ReadSelf (readself.go): readSelfCheck refuses an engine that cannot serve it (Listen,
	// Dial); readSelfOpen makes a connection a ReadSelf one (Conn.self) before its loop sees
	// it.
	readSelfCheck func(e *Engine) error
	readSelfOpen  func(c *Conn) error
	// recvSetup[p] prepares the receive path p (Config.RecvPath) for a connection about to
	// open (setupRecvPath): RecvMapped's window (mapped.go), RecvZcrx's queue (zcrx.go); the
	// ring needs none. Each sets Conn.rx, or falls back to the ring visibly.
	recvSetup [RecvZcrx + 1]func(c *Conn)
	// TLS (tls.go): tlsSetup checks a listener's or a dial's TLSOptions against the engine
	// and the other options (called only with some) and makes what starts the handshakes.
	tlsSetup func(e *Engine, o *TLSOptions, isClient, readSelf bool, zcrxNIC string) (tlsSetupHooks, error)
	// Listen's features, in the order Listen calls them: steerCheck refuses ListenOptions
	// that steering cannot serve before any socket exists (steer.go); then, once the
	// sockets exist, zcrxNIC binds the listener to a NIC queue (ListenOptions.ZcrxNIC,
	// zcrx.go) and steer sets up its steering (steer.go). Each returns the listener's part
	// (nil: nothing asked), also with an error, which fails Listen.
	steerCheck func(e *Engine, o *ListenOptions) error
	zcrxNIC    func(l *Listener, o *ListenOptions) (listenerPart, error)
	steer      func(l *Listener, o *ListenOptions) (listenerPart, error)
	// backendCheck refuses, at New, a backend that cannot serve what Config asks for with
	// NoFallback (RecvZcrx needs io_uring, zcrx.go): a *featureRefused.
	backendCheck func(e *Engine) error
}

// debugHooks are Config.Debug's checks (debug.go implements them, newDebugHooks makes them).
// Engine.dbg is nil when Config.Debug asks for nothing.
type debugHooks interface {
	// start runs once the engine runs (the HeldData watcher); close once it closed.
	start()
	close()
	// buffers reports DebugOptions.Buffers: sends are summed (sum) and checked when their
	// buffer comes back (sent), free send buffers poisoned and checked when taken (taken).
	buffers() bool
	// sum is the checksum of bytes being sent (never 0: 0 means "not summed").
	sum(p []byte) uint64
	// sent: a segment with a checksum gave its memory back (the kernel is done with it).
	sent(c *Conn, s seg)
	// taken: b was just taken from the send pool (for c, or nil).
	taken(b memreg.Buf, c *Conn)
	// delivered: d went to c's handler (HeldData); released: d was given back (Release or
	// SendData).
	delivered(c *Conn, d Data)
	released(d Data)
	// slowHandler reports whether handler calls are timed; handlerRan runs after one that
	// started at t0.
	slowHandler() bool
	handlerRan(c *Conn, method string, t0 time.Time)
	// poolOptions adds the checks' needs to a pool's options (send: a send pool).
	poolOptions(o memreg.PoolOptions, send bool) memreg.PoolOptions
	// stats fills Stats.Debug.
	stats(s *Stats)
}

// newDebugHooks makes an engine's debugging hooks for Config.Debug (nil: nothing asked).
// debug.go sets it; without it Config.Debug is ignored.
var newDebugHooks func(e *Engine, opt DebugOptions) debugHooks

// selfHooks is ReadSelf's duplicate of a connection's socket (Conn.self, readself.go) as the
// core drives it; nil for a connection opened without ReadSelf.
type selfHooks interface {
	// appClosed: the application closed the connection, or nobody got it (a refused accept,
	// a failed dial): the duplicate goes.
	appClosed()
	// finished: the engine finished the connection with err (loop only).
	finished(err error)
}

// tlsHooks is a TLS connection's state (Conn.tls, tls.go's tlsConn) as the core drives it;
// nil for plain TCP.
type tlsHooks interface {
	// tlsSent counts n bytes that left the connection's queue (or a direct write) against
	// the bound of records under the current TX keys.
	tlsSent(n int)
	// directOK reports whether a direct write of n bytes keeps that bound (else the write
	// goes through the queue, which updates the keys first).
	directOK(c *Conn, n int) bool
	// rekey sends an owed KeyUpdate before the next send (loop only); false: sending waits
	// (for room in the socket: the KeyUpdate is tried again then) or the connection failed.
	rekey(c *Conn) bool
	// sockClosed: the core closed the connection's socket (loop only): a KeyUpdate's wait
	// for room ends, and its duplicate of the socket is closed.
	sockClosed(c *Conn)
	// recvEnd handles the end of a receive (gotEOF, loop only): resume says receiving goes
	// on, else err is the end's error.
	recvEnd(c *Conn, err error) (resume bool, _ error)
	// closeNotify: the write side ends (Close, CloseWrite; loop only).
	closeNotify(c *Conn)
	// finished: the connection finished (loop only).
	finished(c *Conn)
	// inKernel reports whether the kernel holds the record layer (kernel TLS), so the
	// backend sends and receives plain bytes on the socket.
	inKernel() bool
	// sendCap bounds the bytes of one send under the current TX keys (kernel TLS's rekey
	// bound; -1: none).
	sendCap() int
	// stats returns ConnStats.TLS (by value: Conn.Stats allocates nothing).
	stats() connTLSStats
}

// connTLSStats has ConnStats.TLS's fields, in order (the compiler checks it: Conn.Stats
// assigns one to the other), so that the TLS hook returns them without a pointer into the
// caller's ConnStats, which would move every Conn.Stats' result to the heap.
type connTLSStats struct {
	On          bool
	Kernel      bool
	Reason      string
	Version     uint16
	CipherSuite uint16
	KeyUpdates  uint64
	Tickets     uint64
	TxRekeys    uint64
	RekeyAt     uint64
	State       tls.ConnectionState
}

// tlsSetupHooks is a listener's or a dial's TLS after its checks (ListenOptions.TLS,
// DialOptions.TLS; tls.go's tlsSetup, made by features.tlsSetup): the core starts the
// handshakes through it.
type tlsSetupHooks interface {
	// accept runs an accepted descriptor's handshake; the connection opens on its queue
	// after it (Listener.open with its tlsAttach), or the descriptor is closed (loop only).
	accept(l *Listener, from *queue, fd int)
	// dial runs a dial's handshake after its connect; the connection opens after it, or
	// the dial fails (loop only).
	dial(c *Conn, cs *connectState)
}

// tlsAttach is what an accepted connection's handshake hands Listener.open: attach makes c
// a TLS connection before it opens (Conn.tls).
type tlsAttach interface {
	attach(c *Conn)
}

// setupTLS checks TLS options (nil: a plain listener or dial) through features.tlsSetup.
func (e *Engine) setupTLS(o *TLSOptions, isClient, readSelf bool, zcrxNIC string) (tlsSetupHooks, error) {
	if o == nil {
		return nil, nil
	}
	return features.tlsSetup(e, o, isClient, readSelf, zcrxNIC)
}

// An enginePart is a feature's state on an engine (TLS's handshakes and counters, tls.go;
// steering's counters, steer.go): made for every engine at New by the constructor its file
// registered (registerEnginePart), and found again by the index that returned, in
// Engine.parts.
type enginePart interface {
	// closeStart: Engine.Close began (the queues still run). closeEnd: the queues stopped;
	// Close returns after closeEnd does.
	closeStart()
	closeEnd()
	// stats fills the part's counters into Stats.
	stats(s *Stats)
}

// enginePartMakers are the registered parts' constructors, in registration order.
var enginePartMakers []func() enginePart

// registerEnginePart registers an engine part's constructor (from a package variable's
// initializer, so before any engine exists) and returns its index in Engine.parts.
func registerEnginePart(mk func() enginePart) int {
	enginePartMakers = append(enginePartMakers, mk)
	return len(enginePartMakers) - 1
}

// makeParts makes an engine's parts (New, before the queues start).
func (e *Engine) makeParts() {
	e.parts = make([]enginePart, len(enginePartMakers))
	for i, mk := range enginePartMakers {
		e.parts[i] = mk()
	}
}

// A listenerPart is a feature's state on a listener (its zcrx NIC binding, zcrx.go; its
// steering, steer.go): made at Listen by the feature's entry in features, in the order
// Listen calls them, once the listening sockets exist.
type listenerPart interface {
	// accepted: connection c of the listener is about to open, before its receive path is
	// set up (loop only).
	accepted(c *Conn)
	// close: the listener's sockets close (Close, or a Listen that failed after the part
	// was made).
	close()
	// stats fills the part's share of ListenerStats.
	stats(s *ListenerStats)
}

// A queuePart is a feature's state on a queue (its zcrx instance and counters, zcrx.go;
// its splice pipes, relays and watch epoll, splice.go):
// made with the queue, before its backend starts, by the constructor its file registered
// (registerQueuePart), and found again by the index that returned, in queue.parts.
type queuePart interface {
	// stats adds the part's counters to s (Engine.Stats, once per queue).
	stats(s *Stats)
}

// Queue parts that serve the io_uring backend implement these too; the backend reaches
// them through the queue (backend.go's beQueue asks every part that does, in registration
// order), never by name. Both are called rarely: at the ring's creation, at a watch's
// first arm.

// A ringSetupPart takes part in making the queue's ring (zcrx's receive instance, zcrx.go).
type ringSetupPart interface {
	// wantsCQE32 says whether the part needs the ring's 32-byte completions.
	wantsCQE32(q *queue) bool
	// ringMade sets the part up on the queue's new ring u (cqe32: whether it has them).
	ringMade(q *queue, u *loop.URing, cqe32 bool) error
}

// A watchPart keeps the io_uring queue's private epoll instance for readiness watches
// (splice.go's spliceQueue): made on first use, nil when it cannot be.
type watchPart interface {
	ringEpoll(q *queue, u *loop.URing) *loop.Epoll
}

// queuePartMakers are the registered queue parts' constructors, in registration order.
var queuePartMakers []func() queuePart

// registerQueuePart registers a queue part's constructor (from a package variable's
// initializer) and returns its index in queue.parts.
func registerQueuePart(mk func() queuePart) int {
	queuePartMakers = append(queuePartMakers, mk)
	return len(queuePartMakers) - 1
}

// makeParts makes a queue's parts (before its backend starts).
func (q *queue) makeParts() {
	q.parts = make([]queuePart, len(queuePartMakers))
	for i, mk := range queuePartMakers {
		q.parts[i] = mk()
	}
}
