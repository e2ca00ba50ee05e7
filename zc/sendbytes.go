package zc

import (
	"fmt"
	"runtime"
	"sync"
	"time"
)

// Sending from the application's own memory (SendBytes): the segment (segApp) references
// the caller's slice, pinned for the Go runtime while it is queued or in the kernel, and
// the caller hears through its callback when the kernel is done with it. The backends send
// from it as from any other segment: io_uring with SEND / SENDMSG (gathered with the
// segments around it) or SEND_ZC by address when the adaptive policy says so (the
// completion, then the notification), the plain backend with writev; the zcshim backend
// sends only from memory registered with the module, so it copies the bytes into its send
// buffers first (Stats.Send.BytesAppCopied) and the callback runs once they are copied.

// maxAppSend bounds one SendBytes (a segment's length is an int32).
const maxAppSend = 1 << 30

// appCopyMax: a SendBytes of at most this many bytes with no callback is copied behind
// the bytes Write staged, when the staging buffer has room (stageSmall): holding a slice
// (pin, segment, iovec, unpin) costs more than copying that much, and the kernel's
// copying send copies it anyway.
const appCopyMax = 2 << 10

// stageSmall copies p behind what Write staged, if a staging buffer is open with room
// for it (any goroutine): it keeps its place in the stream, as a Write's bytes do.
func (c *Conn) stageSmall(p []byte) bool {
	c.mu.Lock()
	t := c.tx
	if c.werr != nil || t == nil || !t.hasStage || len(t.stageBytes())-t.stageN < len(p) {
		c.mu.Unlock()
		return false
	}
	copy(t.stageBytes()[t.stageN:], p)
	t.stageN += len(p)
	c.queued += len(p)
	kick := c.kickLocked()
	c.mu.Unlock()
	if kick {
		c.schedule()
	}
	c.e.shareCtr.appSent.Add(uint64(len(p)))
	c.e.shareCtr.appCopied.Add(uint64(len(p)))
	return true
}

// appMem is a SendBytes segment's memory: the caller's slice, its pin, and the callback.
type appMem struct {
	p    []byte
	done func(error)
	pin  runtime.Pinner
}

var appMemPool = sync.Pool{New: func() any { return new(appMem) }}

func appSeg(a *appMem) seg { return seg{kind: segApp, own: a, n: int32(len(a.p))} }

// segBytes and segDone make the application's memory a segOwner (segApp).
func (a *appMem) segBytes() []byte { return a.p }

func (a *appMem) segDone(c *Conn, s seg, queued bool) {
	if queued {
		c.finishApp(s)
	} else {
		c.refuseApp(s)
	}
}

// release unpins the memory and hands the appMem back to its pool, returning the callback.
func (a *appMem) release() func(error) {
	done := a.done
	a.pin.Unpin()
	a.p, a.done = nil, nil
	appMemPool.Put(a)
	return done
}

