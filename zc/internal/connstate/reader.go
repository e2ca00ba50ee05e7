package connstate

import "sync/atomic"

// Reader is who takes a connection's received bytes. There is one at a time:
//
//	Handler  the connection's Handler (the default; SetHandler may replace it)
//	Self     the application reads the socket itself (ReadSelf): zc never receives
//	Face     the net.Conn face (its handler, or its Read of a ReadSelf connection)
//	Relay    a Relay's handlers, then its splice, until the connection ends
//
// FanOuts are not readers: a FanOut wraps whatever handler the connection has (every event
// still reaches it) to hear when the subscriber drained or closed, and sends to it. A
// subscriber may be in several FanOuts; a relayed connection in none (the relay's bytes and
// the FanOut's would interleave on it, and the relay replaces the handler the FanOut wraps).
//
//	Handler ──Take(Self)──▶ Self ──Take(Face)──▶ Face
//	Handler ──Take(Face)──────────────────────▶ Face
//	Handler ──Take(Relay)─▶ Relay ──Untake(Relay)──▶ Handler   (a relay that never started)
//	wrappers: Wrap (+1, any reader but Relay), Unwrap (-1); Take(Relay) needs none
type Reader uint8

const (
	ReadHandler Reader = iota
	ReadSelf
	ReadFace
	ReadRelay
)

func (r Reader) String() string {
	switch r {
	case ReadHandler:
		return "handler"
	case ReadSelf:
		return "self"
	case ReadFace:
		return "face"
	case ReadRelay:
		return "relay"
	}
	return "connstate.Reader(?)"
}

// maxWrappers bounds the FanOut wrappers of one connection (the count's bits).
const maxWrappers = 1<<24 - 1

// Receive is a connection's reader and the number of FanOuts wrapping its handler. Its
// transitions may be made from any goroutine (Relay and FanOut.Add are called from any):
// each is one compare-and-swap, so of two racing claims exactly one wins. The zero value is
// ReadHandler with no wrappers.
type Receive struct {
	w atomic.Uint32 // low 8 bits: the Reader; above: the wrappers
}

func split(w uint32) (Reader, uint32) { return Reader(w & 0xff), w >> 8 }
func join(r Reader, n uint32) uint32  { return uint32(r) | n<<8 }

// Reader is who reads the connection now.
func (s *Receive) Reader() Reader { r, _ := split(s.w.Load()); return r }

// Wrappers is how many FanOuts wrap the connection's handler now.
func (s *Receive) Wrappers() int { _, n := split(s.w.Load()); return int(n) }

// step moves the state by f (which reports the new word and whether the move is allowed)
// in one compare-and-swap; it reports whether it moved.
func (s *Receive) step(f func(r Reader, n uint32) (uint32, bool)) bool {
	for {
		old := s.w.Load()
		nw, ok := f(split(old))
		if !ok {
			return false
		}
		if s.w.CompareAndSwap(old, nw) {
			return true
		}
	}
}

// Take makes to the reader: Self or Face from Handler, Face from Self (the face of a
// ReadSelf connection), Relay from Handler with no FanOut wrapping it. Anything else reports
// false and changes nothing.
func (s *Receive) Take(to Reader) bool {
	return s.step(func(r Reader, n uint32) (uint32, bool) {
		switch {
		case to == ReadSelf && r == ReadHandler,
			to == ReadFace && (r == ReadHandler || r == ReadSelf),
			to == ReadRelay && r == ReadHandler && n == 0:
			return join(to, n), true
		}
		return 0, false
	})
}

// Untake gives a Relay's claim back (Relay → Handler): for a relay that took one side and
// could not take the other, before it changed anything. False from any other reader.
func (s *Receive) Untake(from Reader) bool {
	return s.step(func(r Reader, n uint32) (uint32, bool) {
		if from != ReadRelay || r != ReadRelay {
			return 0, false
		}
		return join(ReadHandler, n), true
	})
}

// Wrap counts one more FanOut wrapping the handler; false while a Relay reads (or at the
// bound).
func (s *Receive) Wrap() bool {
	return s.step(func(r Reader, n uint32) (uint32, bool) {
		if r == ReadRelay || n >= maxWrappers {
			return 0, false
		}
		return join(r, n+1), true
	})
}

// Unwrap counts one FanOut fewer; false when none wraps the handler.
func (s *Receive) Unwrap() bool {
	return s.step(func(r Reader, n uint32) (uint32, bool) {
		if n == 0 {
			return 0, false
		}
		return join(r, n-1), true
	})
}
