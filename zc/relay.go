package zc

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/zcnet/zcnet/zc/internal/connstate"
)

// Relay forwards a's received bytes to b and b's to a by the cheapest correct path this host
// has (the zero RelayOptions: RelayAuto), until both directions ended:
//
//   - flow control both ways: a slow side stops the other side's receiving, and nothing
//     waits forever;
//   - a side's EOF half-closes the other side (CloseWrite, after what is queued for it), so
//     a peer that half-closes first still gets everything the other side sends afterwards;
//   - once both sides sent their EOF both connections close gracefully (queued bytes still
//     go out); when either side fails or closes, the other is closed too, after what the
//     relay took from the closed side. A graceful Close of either side lets out what the
//     relay took for it too; bytes a failed or reset side can no longer take are counted in
//     RelayStats.Lost, and RelayStats.Err says why the relay ended.
//
// Relay replaces both connections' handlers and lifts a receive pause set with
// SetReceivePaused. A connection that may receive before Relay runs must be paused until
// then (data that arrives earlier goes to its old handler): the accept function pauses the
// first side, and DialAsync's done function, which runs before the second side receives
// anything, calls Relay. It may be called from any goroutine. It fails with ErrClosed (and
// closes the other side) when either connection is already closing. A relay becomes the
// only reader of both connections: it fails with ErrInvalid, and changes nothing (both stay
// as they were, open), when either already has a reader other than its handler (another
// relay, the application itself with ReadSelf, a net.Conn face) or is a FanOut subscriber;
// and such a connection's handler can no longer be replaced (SetHandler: ErrInvalid).
// RelayStats counts what went each way, and by which path.
//
// opts, at most one, choose the path (and the splice path's pipe size); none is the zero
// RelayOptions (RelayAuto). A bad option fails with ErrInvalid, and a path this host cannot
// take with an error matching ErrNotSupported (both connections are then closed, as for any
// failed Relay).
func Relay(a, b *Conn, opts ...RelayOptions) (*RelayStats, error) {
	o, err := oneOption(opts, "relay", "")
	if err != nil {
		return nil, err
	}
	return relay(a, b, o)
}

// RelayPath is how a relay moves bytes.
type RelayPath uint8

const (
	// RelayAuto picks the cheapest correct path: RelaySplice where both connections' queues
	// can splice (the io_uring, plain and zcshim backends), no zero-copy receive (RecvZcrx)
	// delivers into registered memory and no kernel-TLS connection runs on a kernel before
	// Linux 6.14; RelaySendData otherwise. RelayStats.Path says which,
	// and RelayStats.Fallback why not splice.
	RelayAuto RelayPath = iota
	// RelaySendData receives into the queue's registered receive buffers and sends them as
	// they are (Conn.SendData): no user copy, but on loopback and veth the kernel copies
	// each send. The engine's flow control (MaxRecvHeld, MaxQueuedBytes) bounds memory.
	RelaySendData
	// RelaySplice moves bytes socket → pipe → socket with splice(2), never through user
	// memory: the relay's home queue (a's) waits for readiness (with epoll: the plain and
	// shim backends', or on io_uring one whose readiness the ring reports) and splices without
	// blocking. The pipe (RelayOptions.PipeSize per direction)
	// is the flow control: while it holds bytes the destination has not taken, the source is
	// not read. Each relay holds two pipes and a duplicate of each connection's descriptor.
	RelaySplice
)

func (p RelayPath) String() string {
	switch p {
	case RelayAuto:
		return "auto"
	case RelaySendData:
		return "senddata"
	case RelaySplice:
		return "splice"
	}
	return fmt.Sprintf("RelayPath(%d)", int(p))
}

// RelayOptions tune a Relay (its optional last argument). The zero value is RelayAuto.
type RelayOptions struct {
	// Path demands a path; RelayAuto (the default) picks one. A demanded path this host
	// cannot take fails with an error matching ErrNotSupported (a *NotSupportedError that
	// says why) instead of falling back.
	Path RelayPath
	// PipeSize is the splice path's pipe capacity per direction in bytes (default 1 MiB,
	// capped by /proc/sys/fs/pipe-max-size for unprivileged processes; Stats.Forward.PipeSizeRefused
	// counts pipes left at the kernel's default size). It bounds the bytes in flight each way.
	PipeSize int
}

