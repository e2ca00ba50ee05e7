// Package netconn is the net.Conn and net.Listener face of zc's connections, for code that
// wants io.Reader and io.Writer (net/http, crypto/tls, bufio work on it unchanged): Listen
// and Dial return a net.Listener and Conns served by a zc.Engine's queues.
//
// By default a Conn's Read is read(2) on the reading goroutine, waiting in Go's poller, as
// in Go's net (one copy, no hand-off to the queue); Options.Ring reads through the queue's
// receive ring instead. Writes (zc.Conn.Write), io.Copy into a Conn (zc.Conn.ReadFrom:
// sendfile from a file, splice from a socket) and closing go through the engine's queue.
// A Write of 512 KiB or more is sent from the caller's slice (zc.Conn.SendBytes) and returns
// once the kernel no longer needs it; smaller ones are written directly when the socket
// takes them, the rest copied into send buffers. A write deadline that passes while such a
// large Write waits for the kernel closes the connection (unlike Go's net, where it stays
// usable: the bytes queued from the slice cannot be taken back while the kernel may read
// them); the Write returns os.ErrDeadlineExceeded only once the close let go of the slice
// (at once when the socket had taken it all, otherwise within zc.Config.CloseTimeout on a
// silent peer, zc.Config.CloseStall on one that answers but does not read). A Close, a
// reset or zc.Engine.Close while a large Write waits makes it return the error that ended
// the connection, once the slice is released; after such an error it reports 0 bytes
// written. Concurrent Writes go one after the other, each whole, as in Go's net.
//
// net.Buffers: Go's net.Buffers.WriteTo uses writev only on package net's own connections
// (it looks for an interface whose method package net does not export, which no other
// package can implement), so on this face it calls Write once per buffer, and a concurrent
// Write may come between two buffers. Conn.WriteBuffers writes them as one write, each
// buffer of 512 KiB or more from its own memory (as Write sends a slice that large).
//
// Deadlines work as in Go's net (but for the large Write above), and every error is a
// *net.OpError whose Err is what zc reported (matching zc's sentinels with errors.Is) or
// os.ErrDeadlineExceeded.
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
