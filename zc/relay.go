package zc

import (
	"io"
	"sync/atomic"
)

// Relay forwards a's received bytes to b and b's to a with SendData (no copy: received
// buffers are sent as they are), until both directions ended:
//
//   - flow control both ways is the engine's (MaxRecvHeld, MaxQueuedBytes): a slow side
//     stops the other side's receiving, and nothing waits forever;
//   - a side's EOF half-closes the other side (CloseWrite, after what is queued for it), so
//     a peer that half-closes first still gets everything the other side sends afterwards;
//   - once both sides sent their EOF both connections close gracefully (queued bytes still
//     go out); when either side fails or closes, the other is closed too.
//
// Relay replaces both connections' handlers and lifts a receive pause set with
// SetReceivePaused. A connection that may receive before Relay runs must be paused until
// then (data that arrives earlier goes to its old handler): the accept function pauses the
// first side, and DialAsync's done function, which runs before the second side receives
// anything, calls Relay. It may be called from any goroutine. It fails with ErrClosed (and
// closes the other side) when either connection is already closing. RelayStats counts what
// went each way.
func Relay(a, b *Conn) (*RelayStats, error) {
	if a == nil || b == nil || a == b {
		return nil, &OpError{Op: "relay", Err: ErrInvalid}
	}
	r := &RelayStats{}
	ha := &relaySide{r: r, peer: b, bytes: &r.AtoB}
	hb := &relaySide{r: r, peer: a, bytes: &r.BtoA}
	if err := a.SetHandler(ha); err != nil {
		b.Close()
		return nil, err
	}
	if err := b.SetHandler(hb); err != nil {
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

// RelayStats are a relay's counters, safe to read from any goroutine.
type RelayStats struct {
	AtoB, BtoA atomic.Uint64 // bytes forwarded (handed to SendData) each way
	ended      atomic.Int32  // directions that ended with EOF
	closed     atomic.Int32  // connections that finished
}

// Finished reports whether both connections of the relay closed (OnClose ran on both).
func (r *RelayStats) Finished() bool { return r.closed.Load() == 2 }

// relaySide is the handler of one side of a relay.
type relaySide struct {
	r     *RelayStats
	peer  *Conn
	bytes *atomic.Uint64
}

func (s *relaySide) OnData(c *Conn, d Data) {
	n := d.Len()
	if err := s.peer.SendData(d); err != nil {
		d.Release() // a refused copy (mapped Data) is still ours; otherwise ErrStale, harmless
		c.Close()   // the other side is gone: nothing more can be forwarded
		return
	}
	s.bytes.Add(uint64(n))
}

func (s *relaySide) OnEOF(c *Conn, err error) {
	if err != io.EOF {
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
	s.r.closed.Add(1)
	s.peer.Close()
}
