package zc

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc/internal/connstate"
)

// The connection core: everything below runs on the connection's queue goroutine and is the
// same for every backend. A backend only moves bytes: it arms and stops receiving, sends the
// head of c.tx.pend, closes the socket, and reports back through deliver / advance / notified /
// opDone / fail.

// Conn.reqs bits.
const (
	reqClose = 1 << iota // closeReq
	reqShut              // shutReq
)

// connSched is Conn seen by the loop as a loop.Flusher (a conversion, no allocation; it keeps
// Flush out of Conn's public method set).
type connSched Conn

func (s *connSched) Flush(q *loop.Queue) {
	c := (*Conn)(s)
	c.scheduled.Store(false)
	c.service()
}

// service looks at the producer side: close requests, new sends, a half-close.
func (c *Conn) service() {
	if c.ended() || !c.opened() {
		return
	}
	closeReq := false
	if c.reqs.Load()&reqClose != 0 {
		c.mu.Lock()
		closeReq = c.closeReq
		c.mu.Unlock()
	}
	if closeReq && !c.inClose() {
		c.beginClose(nil)
		return
	}
	c.pump()
	if c.inClose() {
		c.advanceClose()
	}
}

// takeWork moves the producer's queue to c.tx.pend; when there is nothing at all it clears
// kicked, so the next producer kicks the loop again.
func (c *Conn) takeWork() {
	c.mu.Lock()
	// The staged buffer follows everything in out (enqueue flushes it before appending),
	// so it goes too: the Writes of a handler's round leave in one send with what was
	// queued before them.
	c.flushStageLocked(false)
	if len(c.out) == 0 {
		if c.pendLen() == 0 && !c.q.be.sending(c) {
			c.kicked = false
		}
		c.mu.Unlock()
		return
	}
	k := c.takeCut()
	if len(c.tx.pend) == 0 {
		c.tx.pend = c.tx.pendBuf[:0]
	}
	c.tx.pend = append(c.tx.pend, c.out[:k]...)
	if len(c.tx.pend) == k && cap(c.tx.pend) <= pendKeep {
		c.tx.pendBuf = c.tx.pend // it starts at its array's first element
	}
	rest := copy(c.out, c.out[k:])
	clear(c.out[rest:])
	c.out = c.out[:rest]
	c.mu.Unlock()
}

// takeCut returns how many of c.out's segments takeWork moves (mu held): all of them, except
// that a SendFile segment goes alone (its fileMover moves it, a backend's send never sees it):
// the segments before it go first, and those after it wait until it is sent.
func (c *Conn) takeCut() int {
	if c.pendLen() > 0 && c.tx.pend[0].kind == segFile {
		return 0
	}
	for i := range c.out {
		if c.out[i].kind == segFile {
			if i == 0 && c.pendLen() == 0 {
				return 1
			}
			return i
		}
	}
	return len(c.out)
}

// pump hands pending segments to the backend.
func (c *Conn) pump() {
	if c.st.SockClosed() || !c.opened() || c.connect != nil {
		return
	}
	if c.tls != nil && !c.q.be.sending(c) && !c.tls.rekey(c) {
		return // a KeyUpdate waits for room: it goes first
	}
	c.takeWork()
	if c.pendLen() > 0 {
		if s := &c.tx.pend[0]; s.kind == segFile {
			s.own.(fileMover).sendHead(c)
		} else {
			c.q.be.send(c)
		}
	}
	if c.pendLen() == 0 && !c.q.be.sending(c) {
		c.maybeShutdownWrite()
	}
}

// pendLen / zwaitLen: segments not yet sent, zero-copy sends not yet notified (0 for a
// connection that never sent).
func (c *Conn) pendLen() int {
	t := c.txp.Load()
	if t == nil {
		return 0
	}
	return len(t.pend)
}

func (c *Conn) zwaitLen() int {
	t := c.txp.Load()
	if t == nil {
		return 0
	}
	return len(t.zwait)
}

// popPend removes the head segment.
func (c *Conn) popPend() seg {
	s := c.tx.pend[0]
	c.tx.pend[0] = seg{}
	c.tx.pend = c.tx.pend[1:]
	if c.pendLen() == 0 {
		c.tx.pend = c.tx.pendBuf[:0] // every element was cleared when popped
	}
	return s
}

// pendKeep is the largest pend array a connection keeps for its next sends once pend is
// empty (at 80 bytes a segment, at most 320 bytes an idle connection that once sent keeps);
// a larger one (a burst of many segments) goes to the collector.
const pendKeep = 4