const defaultPipeSize = 1 << 20

// relay is Relay with its options.
func relay(a, b *Conn, opts RelayOptions) (*RelayStats, error) {
	if a == nil || b == nil || a == b {
		return nil, &OpError{Op: "relay", Err: ErrInvalid}
	}
	// The relay becomes both connections' reader, or neither's: a connection another relay,
	// the application (ReadSelf) or a net.Conn face reads, or a FanOut subscriber, is
	// refused before anything changes (zc never receives for a ReadSelf one: a relay would
	// wait for bytes that never come; two readers would split the stream).
	if err := claimRelay(a, b); err != nil {
		return nil, err
	}
	closeBoth := func() { a.Close(); b.Close() }
	switch {
	case opts.Path > RelaySplice:
		closeBoth()
		return nil, a.opErr("relay", fmt.Errorf("unknown path %v: %w", opts.Path, ErrInvalid))
	case opts.PipeSize < 0:
		closeBoth()
		return nil, a.opErr("relay", fmt.Errorf("negative PipeSize %d: %w", opts.PipeSize, ErrInvalid))
	case opts.PipeSize == 0:
		opts.PipeSize = defaultPipeSize
	}
	r := &RelayStats{}
	path := opts.Path
	if path != RelaySendData {
		err := spliceRefusal(a, b)
		switch {
		case err == nil:
			path = RelaySplice
		case path == RelaySplice:
			closeBoth()
			return nil, a.opErr("relay", err)
		default:
			path = RelaySendData
			r.Fallback = err
		}
	}
	r.Path = path
	if path == RelaySplice {
		if err := startSpliceRelay(r, a, b, opts.PipeSize); err != nil {
			return nil, err
		}
		a.q.ctr.relaysSplice.Add(1)
		return r, nil
	}
	if r.Fallback != nil {
		a.q.ctr.relayFallbacks.Add(1)
	}
	ha := &relaySide{r: r, peer: b, bytes: &r.AtoB}
	hb := &relaySide{r: r, peer: a, bytes: &r.BtoA}
	if err := a.setHandler(ha, connstate.ReadRelay); err != nil {
		b.Close()
		return nil, err
	}
	if err := b.setHandler(hb, connstate.ReadRelay); err != nil {
		a.Close()
		return nil, err
	}
	if err := a.SetReceivePaused(false); err != nil {
		b.Close()
		return nil, a.opErr("relay", err)
	}
	if err := b.SetReceivePaused(false); err != nil {
		a.Close()
		return nil, b.opErr("relay", err)
	}
	return r, nil
}

// spliceRefusal says why the relay of a and b cannot splice (nil: it can).
func spliceRefusal(a, b *Conn) error {
	for _, c := range []*Conn{a, b} {
		if !spliceCapable(c.q) {
			return &NotSupportedError{What: "splice relay on the " + c.e.backend.String() + " backend",
				Need: "the io_uring, plain or shim backend"}
		}
		if c.e.cfg.RecvPath == RecvZcrx {
			return &NotSupportedError{What: "splice relay with RecvZcrx",
				Need: "RecvRing or RecvMapped (zcrx delivers into registered memory: SendData forwards it)"}
		}
		if err := c.tlsSpliceRefusal(); err != nil {
			return err
		}
	}
	return nil
}

