package zc

import (
	"fmt"

	"github.com/zcnet/zcnet/zc/internal/connstate"
)

// A connection's state (Conn.st) is a connstate.State: where it is in its life (new, open,
// closing, finished) and where its socket is (open, write side shut, closed). Both only move
// forward, through connstate's transitions, and only the core moves them, on the queue:
//
//	Open        accept (listener.go) or dialDone, once the backend started the connection
//	BeginClose  beginClose: Close, CloseWrite's end, an error, a handler's panic
//	Finish      finish (OnClose, Done), or dialFailed
//	ShutWrite   maybeShutdownWrite, once CloseWrite's queue drained
//	CloseSock   socketClosed, after the backend closed the socket; or dialFailed
//
// Backends read it (opened, inClose, ended, st.SockClosed), never move it.

// opened: the connection was started (its handler may have run; also once it finished).
func (c *Conn) opened() bool { return c.st.Opened() }

// inClose: closing began (or the connection finished).
func (c *Conn) inClose() bool { return c.st.InClose() }

// ended: the connection finished (OnClose ran, or the dial failed).
func (c *Conn) ended() bool { return c.st.Ended() }

// The backend's own state of a connection is not in Conn: each backend keeps it in a type of
// its own (in its package under zc/internal/be, and the fake backend's), made with the
// connection (backend.newConnState) and held in Conn.bk (a becontract.ConnState) only so the
// backend finds it again. The field is an interface: the core cannot look inside, and a
// backend sees the connection only as a becontract.Conn (backend.go's beConn), so it cannot
// write a field of Conn. What the core must know of the backend's work it learns from the
// backend's reports (recvStarted, recvEnded, opStarted, opEnded, socketClosed, and the
// completions: deliver, advance, zcCompleted, gotEOF, fail ...).

// recvStarted / recvEnded: the backend reports that receiving is armed / no longer armed.
func (c *Conn) recvStarted() { c.recvArmed = true }
func (c *Conn) recvEnded()   { c.recvArmed = false }

// opStarted / opEnded: the backend reports an operation of the connection entering / leaving
// the kernel (a close waits for every one of them).
func (c *Conn) opStarted() { c.ops++ }
func (c *Conn) opEnded()   { c.ops-- }

// socketClosed records that the backend closed the socket (closeSocket).
func (c *Conn) socketClosed() {
	c.st.CloseSock()
	c.fd = -1
	if c.tls != nil {
		c.tls.sockClosed(c)
	}
}

// Who reads a connection (Conn.rd, a connstate.Receive): its handler (the default), the
// application itself (ReadSelf), the net.Conn face, or a Relay; FanOuts wrap whatever
// handler it has. One reader at a time, changed only by connstate's transitions, from any
// goroutine (each is one compare-and-swap):
//
//	Take(Self)    openSelf, before the loop first sees the connection
//	Take(Face)    takeReader, when an Exclusive handler is installed (accept, dial)
//	Take(Relay)   Relay; Untake when its other side was refused
//	Wrap/Unwrap   FanOut.Add / FanOut.remove
//
// Every claim that is refused is an ErrInvalid that changes nothing (claimRelay,
// FanOut.Add, SetHandler): two relays of one connection, a relay of a subscriber or of a
// connection the application or the face reads, cannot happen.

// takeReader makes the first handler's claim on c when it is installed (accept, dial): an
// Exclusive handler (ListenOptions/DialOptions.Exclusive: the net.Conn face's) is the
// connection's reader for good (connstate's Face: its Read copies out of the Data it
// queues, or reads the socket itself after ReadSelf's claim).
func (c *Conn) takeReader(exclusive bool) {
	if exclusive {
		c.rd.Take(connstate.ReadFace)
	}
}

// readerErr says why c's reader cannot be changed to what was asked: its current reader.
func (c *Conn) readerErr() error {
	switch c.rd.Reader() {
	case connstate.ReadSelf:
		return fmt.Errorf("the application reads the connection itself (ReadSelf): %w", ErrInvalid)
	case connstate.ReadFace:
		return fmt.Errorf("its handler reads the connection for good (Exclusive: a net.Conn face): %w", ErrInvalid)
	case connstate.ReadRelay:
		return fmt.Errorf("a Relay reads the connection: %w", ErrInvalid)
	}
	if n := c.rd.Wrappers(); n > 0 {
		return fmt.Errorf("the connection is a FanOut subscriber (of %d): %w", n, ErrInvalid)
	}
	return fmt.Errorf("its reader changed meanwhile: %w", ErrInvalid)
}

// handlerOwned reports (as an ErrInvalid saying why) that the application may not replace
// c's handler: a Relay or the face reads it, or a FanOut wraps it.
func (c *Conn) handlerOwned() error {
	switch r := c.rd.Reader(); {
	case r == connstate.ReadFace, r == connstate.ReadRelay, c.rd.Wrappers() > 0:
		return c.readerErr()
	}
	return nil
}

// claimRelay makes a relay the reader of both a and b, or of neither (ErrInvalid saying why,
// nothing changed).
func claimRelay(a, b *Conn) error {
	if !a.rd.Take(connstate.ReadRelay) {
		return a.opErr("relay", a.readerErr())
	}
	if !b.rd.Take(connstate.ReadRelay) {
		a.rd.Untake(connstate.ReadRelay)
		return b.opErr("relay", b.readerErr())
	}
	return nil
}