// SendBytes queues p for sending straight from the application's memory: no copy into a
// send buffer is made (on the io_uring and plain backends). p is sent in order with the
// connection's other sends (Write, Send, SendData, SendFile, Shared.Send), and the kernel
// reads it whenever it sends: the caller must not write p from the call until done runs.
// A header in a send buffer (Send) followed by a body sent with SendBytes leave in one
// system call (one SENDMSG or writev with both), unless the body goes zero-copy.
//
// done is called exactly once, on the connection's queue goroutine (like a handler
// method: it must not block, and Config.Debug.SlowHandler times it; a panic in it is
// recovered like a handler's, counted in Stats.Faults.HandlerPanics, and closes the
// connection with a *PanicError), when the kernel no longer needs p: after the copying send
// that took its last byte completed, or after the zero-copy notification of a SEND_ZC
// (Config.SendPath and the adaptive policy decide, as for send buffers). Its error is nil
// when every byte was handed to the kernel (whether the peer got them is what OnClose and
// Close report, as for every send), or, when the connection ended first (closed, reset,
// failed, CloseTimeout, Engine.Close), an error matching what ended it (ErrClosed,
// ErrCloseTimeout, syscall.ECONNRESET ...) that says how many bytes were not sent; those
// count in ConnStats.BytesDropped. done may be nil when p is never written again (a value
// replaced, not modified, by its owner): then nothing tells the caller, and p is only
// kept alive (and pinned) while the kernel needs it. p may be memory zc lent the caller
// (a received Data's Bytes, a Buf's): keep that unreleased until done runs, and release
// it there (SendData and Send pass such memory on without a callback). A p of at most
// 2 KiB with a nil done
// is copied behind the bytes Write staged when the staging buffer has room for it (holding
// so few bytes costs more than copying them; Stats.Send.BytesAppCopied counts them).
//
// While queued or in the kernel p is pinned (runtime.Pinner), so the runtime neither moves
// nor frees it; it is unpinned before done runs. With Config.Debug.Buffers the bytes are
// checksummed at the call and again when the kernel is done: a change in between is
// reported as a *MisuseError ("write before SendBytes' done").
//
// SendBytes may be called from any goroutine and never blocks: like Send it queues above
// MaxQueuedBytes (wait for OnWritable, or watch Queued, to keep a stream bounded). On
// error nothing is queued, done is not called and p is the caller's again: an empty p
// (ErrEmpty), p longer than 1 GiB (ErrTooLarge), a connection closed or closing
// (ErrClosed, or the error that ended it), or the zcshim backend with Config.SendPath
// SendZeroCopy, which forbids the copy that backend makes (ErrNotSupported).
// Stats.Send.BytesApp counts the bytes sent this way.
func (c *Conn) SendBytes(p []byte, done func(err error)) error {
	switch {
	case len(p) == 0:
		return c.opErr("send", ErrEmpty)
	case len(p) > maxAppSend:
		return c.opErr("send", fmt.Errorf("%d bytes in one SendBytes (at most %d): %w", len(p), maxAppSend, ErrTooLarge))
	}
	if !c.q.be.appDirect() && c.e.cfg.SendPath == SendZeroCopy {
		return c.opErr("send", fmt.Errorf("the %s backend copies application memory into its send buffers, and Config.SendPath is SendZeroCopy: %w", c.q.be.name(), ErrNotSupported))
	}
	if done == nil && len(p) <= appCopyMax && c.stageSmall(p) {
		return nil
	}
	a := appMemPool.Get().(*appMem)
	a.p, a.done = p, done
	a.pin.Pin(&p[0])
	c.e.shareCtr.appHeld.Add(1)
	s := appSeg(a)
	if dbg := c.e.dbg; dbg != nil && dbg.buffers() {
		s.sum = dbg.sum(p)
	}
	return c.enqueue(s)
}

// finishApp hands a SendBytes segment back: unpinned, counted, and its callback called
// with what became of it (loop only).
func (c *Conn) finishApp(s seg) {
	var err error
	if unsent := int(s.n - s.off); unsent > 0 {
		err = c.opErr("send", fmt.Errorf("%d of %d bytes of SendBytes not sent: %w", unsent, s.n, c.unsentCause()))
	}
	c.e.shareCtr.appSent.Add(uint64(s.off))
	c.e.shareCtr.appHeld.Add(-1)
	if done := s.own.(*appMem).release(); done != nil {
		c.callAppDone(done, err)
	}
}

// refuseApp gives a SendBytes segment that was never queued back to the caller: unpinned,
// no callback (SendBytes returns the error).
func (c *Conn) refuseApp(s seg) {
	c.e.shareCtr.appHeld.Add(-1)
	s.own.(*appMem).release()
}

// unsentCause is why a connection's queued bytes were not sent: what ended it (loop only).
func (c *Conn) unsentCause() error {
	switch {
	case c.closeErr == errCloseTimedOut:
		return ErrCloseTimeout
	case c.closeErr != nil:
		return c.closeErr
	}
	c.mu.Lock()
	err := c.werr
	c.mu.Unlock()
	if err == nil || err == errWriteClosed {
		return ErrClosed
	}
	return err
}

// callAppDone runs a SendBytes callback; a panic in it is recovered and counted
// (Stats.Faults.HandlerPanics) and closes the connection, as a handler's panic does, and
// one that runs longer than Config.Debug.SlowHandler is counted like a slow handler (it
// runs on the queue goroutine too).
func (c *Conn) callAppDone(done func(error), err error) {
	if dbg := c.e.dbg; dbg != nil && dbg.slowHandler() {
		defer dbg.handlerRan(c, "SendBytes callback", time.Now())
	}
	defer func() {
		if v := recover(); v != nil {
			c.q.ctr.handlerPanics.Add(1)
			pe := c.opErr("send", newPanicError("SendBytes callback", v))
			if !c.ended() {
				// Not from inside the send bookkeeping that called us: on the next round.
				_ = c.q.Post(func() { c.fail(pe) })
			}
		}
	}()
	done(err)
}