// advance accounts res bytes a copying send took from the head of c.tx.pend: fully sent
// segments go back to their pools.
func (c *Conn) advance(res int) {
	left := res
	for left > 0 && c.pendLen() > 0 {
		s := &c.tx.pend[0]
		k := min(left, int(s.n-s.off))
		s.off += int32(k)
		left -= k
		if s.off == s.n {
			c.finishSeg(c.popPend())
		}
	}
	c.tx.sentCopy.Add(uint64(res))
	c.q.ctr.sentCopy.Add(uint64(res))
	c.sentBytes(res)
}

// finishSeg returns a sent (or abandoned) segment's buffer.
func (c *Conn) finishSeg(s seg) {
	if s.kind == segFile {
		s.own.segDone(c, s, true)
		return
	}
	if s.sum != 0 && c.e.dbg != nil {
		c.e.dbg.sent(c, s)
	}
	if s.kind != segLoan {
		// a zcrx hold: the last reference returns the buffer and the credit; SendBytes'
		// memory: unpinned, and the application hears of it
		s.own.segDone(c, s, true)
		return
	}
	size := int64(s.loan.Region().BufSize())
	s.loan.Return() // a send buffer's return reaches waiters through the pool's OnFree
	if s.src != nil && !s.shared {
		s.src.releaseHeld(size)
	}
}

// rehomePend moves the first k bytes of pending segment i into loan, for a backend that
// sends only from its own registered memory and copied them there (loop only): the whole
// segment when k covers it (its old buffer is finished now), else a new segment inserted
// before the rest (the backend's buffers are smaller). It returns the segment to send.
func (c *Conn) rehomePend(i int, loan memreg.Loan, k int32) *seg {
	s := &c.tx.pend[i]
	if k == s.n-s.off {
		old := *s
		old.off += k // all of it is in loan now: finished, not dropped
		*s = loanSeg(loan, 0, k)
		c.finishSeg(old)
		return s
	}
	s.off += k
	c.tx.pend = slices.Insert(c.tx.pend, i, loanSeg(loan, 0, k))
	return &c.tx.pend[i]
}

// sentBytes accounts n bytes that left the queue (sent or dropped) and wakes whoever waits
// for room.
func (c *Conn) sentBytes(n int) {
	if n <= 0 {
		return
	}
	if c.tls != nil {
		c.tls.tlsSent(n)
	}
	if cl := c.cl; cl != nil && c.closeErr == nil && !c.e.closed.Load() {
		// A graceful close made progress: the peer reads, however slowly. CloseTimeout
		// counts from here (Engine.Close keeps its bound: no progress moves it then).
		cl.progressAt = time.Now()
		cl.deadline = cl.progressAt.Add(c.e.cfg.CloseTimeout)
	}
	c.mu.Lock()
	c.queued -= n
	var waiters []*Conn
	if tx := c.tx; tx != nil && len(tx.destWaits) > 0 && c.queued <= c.e.cfg.MaxQueuedBytes/2 {
		waiters = tx.destWaits
		tx.destWaits = nil
	}
	ch := c.spaceCh
	c.mu.Unlock()
	if ch != nil {
		select {
		case ch <- struct{}{}:
			c.q.YieldSoon() // a blocked writer may be waiting for it (loop only)
		default:
		}
	}
	for _, s := range waiters {
		s.resumeFromDest()
	}
}

// sendProgress runs after sends completed: more work, the half-close, OnWritable.
func (c *Conn) sendProgress() {
	if c.ended() {
		c.lateSendDone()
		return
	}
	c.pump()
	if c.inClose() {
		c.advanceClose()
		return
	}
	c.writable()
}

// lateSendDone: a send that was still in the kernel when its connection finished completed
// (sendProgress of a finished connection). Once the backend has no send of it left, what
// they did not take is dropped and the buffers go back.
func (c *Conn) lateSendDone() {
	if _, ok := c.q.lateSends[c]; !ok || c.q.be.sending(c) {
		return
	}
	delete(c.q.lateSends, c)
	c.dropPend()
}

// dropPend drops every pending segment (counted as dropped) and returns its buffer.
func (c *Conn) dropPend() {
	for c.pendLen() > 0 {
		s := c.popPend()
		c.sentBytes(int(s.n - s.off))
		c.droppedSeg(s)
		c.finishSeg(s)
	}
}

// writable calls OnWritable when the handler has it and less than half of MaxQueuedBytes is
// queued.
func (c *Conn) writable() {
	w, ok := c.h.(Writable)
	if !ok || c.inClose() || c.ended() {
		return
	}
	c.mu.Lock()
	low := c.queued < c.e.cfg.MaxQueuedBytes/2 && c.werr == nil
	c.mu.Unlock()
	if low {
		c.callWritable(w)
	}
}

