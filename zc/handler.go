package zc

import (
	"time"
)

// Handler receives a connection's events. Its methods run on the connection's queue
// goroutine, one at a time, on every backend: they must not block (a call that would wait for
// a queue goroutine returns ErrWouldBlock there). They may call the connection's methods. A
// panic in a handler method closes that connection with a *PanicError; the engine goes on.
type Handler interface {
	// OnData delivers received bytes. d is borrowed until d.Release (or until it is passed
	// to SendData). A connection holds at most Config.MaxRecvHeld bytes of received data:
	// at the bound it stops receiving until some is released.
	OnData(c *Conn, d Data)
	// OnEOF reports that the receive side ended: io.EOF when the peer closed its side, or
	// the error. Sending may still work after io.EOF.
	OnEOF(c *Conn, err error)
	// OnClose reports that the connection is closed and its resources freed: err is nil
	// after a local Close (or Engine.Close) that sent everything queued, otherwise the error
	// that ended it. A graceful close that gave up after Config.CloseTimeout (the peer was
	// silent: the queued bytes were dropped and the connection reset) reports an error
	// matching ErrCloseTimeout (a *CloseTimeoutError, whose Unsent counts every byte the
	// peer did not acknowledge). ConnStats.BytesDropped counts what was dropped before it
	// reached the kernel.
	OnClose(c *Conn, err error)
}

// Writable is an optional Handler extension: OnWritable runs on the connection's queue
// goroutine whenever sends completed (or a zero-copy buffer came back) and less than half of
// MaxQueuedBytes is queued, so a sender can produce its next buffers right there. Start a
// sender with Conn.Post. It is the event-loop way to stream, and to resume a relay.
type Writable interface {
	OnWritable(c *Conn)
}

// HandlerFuncs adapts functions to Handler (and Writable). A nil Data releases the data
// unread; the other nil functions do nothing.
type HandlerFuncs struct {
	Data     func(c *Conn, d Data)
	EOF      func(c *Conn, err error)
	Close    func(c *Conn, err error)
	Writable func(c *Conn)
}

func (h HandlerFuncs) OnData(c *Conn, d Data) {
	if h.Data != nil {
		h.Data(c, d)
	} else {
		d.Release()
	}
}

func (h HandlerFuncs) OnEOF(c *Conn, err error) {
	if h.EOF != nil {
		h.EOF(c, err)
	}
}

func (h HandlerFuncs) OnClose(c *Conn, err error) {
	if h.Close != nil {
		h.Close(c, err)
	}
}

func (h HandlerFuncs) OnWritable(c *Conn) {
	if h.Writable != nil {
		h.Writable(c)
	}
}

// ---- dispatch (loop only) ------------------------------------------------------------

// The handler calls below recover a panic and close the connection with it.

func (c *Conn) callData(d Data) {
	defer c.recoverHandler("OnData")
	c.inData.Store(true)
	defer c.inData.Store(false)
	if dbg := c.e.dbg; dbg != nil && dbg.slowHandler() {
		defer dbg.handlerRan(c, "OnData", time.Now())
	}
	c.h.OnData(c, d)
}

func (c *Conn) callEOF(err error) {
	defer c.recoverHandler("OnEOF")
	if dbg := c.e.dbg; dbg != nil && dbg.slowHandler() {
		defer dbg.handlerRan(c, "OnEOF", time.Now())
	}
	c.h.OnEOF(c, err)
}

func (c *Conn) callWritable(w Writable) {
	defer c.recoverHandler("OnWritable")
	if dbg := c.e.dbg; dbg != nil && dbg.slowHandler() {
		defer dbg.handlerRan(c, "OnWritable", time.Now())
	}
	w.OnWritable(c)
}

func (c *Conn) callClose(err error) {
	defer func() {
		if v := recover(); v != nil {
			c.q.ctr.handlerPanics.Add(1)
		}
	}()
	c.h.OnClose(c, err)
}

func (c *Conn) callPosted(fn func()) {
	defer c.recoverHandler("posted function")
	if dbg := c.e.dbg; dbg != nil && dbg.slowHandler() {
		defer dbg.handlerRan(c, "posted function", time.Now())
	}
	fn()
}

func (c *Conn) recoverHandler(method string) {
	if v := recover(); v != nil {
		c.q.ctr.handlerPanics.Add(1)
		c.fail(c.opErr(method, newPanicError(method, v)))
	}
}