// RelayStats are a relay's counters, safe to read from any goroutine.
type RelayStats struct {
	AtoB, BtoA atomic.Uint64 // bytes forwarded each way (by any path)
	// SplicedAtoB and SplicedBtoA are the part of AtoB and BtoA that moved by splice(2); the
	// rest went by SendData (on the splice path, bytes received before the relay took over).
	SplicedAtoB, SplicedBtoA atomic.Uint64
	// Lost counts bytes the relay took from one side and could not deliver to the other,
	// on either path: on the splice path, bytes in its pipe; on the SendData path (and for
	// what the splice path forwarded with SendData), bytes queued on the destination; in
	// both, when the destination failed, was reset or gave up sending them (a close that
	// was not graceful, CloseTimeout, Engine.Close's reset), and bytes received for a
	// destination already closing. A graceful Close of a side loses nothing the relay had
	// queued or held for it: that goes out first. (What the destination dropped is read from its
	// ConnStats.BytesDropped when it closes, so bytes queued on it before the relay started
	// count too.)
	Lost atomic.Uint64
	// Path is the path the relay took, both ways: RelaySplice or RelaySendData. Fallback says
	// why RelayAuto did not take the splice path (a *NotSupportedError); nil when it did, or
	// when RelaySendData was asked for. Both are set before Relay returns and never change.
	Path     RelayPath
	Fallback error
	ended    atomic.Int32 // directions that ended with EOF
	closed   atomic.Int32 // connections that finished
	mu       sync.Mutex
	err      error // the first failure that says why (mu)
}

// Err reports why the relay ended other than by both sides' EOF and graceful closes: the
// first failure (a reset: an error wrapping the system call's; a close that gave up after
// CloseTimeout: ErrCloseTimeout), or, when bytes were lost, an error saying how many (and
// matching the failure, or ErrClosed when all that is known is that the destination was
// closed). Nil while no failure is known.
func (r *RelayStats) Err() error {
	r.mu.Lock()
	err := r.err
	r.mu.Unlock()
	if n := r.Lost.Load(); n > 0 {
		return fmt.Errorf("relay: %d bytes taken from one side were not delivered to the other: %w", n, err)
	}
	return err
}

func (r *RelayStats) setErr(err error) {
	r.mu.Lock()
	if r.err == nil || (closedOnly(r.err) && !closedOnly(err)) {
		r.err = err
	}
	r.mu.Unlock()
}

// closedOnly: err says only that a connection was closed (a send refused with ErrClosed,
// bytes dropped at a close), not why; a later error that says why (a reset, CloseTimeout)
// replaces it as the relay's.
func closedOnly(err error) bool { return errors.Is(err, ErrClosed) && !errors.Is(err, ErrCloseTimeout) }

// lose counts n bytes that cannot be delivered, because of err (any goroutine).
func (r *RelayStats) lose(n uint64, err error) {
	r.setErr(err)
	r.Lost.Add(n)
}

// Finished reports whether both connections of the relay closed (OnClose ran on both).
func (r *RelayStats) Finished() bool { return r.closed.Load() == 2 }

// relaySide is the handler of one side of a SendData relay.
type relaySide struct {
	r     *RelayStats
	peer  *Conn
	bytes *atomic.Uint64
}

func (s *relaySide) OnData(c *Conn, d Data) {
	n := d.Len()
	if err := s.peer.SendData(d); err != nil {
		d.Release()              // a refused copy (mapped Data) is still ours; otherwise ErrStale, harmless
		s.r.lose(uint64(n), err) // taken from c, never delivered
		c.Close()                // the other side is gone: nothing more can be forwarded
		return
	}
	s.bytes.Add(uint64(n))
}

func (s *relaySide) OnEOF(c *Conn, err error) {
	if err != io.EOF {
		s.r.setErr(err)
		c.Close()
		s.peer.Close()
		return
	}
	s.peer.CloseWrite() // the FIN follows what is queued
	if s.r.ended.Add(1) == 2 {
		c.Close()
		s.peer.Close()
	}
}

func (s *relaySide) OnClose(c *Conn, err error) {
	s.r.closeLost(c, err)
	s.r.closed.Add(1)
	s.peer.Close()
}

// closeLost records, at c's OnClose, why c ended (err) and the bytes the relay forwarded to
// c that c dropped unsent (a reset, an abort, CloseTimeout, Engine.Close): the count is read
// once here, so forwarding costs nothing more.
func (r *RelayStats) closeLost(c *Conn, err error) {
	if err != nil {
		r.setErr(err)
	}
	if n := c.droppedBytes(); n > 0 {
		if err == nil {
			err = c.opErr("relay", fmt.Errorf("the connection ended before they were sent: %w", ErrClosed))
		}
		r.lose(n, err)
	}
}