// ---- zero-copy bookkeeping -------------------------------------------------------------

// zcStart records a zero-copy send of the head segment, submitted as operation ud.
func (c *Conn) zcStart(ud uint64) {
	c.tx.zwait = append(c.tx.zwait, zcWait{ud: ud})
}

func (c *Conn) zcFind(ud uint64) int {
	for i := range c.tx.zwait {
		if c.tx.zwait[i].ud == ud {
			return i
		}
	}
	return -1
}

// zcCompleted: the zero-copy send ud completed with res, taking the head segment; notif says
// whether its notification is still to come.
// keep: the send gave up before taking anything (EAGAIN): the segment stays queued.
func (c *Conn) zcCompleted(ud uint64, res int, notif, keep bool) {
	i := c.zcFind(ud)
	if i < 0 {
		return
	}
	w := &c.tx.zwait[i]
	short, left := false, 0
	if c.pendLen() > 0 && !keep {
		w.s = c.popPend()
		left = int(w.s.n - w.s.off)
		short = res >= 0 && res < left
		w.s.off += int32(min(max(res, 0), left)) // what the kernel took; the rest was dropped
		c.sentBytes(left)
		switch {
		case short:
			c.dropped(left - res)
		case res < 0:
			c.dropped(left) // failed or cancelled: none of it went out
		}
	}
	if res > 0 {
		w.sent = res
	}
	w.done = true
	switch {
	case res < 0 && res != -int(unix.ECANCELED) && !keep:
		// The send failed: the connection ends with the error. Say so before the entry
		// retires: retiring it may finish a closing connection, which would then report a
		// clean close (OnClose nil) with these bytes lost.
		c.fail(c.opErr("write", unix.Errno(-res)))
	case short:
		// A zero-copy send (MSG_WAITALL) comes back short only when the connection failed
		// after taking part of it (io_uring reports the part, not the error): the rest of the
		// segment is lost, and so is the connection. Nothing else may follow to say so (a
		// closing connection whose last send this was would report a clean close).
		c.fail(c.opErr("write", fmt.Errorf("zero-copy send cut short (%d of %d bytes): %w", res, left, c.shortCause(io.ErrShortWrite))))
	}
	switch {
	case w.early:
		c.zcFinish(i, w.copied) // the notification already came
	case notif:
		w.notif = true
		c.notifsOut.Add(1)
		c.q.notifsPending.Add(1)
	default:
		// No notification will come: the pages were never queued (a failed send).
		c.tx.zc.abandoned()
		c.zcFinish(i, false)
	}
}

// shortCause says why a send came back short without an error (io_uring reports the part a
// MSG_WAITALL send took and swallows the error that stopped it, having consumed the
// socket's pending error): a socket the kernel already closed (TCP_CLOSE, and we did not
// close it) was reset by its peer; otherwise def.
func (c *Conn) shortCause(def error) error {
	if c.st.SockClosed() {
		return def
	}
	// One line ("short write: connection reset by peer"), matching both; errors.Join
	// would put a newline in the middle of the connection's error.
	if e := unix.Errno(0); errors.As(c.sock.SocketError(), &e) {
		return fmt.Errorf("%w: %w", def, e)
	}
	if ti, err := c.sock.TCPInfo(); err == nil && ti.State == tcpglue.StateClose {
		return fmt.Errorf("%w: %w", def, unix.ECONNRESET)
	}
	return def
}

// zcNotified: the notification of zero-copy send ud arrived (copied: the kernel copied the
// pages anyway).
func (c *Conn) zcNotified(ud uint64, copied bool) {
	i := c.zcFind(ud)
	if i < 0 {
		c.q.ctr.notifsUnexpected.Add(1)
		return
	}
	w := &c.tx.zwait[i]
	if !w.done {
		// Before the completion (not seen on Linux, but harmless): remember it.
		w.early, w.copied, w.notif = true, copied, true
		c.notifsOut.Add(1)
		c.q.notifsPending.Add(1)
		return
	}
	c.zcFinish(i, copied)
}

