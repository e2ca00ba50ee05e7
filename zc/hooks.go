package zc

import (
	"time"

	"github.com/zcnet/zcnet/memreg"
)

// The core's hook points: what the core calls of the features built on it, declared here so
// that the core names only these types and the features (in their own files) implement
// them. A hook that a feature does not install is nil, and each call site checks that first:
// a default engine pays one nil check per hook point, and no call allocates.

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

// features are the entry points the core calls, at fixed points of an engine's, a listener's
// and a connection's life, into the features an option asks for. Each feature's file sets
// its own in an init function, so the core names none of a feature's declarations; the order
// of the calls is the core's (Listen, Dial, the accept and the end of a connection say it).
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
}
