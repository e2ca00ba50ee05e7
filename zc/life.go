package zc

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
// its own (uringConn, epollConn, the fake backend's), made with the connection
// (backend.newConnState) and held in Conn.bk only so the backend finds it again. The field is
// an interface: the core cannot look inside, and no backend writes a field of Conn
// (TestBackendsWriteOnlyTheirState). What the core must know of the backend's work it learns
// from the backend's reports (recvStarted, recvEnded, opStarted, opEnded, socketClosed, and
// the completions: deliver, advance, zcCompleted, gotEOF, fail ...).
type backendState interface{ backendState() }

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
}