// zcFinish retires entry i: its buffer goes back and the adaptive policy hears the verdict.
func (c *Conn) zcFinish(i int, copied bool) {
	w := c.tx.zwait[i]
	last := c.zwaitLen() - 1
	c.tx.zwait[i] = c.tx.zwait[last]
	c.tx.zwait[last] = zcWait{}
	c.tx.zwait = c.tx.zwait[:last]
	if c.zwaitLen() == 0 {
		c.tx.zwait = c.tx.zwait[:0:0]
	}
	if w.notif {
		c.notifsOut.Add(-1)
		c.q.notifsPending.Add(-1)
		if copied {
			c.tx.zcCopied.Add(uint64(w.sent))
			c.q.ctr.zcCopied.Add(uint64(w.sent))
		} else {
			c.tx.sentZC.Add(uint64(w.sent))
			c.q.ctr.sentZC.Add(uint64(w.sent))
		}
		if c.tx.zc.notified(copied) {
			c.q.ctr.zcSwitches.Add(1)
		}
	}
	c.q.be.freeOp(c, w.ud)
	if w.s.holdsMem() {
		c.finishSeg(w.s)
	}
	if c.ended() {
		if c.zwaitLen() == 0 {
			delete(c.q.lateNotifs, c)
		}
		return
	}
	if c.inClose() {
		c.advanceClose()
		return
	}
	// A buffer came back: a Writable sender that ran out of buffers hears about it here.
	if !c.q.be.sending(c) {
		c.writable()
	}
}

// ---- receiving -------------------------------------------------------------------------

// deliver hands a received buffer to the handler, charging it to the receive credit.
func (c *Conn) deliver(d Data) {
	c.ctr.recv.Add(uint64(d.n))
	if c.inClose() || c.ended() {
		d.c = nil
		d.Release()
		return
	}
	d.c = c
	c.held.Add(d.credit())
	if c.e.dbg != nil {
		c.e.dbg.delivered(c, d)
	}
	if c.paused&pauseUser != 0 || c.parked != nil {
		// A receive already in flight when SetReceivePaused(true) took effect (its cancel
		// had not landed): no OnData while paused, as documented; it waits for the resume
		// (and keeps its receive credit meanwhile).
		c.park().data = append(c.park().data, d)
		return
	}
	c.callData(d)
}

// parkedRecv holds what a receive in flight delivered after SetReceivePaused(true): Data
// and the peer's EOF, handed to the handler in order at the resume (unparkRecv).
type parkedRecv struct {
	data   []Data
	eof    bool
	posted bool // an unparkRecv is posted
}

func (c *Conn) park() *parkedRecv {
	if c.parked == nil {
		c.parked = &parkedRecv{}
	}
	return c.parked
}

// unparkRecv delivers what was parked while the user paused receiving, in order, as long as
// the handler does not pause again (loop only).
func (c *Conn) unparkRecv() {
	p := c.parked
	if p != nil {
		p.posted = false
	}
	for p != nil && c.paused&pauseUser == 0 && !c.inClose() && !c.ended() {
		if len(p.data) > 0 {
			d := p.data[0]
			p.data[0] = Data{}
			p.data = p.data[1:]
			c.callData(d)
			continue
		}
		c.parked = nil
		if p.eof {
			c.callEOF(io.EOF)
		}
		return
	}
}

// dropParked releases what is still parked (the connection finished).
func (c *Conn) dropParked() {
	if p := c.parked; p != nil {
		c.parked = nil
		for _, d := range p.data {
			d.Release()
		}
	}
}

// credit is how many receive-buffer bytes this connection may hold now: MaxRecvHeld, but
// never more than its share of half the queue's receive pool (RecvPoolMax / (2 × the
// queue's connections)), at least two buffers (MaxRecvHeld permitting). So however many
// connections hold their credit — a relay whose data waits in other connections' send
// queues, handlers that keep what they get — half the pool stays free for the others, and
// the connections that would drain the held data can always receive: the pool cannot be held
// up entirely (with more connections than that share allows, the floor may take more than
// half; the pool's cap still holds). The floor is two buffers, not one, because a connection
// is paused once it holds its credit: at one buffer, an echo that sends each received Data
// back (SendData holds the buffer until the send completes) paused and resumed receiving on
// every request, a cancelled and a re-armed receive each time (TestEchoHoldsNoCreditPause).
func (c *Conn) credit() int64 {
	cfg := &c.e.cfg
	cr := int64(cfg.MaxRecvHeld)
	if n := c.q.nconns.Load(); n > 0 {
		if share := int64(cfg.RecvPoolMax) / (2 * n); share < cr {
			cr = max(share, min(2*int64(cfg.RecvBufSize), cr))
		}
	}
	return cr
}

// checkCredit pauses receiving while the connection holds its credit or more.
func (c *Conn) checkCredit() {
	cr := c.credit()
	if c.paused&pauseCredit == 0 && c.held.Load() >= cr {
		c.q.ctr.creditPauses.Add(1)
		c.pause(pauseCredit)
		// A release may have come in between: look again on the loop.
		if c.held.Load() < cr {
			c.postResume()
		}
	}
}

// releaseHeld returns receive credit (any goroutine).
func (c *Conn) releaseHeld(n int64) {
	v := c.held.Add(-n)
	if v < c.credit()/2 || v <= 0 {
		c.postResume()
	}
}

