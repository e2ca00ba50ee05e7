// Package connstate is a zc connection's state machine: where the connection is in its life
// and where its socket is. Both only move forward, and only through the transitions below,
// which say whether they moved: zc's core makes each move on the connection's queue
// goroutine, and nothing else in zc can set a state (the fields are this package's).
//
// A connection's life:
//
//	New       made: accepted and not yet handed its handler, or dialing
//	Open      started (the accept function or DialAsync's done ran): receiving and sending
//	Closing   Close or an error began the close: queued sends drain (a graceful close) or
//	          were dropped (an error), then the socket is closed and the operations and
//	          zero-copy notifications still in the kernel are waited for
//	Finished  OnClose ran, or the dial failed: Done is closed
//
//	New ──Open──▶ Open ──BeginClose──▶ Closing ──Finish──▶ Finished
//	 │                                                        ▲
//	 └──BeginClose──▶ Closing          New, Open ──Finish─────┘
//
// The socket is a resource, not a stage: a connection may be open with its write side shut,
// or closing with its socket already closed.
//
//	SockOpen ──ShutWrite──▶ WriteShut ──CloseSock──▶ SockClosed
//	SockOpen ──CloseSock──────────────────────────▶ SockClosed
//
// Who reads the connection (its handler, the application itself, the net.Conn face, a
// Relay) is a third part of its state, Receive (reader.go): one reader at a time, claimed
// with checked transitions from any goroutine.
package connstate

import "sync/atomic"

// Life is where a connection is in its life.
type Life uint8

const (
	New Life = iota
	Open
	Closing
	Finished
)

func (l Life) String() string {
	switch l {
	case New:
		return "new"
	case Open:
		return "open"
	case Closing:
		return "closing"
	case Finished:
		return "finished"
	}
	return "connstate.Life(?)"
}

// Socket is where a connection's socket is.
type Socket uint8

const (
	SockOpen   Socket = iota
	WriteShut         // shutdown(SHUT_WR) sent the FIN
	SockClosed        // the descriptor is closed
)

func (s Socket) String() string {
	switch s {
	case SockOpen:
		return "open"
	case WriteShut:
		return "write-shut"
	case SockClosed:
		return "closed"
	}
	return "connstate.Socket(?)"
}

// State is one connection's state; the zero value is a New connection with its socket open.
// Transitions are made by one goroutine at a time (the connection's queue); Life and its
// questions may be asked from any goroutine (a writer's fast path asks whether the
// connection is closing), the socket's state only by the goroutine that moves it.
type State struct {
	life atomic.Uint32 // a Life
	sock Socket
}

// Life is where the connection is in its life (any goroutine).
func (s *State) Life() Life { return Life(s.life.Load()) }

// Opened reports whether the connection was started (also once it is closing or finished).
func (s *State) Opened() bool { return s.Life() >= Open }

// InClose reports whether closing began (also once the connection finished).
func (s *State) InClose() bool { return s.Life() >= Closing }

// Ended reports whether the connection finished.
func (s *State) Ended() bool { return s.Life() == Finished }

// Socket is where the connection's socket is.
func (s *State) Socket() Socket { return s.sock }

// SockClosed reports whether the socket is closed.
func (s *State) SockClosed() bool { return s.sock == SockClosed }

func (s *State) move(from, to Life) bool {
	if s.Life() > from {
		return false
	}
	s.life.Store(uint32(to))
	return true
}

// Open moves a New connection to Open; it reports false (and changes nothing) from any other
// state.
func (s *State) Open() bool {
	if s.Life() != New {
		return false
	}
	s.life.Store(uint32(Open))
	return true
}

// BeginClose moves a New or Open connection to Closing; false from Closing or Finished.
func (s *State) BeginClose() bool { return s.move(Open, Closing) }

// Finish moves the connection to Finished from any other state; false when it already
// finished.
func (s *State) Finish() bool { return s.move(Closing, Finished) }

// ShutWrite records that the socket's write side was shut (an open socket only).
func (s *State) ShutWrite() bool {
	if s.sock != SockOpen {
		return false
	}
	s.sock = WriteShut
	return true
}

// CloseSock records that the socket was closed; false when it already was.
func (s *State) CloseSock() bool {
	if s.sock == SockClosed {
		return false
	}
	s.sock = SockClosed
	return true
}
