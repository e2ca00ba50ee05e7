package zc

// connLife is where a connection is in its life. It only moves forward, and only the core
// moves it (setLife): backends read it, never write it.
//
//	lifeNew      made: accepted and not yet handed its handler, or dialing (c.connect)
//	lifeOpen     started (accept function or DialAsync's done ran): receiving and sending
//	lifeClosing  Close or an error began the close (beginClose): queued sends drain (a
//	             graceful close, bounded by CloseTimeout) or were dropped (an error), then
//	             the socket is closed (sockClosed) and in-flight operations and zero-copy
//	             notifications are waited for
//	lifeFinished OnClose ran (finish), or the dial failed (dialFailed): Done is closed
//
// The socket itself is a resource, not a stage: sockState says where it is (closing closes it
// before finishing; a failed dial closes it and finishes at once).
type connLife uint8

const (
	lifeNew connLife = iota
	lifeOpen
	lifeClosing
	lifeFinished
)

func (l connLife) String() string {
	switch l {
	case lifeNew:
		return "new"
	case lifeOpen:
		return "open"
	case lifeClosing:
		return "closing"
	case lifeFinished:
		return "finished"
	}
	return "connLife(?)"
}

// setLife moves the connection forward to l (loop only); a move backwards is ignored. The
// field is atomic because a writer's fast path (idleLocked) reads it off the loop.
func (c *Conn) setLife(l connLife) {
	if l > c.lifeNow() {
		c.life.Store(uint32(l))
	}
}

func (c *Conn) lifeNow() connLife { return connLife(c.life.Load()) }

// opened: the connection was started (its handler may have run; also once it finished).
func (c *Conn) opened() bool { return c.lifeNow() >= lifeOpen }

// inClose: closing began (or the connection finished).
func (c *Conn) inClose() bool { return c.lifeNow() >= lifeClosing }

// ended: the connection finished (OnClose ran, or the dial failed).
func (c *Conn) ended() bool { return c.lifeNow() == lifeFinished }

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

// sockState is where the connection's socket is; it only moves forward. The socket is a
// resource, not a stage of the connection's life: a connection may be open with its write
// side shut, or closing with its socket already closed.
type sockState uint8

const (
	sockOpen      sockState = iota
	sockWriteShut           // shutdown(SHUT_WR) sent the FIN (CloseWrite, once the queue drained)
	sockClosed              // closed by the backend (closeSocket), or by a failed dial
)

// socketClosed records that the backend closed the socket (closeSocket).
func (c *Conn) socketClosed() {
	c.sk = sockClosed
	c.fd = -1
}