func (c *Conn) postResume() {
	if !c.creditPaused() {
		return
	}
	if c.resumeReq.CompareAndSwap(false, true) {
		if c.q.Post(c.resumeCredit) != nil {
			c.resumeReq.Store(false)
		}
	}
}

func (c *Conn) creditPaused() bool { return c.pausedAt.Load()&pauseCredit != 0 }

func (c *Conn) resumeCredit() {
	c.resumeReq.Store(false)
	if c.paused&pauseCredit != 0 && c.held.Load() < c.credit() {
		c.unpause(pauseCredit)
	}
}

// pauseForDest stops receiving because a SendData destination is over its bound (any
// goroutine); resumeFromDest undoes one such pause.
func (c *Conn) pauseForDest() {
	f := func() {
		c.destPauses++
		c.pause(pauseDest)
	}
	if c.q.OnLoop() {
		f()
	} else if c.q.Post(f) != nil {
		return
	}
}

func (c *Conn) resumeFromDest() {
	f := func() {
		if c.destPauses > 0 {
			c.destPauses--
		}
		if c.destPauses == 0 {
			c.unpause(pauseDest)
		}
	}
	if c.q.OnLoop() {
		f()
	} else {
		c.q.Post(f)
	}
}

func (c *Conn) pause(reason int32) {
	if c.paused&reason != 0 {
		return
	}
	c.paused |= reason
	c.pausedAt.Store(c.paused)
	if c.recvArmed {
		c.q.be.stopRecv(c)
	}
}

func (c *Conn) unpause(reason int32) {
	if c.paused&reason == 0 {
		return
	}
	c.paused &^= reason
	c.pausedAt.Store(c.paused)
	if reason == pauseUser && c.parked != nil && !c.parked.posted {
		// Later on the loop, not inside SetReceivePaused: its caller may hold a lock its own
		// OnData takes. Receives meanwhile go behind what is parked (deliver).
		c.parked.posted = true
		c.q.Post(c.unparkRecv)
	}
	if c.paused == 0 {
		c.armRecv()
	}
}

// armRecv (re)starts receiving unless something says not to.
func (c *Conn) armRecv() {
	if c.recvArmed || c.eof || c.inClose() || c.ended() || c.st.SockClosed() || c.paused != 0 || !c.opened() || c.connect != nil {
		return
	}
	c.q.be.armRecv(c)
}

// gotEOF: the peer closed its side (err nil) or receiving failed.
func (c *Conn) gotEOF(err error) {
	if c.eof {
		return
	}
	if c.tls != nil {
		var resume bool
		if resume, err = c.tls.recvEnd(c, err); resume {
			c.armRecv() // a control record was handled: receiving goes on
			return
		}
	}
	c.eof = true
	if err == nil {
		if c.paused&pauseUser != 0 || c.parked != nil {
			c.park().eof = true // after the parked Data, at the resume
			return
		}
		if !c.inClose() {
			c.callEOF(io.EOF)
		}
		return
	}
	rerr := c.opErr("read", err)
	if !c.inClose() {
		c.callEOF(rerr)
	}
	c.fail(rerr)
}

// ---- half-close --------------------------------------------------------------------------

func (c *Conn) maybeShutdownWrite() {
	if c.st.Socket() != connstate.SockOpen || c.reqs.Load()&reqShut == 0 {
		return
	}
	c.mu.Lock()
	want := c.shutReq && len(c.out) == 0 && !c.staged()
	c.mu.Unlock()
	if want && c.pendLen() == 0 && !c.q.be.sending(c) {
		if c.tls != nil {
			c.tls.closeNotify(c)
		}
		c.st.ShutWrite()
		c.sock.Shutdown(unix.SHUT_WR)
	}
}

// ---- closing ---------------------------------------------------------------------------

// fail closes the connection because of err (a send or receive error, a handler panic).
func (c *Conn) fail(err error) { c.beginClose(err) }

