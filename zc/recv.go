package zc

import (
	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/memreg"
)

// Data is a borrowed receive buffer.
type Data struct {
	c   *Conn      // the connection that received it (its receive credit)
	buf memreg.Buf // a ring buffer of its own, when src is nil
	src dataSource // who owns the bytes otherwise: the mapped window, a zcrx area, a shared buffer
	off int        // where the bytes start in src's (Slice)
	n   int
}

// A dataSource owns received bytes that are not a ring buffer of the Data's own: a run of
// the mapped window (*mappedData, mapped.go), a buffer of a zcrx area (*zcrxData and its
// further references *zcrxRef, zcrx.go), or one more reference to a shared ring buffer (*refData, from Retain and Slice,
// shared.go). Ring Data, the common case, keeps its buffer inline (Data.buf, src nil) so
// that a receive allocates nothing; every other difference between the receive paths is
// behind this interface, so Data's methods never ask which path the bytes came from.
type dataSource interface {
	// bytes returns all of the source's bytes (Data takes [off, off+n)), nil once released.
	bytes() []byte
	// credit is the receive credit (MaxRecvHeld) d holds on its connection.
	credit(d Data) int64
	// release gives d's reference back (memreg.ErrStale when it already went back).
	release(d Data) error
	// retain returns one more reference to the same bytes (Data.Retain).
	retain(d Data) (dataSource, error)
	// send is c.SendData(d): a retained ring buffer goes out shared, a zcrx buffer from the
	// area itself, mapped pages (which belong to the socket's receive queue) are copied.
	send(c *Conn, d Data) error
}

// Bytes returns the received bytes, or nil after Release.
func (d Data) Bytes() []byte {
	var b []byte
	if d.src != nil {
		b = d.src.bytes()
	} else {
		b = d.buf.Bytes()
	}
	if b == nil {
		return nil
	}
	return b[d.off : d.off+d.n]
}

// Len returns the number of bytes received.
func (d Data) Len() int { return d.n }

// Release gives the buffer back (to the queue's receive pool, the mapped window, or the zcrx
// area through its refill ring), from any goroutine. A second Release returns
// memreg.ErrStale. Releasing works after the engine closed: the memory stays mapped until
// the last buffer is released. Of a retained buffer (Retain) each reference is released on
// its own; the buffer, and its receive credit, go back with the last.
func (d Data) Release() error {
	if d.c != nil && d.c.e.dbg != nil {
		d.c.e.dbg.released(d)
	}
	if d.src != nil {
		return d.src.release(d)
	}
	shared := d.buf.Shared() // retained: the last reference returns the credit (Retain's onLast)
	if err := d.buf.Release(); err != nil {
		return err
	}
	if !shared && d.c != nil {
		d.c.releaseHeld(d.credit())
	}
	return nil
}

// credit is the receive credit the Data takes from its connection (MaxRecvHeld).
func (d Data) credit() int64 {
	if d.src != nil {
		return d.src.credit(d)
	}
	return int64(d.buf.Region().BufSize())
}

// setupRecvPath prepares the receive path Config.RecvPath asks for, through its feature's
// hook (features.recvSetup: the ring needs none), before the connection's first receive
// (loop only).
func (c *Conn) setupRecvPath() {
	if p := c.e.cfg.RecvPath; p >= 0 && int(p) < len(features.recvSetup) && features.recvSetup[p] != nil {
		features.recvSetup[p](c)
	}
}

// A recvPath is where a connection's bytes land when it does not receive into the queue's
// provided-buffer ring (Conn.rx nil, the default): the socket's own pages through a mapped
// window (*mappedRecv, RecvMapped, mapped.go) or a zcrx area (*zcrxConn, RecvZcrx,
// zcrx.go). Both exist only on the io_uring backend (setupRecvPath falls back to the ring
// elsewhere, visibly); the backend arms and stops receiving through the path without asking
// which one it is, and the path reports to the core as the ring does (recvStarted,
// recvEnded, deliver or callData, gotEOF).
type recvPath interface {
	// arm starts receiving (the backend's armRecv).
	arm(b ringBackend)
	// stop stops receiving (a pause or the close, the backend's stopRecv); the path reports
	// recvEnded when its last completion is in.
	stop(b ringBackend)
	// finish: the connection finished; the path lets its resources go once the handler has
	// given back every Data it holds.
	finish()
}

// A polledRecv is a recvPath that waits for readiness with a poll the backend arms
// (armPoll) and reads the socket itself when it fires (*mappedRecv): the backend hands it
// the poll's completion (Conn.OnPoll in the contract).
type polledRecv interface {
	onPoll(ev loop.Event)
}
