// Package netconn is the net.Conn and net.Listener face of zc's connections, for code that
// wants io.Reader and io.Writer (net/http, crypto/tls, bufio work on it unchanged): Listen
// and Dial return a net.Listener and Conns served by a zc.Engine's queues.
//
// By default a Conn's Read is read(2) on the reading goroutine, waiting in Go's poller, as
// in Go's net (one copy, no hand-off to the queue); Options.Ring reads through the queue's
// receive ring instead. Writes (zc.Conn.Write), io.Copy into a Conn (zc.Conn.ReadFrom:
// sendfile from a file, splice from a socket) and closing go through the engine's queue.
// Deadlines work as in Go's net, and every error is a *net.OpError whose Err is what zc
// reported (matching zc's sentinels with errors.Is) or os.ErrDeadlineExceeded.
//
// The face is built on zc's public API only: zc.ListenOptions/DialOptions' ReadSelf (the
// application reads the socket itself, zc.Conn.Read) and Exclusive (the face's handler is
// the connection's only reader, so a zc.Relay or SetHandler of a face's connection is
// refused with zc.ErrInvalid). An application could write the same face.
//
// Lifecycle: Close on a Conn closes it gracefully and returns at once, as net.TCPConn's
// does; Close on the listener closes the zc.Listener and every accepted Conn that Accept did
// not return yet. zc.Engine.Close closes them all: Read then returns what had arrived, then
// an error matching net.ErrClosed.
package netconn