// beginClose starts closing: err == nil is a graceful Close (queued sends go out first,
// bounded by CloseTimeout); an error aborts (queued sends are dropped, the peer gets a RST).
func (c *Conn) beginClose(err error) {
	if c.ended() {
		return
	}
	if c.inClose() {
		if err != nil && c.closeErr == nil {
			// An error while closing gracefully: stop waiting for the sends.
			c.closeErr = err
			c.abortSends()
			c.advanceClose()
		}
		return
	}
	c.st.BeginClose()
	c.closeErr = err
	c.cl = &closeState{}
	c.mu.Lock()
	c.requestCloseLocked()
	work := c.queued > 0
	if c.werr == nil || c.werr == errWriteClosed || (err != nil && c.werr == ErrClosed) {
		c.werr = ErrClosed
		if err != nil {
			c.werr = err
		}
	}
	c.mu.Unlock()
	c.cl.progressAt = time.Now()
	c.cl.deadline = c.cl.progressAt.Add(c.e.cfg.CloseTimeout)
	c.cl.timer = c.q.After(c.e.cfg.CloseTimeout, c.closeTimer)
	if err == nil && (work || c.q.be.sending(c)) {
		// What the peer acknowledged so far: progress from here on keeps the close
		// waiting while a send stays in the kernel (peerAnswers).
		if ti, err := c.sock.TCPInfo(); err == nil {
			c.cl.acked = ti.BytesAcked
		}
	}
	if c.recvArmed {
		c.q.be.stopRecv(c)
	}
	if err != nil {
		c.abortSends()
	} else if h, ok := c.h.(closeHolder); ok {
		c.mu.Lock()
		c.holdClose = true
		c.mu.Unlock()
		h.closing(c)
	}
	c.pump()
	c.advanceClose()
}

// closeHolder is a handler that holds bytes for its connection outside the send queue (a
// splice relay's pipe: splice_relay.go). A graceful close tells it (closing, on the
// connection's queue) and waits, as for queued sends and bounded by CloseTimeout, until it
// queued them (enqueueHeld) or said it has none (releaseHold).
type closeHolder interface {
	closing(c *Conn)
}

func (c *Conn) closeTimer() {
	c.cl.timer = nil
	c.advanceClose()
	if !c.ended() && c.cl.timer == nil {
		// Still waiting: for queued sends until the deadline (progress may have moved it),
		// then (operations, zero-copy notifications) look again until the second deadline.
		d := time.Until(c.cl.deadline)
		if d <= 0 {
			d = min(c.e.cfg.CloseTimeout, 100*time.Millisecond)
		}
		c.cl.timer = c.q.After(d, c.closeTimer)
	}
}

// peerAnswers reports whether the peer of a graceful close whose deadline passed with no
// send completing is still alive, and if so the next deadline. Alive is what TCP_INFO shows
// of the peer answering, however slowly it reads: it acknowledged bytes since beginClose
// or the last look (bytes_acked: an io_uring send of many buffers completes only once the
// kernel took all of them, which into a small socket buffer drained by a slow reader can
// take longer than CloseTimeout), or an acknowledgement arrived within CloseTimeout
// (last_ack_recv: window updates, and the zero-window acknowledgements that answer the
// kernel's window probes while the reader has not yet freed a segment's worth), or the
// kernel has not asked the peer twice in a row without an answer (window probes or
// retransmissions). A silent peer is one the kernel asked at least twice and that answered
// nothing for CloseTimeout (two probes or retransmissions outstanding and the last
// acknowledgement CloseTimeout old): its close gives up. A peer that stops reading but
// whose kernel answers the probes is not silent: its close waits, up to CloseStall since a
// byte last left or was acknowledged (then it is stalled: a client that never reads must
// not hold the send pool; Engine.Close and CloseContext bound it too). Never alive once the
// engine closes (its bound is absolute),
// nor when the socket cannot say (TCP_INFO fails) or has no peer to answer (a state other
// than ESTABLISHED or CLOSE_WAIT: not connected, or reset).
func (c *Conn) peerAnswers(now time.Time) (time.Time, bool) {
	if c.e.closed.Load() {
		return time.Time{}, false
	}
	ti, err := c.sock.TCPInfo()
	if err != nil || (ti.State != tcpglue.StateEstablished && ti.State != tcpglue.StateCloseWait) {
		return time.Time{}, false // no peer that could answer (not connected, or reset)
	}
	ct := c.e.cfg.CloseTimeout
	if ti.BytesAcked > c.cl.acked {
		c.cl.acked = ti.BytesAcked
		c.cl.progressAt = now
		return now.Add(ct), true
	}
	stallAt := c.cl.progressAt.Add(c.e.cfg.CloseStall)
	if !now.Before(stallAt) {
		c.cl.stalled = true // it answers, but has taken nothing for CloseStall
		return time.Time{}, false
	}
	switch {
	case ti.LastAckRecv < ct:
		// Look again CloseTimeout after that acknowledgement (or when it stalls).
		return minTime(now.Add(max(ct-ti.LastAckRecv, time.Millisecond)), stallAt), true
	case ti.Probes < 2 && ti.Retransmits < 2:
		// Not two probes or retransmissions in a row unanswered: the kernel's last probe
		// was answered and it waits out its backoff (up to two minutes), or it has not
		// probed yet, or one probe went unanswered because the peer's kernel rate-limits
		// its answers to segments outside the window (net.ipv4.tcp_invalid_ratelimit,
		// 500 ms: the second probe comes 400 ms after the first). The next, twice as far
		// apart, is answered by a peer that is there.
		return minTime(now.Add(ct), stallAt), true
	}
	return time.Time{}, false
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// kernelHeld records, at the reset of a close that gave up, what the kernel still held of
// the connection's bytes (SIOCOUTQ: taken from the queue and not acknowledged by the peer):
// the reset discards them, so CloseTimeoutError.Unsent counts them with the queued bytes
// dropped. (ConnStats.BytesDropped does not: it counts bytes never handed to the kernel.)
func (c *Conn) kernelHeld() {
	if c.st.SockClosed() {
		return
	}
	if n, err := c.sock.OutQueue(); err == nil && n > 0 {
		c.cl.kernelHeld = n
	}
}

// closeTimedOut marks a graceful close that waited CloseTimeout in vain: it ends with a
// *CloseTimeoutError (closeTimeoutErr, at finish) instead of a clean close. What the reset
// drops is known only then (sends in flight may still complete in part), so the close error
// is a marker until finish; it also keeps a later error (the reset's own, on a send in
// flight) from replacing the cause.
func (c *Conn) closeTimedOut() {
	c.q.ctr.closeTimeouts.Add(1)
	c.closeErr = errCloseTimedOut
	c.cl.droppedBefore = c.droppedBytes()
}

// closeTimeoutErr makes the *CloseTimeoutError of a close that timed out (at finish, after
// everything it dropped was counted): OnClose's error, and what later sends return.
func (c *Conn) closeTimeoutErr() error {
	timeout := c.e.cfg.CloseTimeout
	if c.cl.stalled {
		timeout = c.e.cfg.CloseStall
	}
	te := &CloseTimeoutError{Timeout: timeout, Unsent: int(c.droppedBytes()-c.cl.droppedBefore) + c.cl.kernelHeld}
	c.mu.Lock()
	if c.werr == nil || c.werr == ErrClosed || c.werr == errWriteClosed {
		c.werr = te
	}
	c.mu.Unlock()
	return c.opErr("close", te)
}

// dropped counts n bytes accepted for sending and abandoned unsent (an abort, a reset,
// CloseTimeout, Engine.Close): ConnStats.BytesDropped, and a relay's losses (relay.go).
func (c *Conn) dropped(n int) {
	if n > 0 {
		c.tx.dropped.Add(uint64(n))
	}
}

// droppedSeg counts what dropping s loses, except a splice relay's pipe: its relay counts
// that itself (pipeSeg.release), and reads the rest from droppedBytes.
func (c *Conn) droppedSeg(s seg) {
	if s.kind != segFile || !s.own.(fileMover).countsDrops() {
		c.dropped(int(s.n - s.off))
	}
}

// droppedBytes is ConnStats.BytesDropped (any goroutine).
func (c *Conn) droppedBytes() uint64 {
	if t := c.txp.Load(); t != nil {
		return t.dropped.Load()
	}
	return 0
}

// abortSends drops every send not yet in the kernel and makes the close reset the
// connection, so the stack frees its write queue (and the zero-copy pages) at once.
func (c *Conn) abortSends() {
	// Segments in flight stay until their completion; the rest go now.
	keep := c.q.be.inFlightSegs(c)
	for c.pendLen() > keep {
		i := c.pendLen() - 1
		s := c.tx.pend[i]
		c.tx.pend[i] = seg{}
		c.tx.pend = c.tx.pend[:i]
		c.sentBytes(int(s.n - s.off))
		c.droppedSeg(s)
		c.finishSeg(s)
	}
	c.dropProducer()
	if !c.st.SockClosed() {
		c.sock.SetLinger(0)
	}
	c.q.be.cancelSend(c) // a send waiting for room ends now: the socket can go, with its RST
}

// dropProducer abandons what Send/Write queued and the loop has not taken yet.
func (c *Conn) dropProducer() {
	c.mu.Lock()
	out := c.out
	c.out = nil
	c.holdClose = false // what a closeHolder queues from now on is dropped (enqueueHeld)
	n, staged := 0, 0
	if c.staged() {
		staged = c.tx.stageN - c.tx.stageOff
		c.tx.releaseStage()
	}
	n += staged
	for _, s := range out {
		n += int(s.n - s.off)
	}
	c.mu.Unlock()
	c.sentBytes(n)
	if staged > 0 {
		c.dropped(staged) // Write's bytes not yet in a segment
	}
	for _, s := range out {
		c.droppedSeg(s)
		c.finishSeg(s)
	}
}

// dropSeg gives back a segment that was never queued (the call that made it fails): a
// SendBytes segment goes back to the caller without its callback.
func (c *Conn) dropSeg(s seg) {
	if s.kind == segApp {
		s.own.segDone(c, s, false)
		return
	}
	c.finishSeg(s)
}

// advanceClose moves a closing connection on.
func (c *Conn) advanceClose() {
	if !c.inClose() || c.ended() {
		return
	}
	now := time.Now()
	if !c.st.SockClosed() {
		c.mu.Lock()
		producer := len(c.out) > 0 || c.staged() || c.holdClose
		c.mu.Unlock()
		sending := c.pendLen() > 0 || c.q.be.sending(c) || producer
		if sending && c.closeErr == nil {
			if now.Before(c.cl.deadline) {
				return // the sends' completions come back here
			}
			if next, ok := c.peerAnswers(now); ok {
				// No send completed, yet the peer answers: it reads, however slowly (a
				// send in the kernel is taking the bytes, or its window is closed and it
				// answers the kernel's probes). CloseTimeout bounds silence, not the wait.
				c.cl.deadline = next
				return
			}
			// CloseTimeout passed with no byte leaving and the peer silent (or the engine's
			// close bound passed). Reset, and say so: what is still queued never reaches
			// the peer, nor what the kernel holds unacknowledged.
			c.closeTimedOut()
		}
		if sending {
			c.abortSends()
		}
		if c.closeErr == errCloseTimedOut {
			c.kernelHeld()
		}
		if c.recvArmed {
			c.q.be.stopRecv(c)
		}
		if c.closeErr == nil && c.tls != nil {
			c.tls.closeNotify(c)
		}
		c.q.be.closeSocket(c)
		c.socketClosed()
	}
	if c.ops > 0 && now.Before(c.cl.deadline.Add(c.e.cfg.CloseTimeout)) {
		return // operations in the kernel: their completions come back here
	}
	if c.zwaitLen() > 0 && now.Before(c.cl.deadline.Add(c.e.cfg.CloseTimeout)) {
		return // notifications outstanding
	}
	c.finish()
}

// finish completes the close: OnClose, Done. Zero-copy sends whose notification never came
// keep their operations registered, so a late notification still returns the buffer; the
// buffers stay lent until then.
func (c *Conn) finish() {
	if c.ended() {
		return
	}
	c.st.Finish()
	if c.cl != nil && c.cl.timer != nil {
		c.cl.timer.Stop()
		c.cl.timer = nil
	}
	if !c.st.SockClosed() {
		c.q.be.closeSocket(c)
		c.socketClosed()
	}
	// A send still in the kernel (finishing at the second close deadline: its cancel did not
	// end it) may still read its segments: they stay until its completion (lateSendDone),
	// whose part not taken is dropped then. The rest is dropped now.
	keep := 0
	if !c.q.stopping {
		keep = min(c.q.be.inFlightSegs(c), c.pendLen())
	}
	for c.pendLen() > keep {
		i := c.pendLen() - 1
		s := c.tx.pend[i]
		c.tx.pend[i] = seg{}
		c.tx.pend = c.tx.pend[:i]
		c.sentBytes(int(s.n - s.off))
		c.droppedSeg(s)
		c.finishSeg(s)
	}
	if keep > 0 {
		if c.q.lateSends == nil {
			c.q.lateSends = make(map[*Conn]struct{})
		}
		c.q.lateSends[c] = struct{}{}
	}
	c.dropProducer()
	if c.zwaitLen() > 0 {
		if c.q.lateNotifs == nil {
			c.q.lateNotifs = make(map[*Conn]struct{})
		}
		c.q.lateNotifs[c] = struct{}{}
	}
	c.dropParked()
	if c.rx != nil {
		c.rx.finish()
	}
	if c.tls != nil {
		c.tls.finished(c)
	}
	if c.steer != nil {
		c.steer.Forget(bpf.FlowKey{Remote: c.raddr, Local: c.laddr}) // no stale flow entries after churn
	}
	var waiters []*Conn
	c.mu.Lock()
	if tx := c.tx; tx != nil {
		waiters = tx.destWaits
		tx.destWaits = nil
	}
	c.mu.Unlock()
	for _, s := range waiters {
		s.resumeFromDest()
	}
	if c.closeErr == errCloseTimedOut {
		c.closeErr = c.closeTimeoutErr()
	}
	if c.self != nil {
		c.self.finished(c.closeErr)
	}
	c.q.forgetConn(c) // OnClose is its last event: no OnWritable owed
	c.q.endHolds(c)   // its AfterFunc timers
	c.q.removeConn(c)
	c.callClose(c.closeErr)
	c.markDone()
}
