package zc

import (
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/rawfd"
	"github.com/zcnet/zcnet/zc/internal/connstate"
)

// The relay's splice path (RelaySplice). Both directions run on the relay's home queue (a's):
//
//  1. Each connection gets the relay's handler and is paused on its own queue; once its
//     receive is no longer armed (a cancelled multishot receive still completes), its queue
//     tells the home queue. Bytes received before that (OnData) go to the other side with
//     SendData, and an EOF received before that is passed on as the SendData relay does.
//  2. The home queue duplicates both descriptors (so no system call of the relay can ever
//     reach a descriptor number that was closed and reused, whichever queue closes the
//     connection) and takes a pipe per direction. A direction starts once its destination
//     sent what SendData queued for it (the destination's OnWritable is the waker).
//  3. pump: pipe → destination until the pipe is empty; when the destination is full, wait
//     for it to be writable, without reading the source (the pipe is the flow control);
//     then source → pipe; when the source is empty, wait for it to be readable. The
//     source's EOF, once the pipe is drained, half-closes the destination (CloseWrite).
//  4. When both directions ended both connections close. When a connection begins a graceful
//     close (closing), fails (a system call on it failed: a reset) or closed (OnClose), the
//     relay stops (end): waits cancelled, duplicates closed, empty pipes back to the queue's
//     pool. A pipe that still holds bytes is handed to its destination's send queue
//     (handOver: the core splices them out like a SendFile range), so that a graceful close
//     of either side lets out what the relay took from the other, as the SendData relay's
//     queued bytes go out; the other connection is closed after that. Bytes whose
//     destination failed, was reset or gave up (CloseTimeout) are counted in
//     RelayStats.Lost, and Err says so.

type spliceRelay struct {
	st    *RelayStats
	home  *queue
	conns [2]*Conn
	sides [2]*spliceSide
	dirs  [2]*spliceDir // 0: a → b, 1: b → a
	psize int
	// home queue only
	quiet   [2]bool
	started bool
	stopped bool
}

type spliceDir struct {
	r        *spliceRelay
	i        int // the source's index in r.conns (the destination's is 1-i)
	src, dst *Conn
	sfd, dfd int // duplicates, owned by the relay
	in, out  fdWatch
	p        pipePair
	inPipe   int
	eof      bool // the source's EOF was seen
	done     bool // the EOF was passed on (or the relay stopped)
	flushed  bool // the destination sent what SendData queued before the splice
	posted   bool // a continuation is posted
	total    *atomic.Uint64
	spliced  *atomic.Uint64
}

// spliceSide is the handler of one connection of a splice relay.
type spliceSide struct {
	r      *spliceRelay
	i      int         // 0: a, 1: b
	preEOF atomic.Bool // EOF received (and passed on) before the splice took over
}

func startSpliceRelay(st *RelayStats, a, b *Conn, psize int) error {
	r := &spliceRelay{st: st, home: a.q, conns: [2]*Conn{a, b}, psize: psize}
	r.sides = [2]*spliceSide{{r: r, i: 0}, {r: r, i: 1}}
	r.dirs = [2]*spliceDir{
		{r: r, i: 0, src: a, dst: b, total: &st.AtoB, spliced: &st.SplicedAtoB, sfd: -1, dfd: -1},
		{r: r, i: 1, src: b, dst: a, total: &st.BtoA, spliced: &st.SplicedBtoA, sfd: -1, dfd: -1},
	}
	if err := a.setHandler(r.sides[0], connstate.ReadRelay); err != nil {
		b.Close()
		return err
	}
	if err := b.setHandler(r.sides[1], connstate.ReadRelay); err != nil {
		a.Close()
		return err
	}
	for i, c := range r.conns {
		if err := r.quiesce(c, i); err != nil {
			r.conns[1-i].Close()
			return c.opErr("relay", err)
		}
	}
	return nil
}

// onHome runs fn on the home queue (at once when already there). When the home queue has
// stopped, its AtStop cleanup has done (or will do) what fn would, and onHome reports false.
func (r *spliceRelay) onHome(fn func()) bool {
	if r.home.OnLoop() {
		fn()
		return true
	}
	return r.home.Post(fn) == nil
}

// quiesce pauses c's receiving on its queue and reports to the home queue once no receive
// is armed any more.
func (r *spliceRelay) quiesce(c *Conn, i int) error {
	f := func() { r.checkQuiet(c, i) }
	if c.q.OnLoop() {
		if c.ended() || c.inClose() {
			return ErrClosed
		}
		f()
		return nil
	}
	if c.isClosing() {
		return ErrClosed
	}
	if c.q.Post(f) != nil {
		return ErrClosed
	}
	return nil
}

// checkQuiet runs on c's queue.
func (r *spliceRelay) checkQuiet(c *Conn, i int) {
	if c.ended() || c.inClose() {
		return // its OnClose stops the relay
	}
	c.pause(pauseSplice)
	// The user's pause (the accept function's, until the relay ran) is the relay's now:
	// what a receive in flight delivered while it held (parked) goes to the relay's handler
	// (SendData, before the splice starts), and receiving stays off under pauseSplice.
	c.unpause(pauseUser)
	c.unparkRecv() // now, before the splice can start: the parked bytes come first
	if !recvQuiet(c) {
		// A cancelled receive still completes (its data goes to OnData: SendData): look
		// again shortly.
		c.q.After(200*time.Microsecond, func() { r.checkQuiet(c, i) })
		return
	}
	r.onHome(func() { r.quietDone(i) })
}

func (r *spliceRelay) quietDone(i int) {
	r.quiet[i] = true
	if r.quiet[0] && r.quiet[1] && !r.started && !r.stopped {
		r.begin()
	}
}

// begin sets both directions up and starts them (home queue).
func (r *spliceRelay) begin() {
	r.started = true
	r.home.addRelay(r)
	for i, d := range r.dirs {
		var err error
		if d.sfd, err = dupSocket(d.src); err == nil {
			d.dfd, err = dupSocket(d.dst)
		}
		if err == nil {
			d.p, err = r.home.getPipe(r.psize)
		}
		if err != nil {
			r.fail(i, err)
			return
		}
		d.in = fdWatch{q: r.home, fd: d.sfd, owner: d, tag: tagSpliceIn}
		d.out = fdWatch{q: r.home, fd: d.dfd, owner: d, tag: tagSpliceOut}
		if r.sides[i].preEOF.Load() {
			d.eof, d.done = true, true // passed on by OnEOF already
		}
	}
	for _, d := range r.dirs {
		d.pump()
	}
}

// kick looks at both directions again (home queue).
func (r *spliceRelay) kick() {
	if !r.started || r.stopped {
		return
	}
	for _, d := range r.dirs {
		if !d.flushed {
			d.pump()
		}
	}
}

// pump moves what it can (home queue).
func (d *spliceDir) pump() {
	r := d.r
	if d.done || r.stopped || !r.started || d.posted || d.in.armed || d.out.armed {
		return
	}
	if !d.flushed {
		if d.dst.Queued() > 0 {
			return // the destination's OnWritable (kick) brings us back
		}
		d.flushed = true
	}
	budget := 8 * d.p.size
	moved := 0
	for {
		if d.inPipe > 0 {
			var n int
			var err error
			if d.dst.kernelTLS() {
				n, err = d.dst.tlsSpliceInto(d.p.r, d.dfd, d.inPipe) // after an owed TX key update
			} else {
				n, err = rawfd.Splice(d.p.r, d.dfd, d.inPipe)
			}
			r.home.ctr.relaySpliceCalls.Add(1)
			switch {
			case err == unix.EAGAIN:
				// The destination is full: wait until it takes more. The source is not read
				// meanwhile: the pipe's bytes are all that is in flight.
				r.home.ctr.relayWaits.Add(1)
				if err := d.out.arm(unix.POLLOUT); err != nil {
					r.fail(1-d.i, err)
				}
				return
			case err != nil:
				r.fail(1-d.i, err) // the destination failed (a reset)
				return
			}
			d.inPipe -= int(n)
			d.total.Add(uint64(n))
			d.spliced.Add(uint64(n))
			r.home.ctr.relaySpliced.Add(uint64(n))
			moved += int(n)
			continue
		}
		if d.eof {
			d.finish()
			return
		}
		if moved >= budget {
			// Let the queue serve others; go on right after.
			d.posted = true
			if r.home.Post(func() { d.posted = false; d.pump() }) != nil {
				d.posted = false
			}
			return
		}
		n, err := rawfd.Splice(d.sfd, d.p.w, d.p.size)
		r.home.ctr.relaySpliceCalls.Add(1)
		switch {
		case err == unix.EAGAIN:
			r.home.ctr.relayWaits.Add(1)
			if err := d.in.arm(unix.POLLIN | unix.POLLRDHUP); err != nil {
				r.fail(d.i, err)
			}
			return
		case err != nil && d.src.kernelTLS():
			// A control record at the head (kernel TLS): read and handled, then splicing
			// resumes; close_notify is the source's EOF.
			eof, cerr := d.src.tlsRelayControl(d.sfd, err)
			if cerr != nil {
				r.fail(d.i, cerr)
				return
			}
			d.eof = d.eof || eof
		case err != nil:
			r.fail(d.i, err) // the source failed (a reset)
			return
		case n == 0:
			d.eof = true
		default:
			d.inPipe += int(n)
		}
	}
}

// finish passes the source's EOF on (the pipe is empty): the destination half-closes.
func (d *spliceDir) finish() {
	d.done = true
	d.dst.CloseWrite()
	if d.r.st.ended.Add(1) == 2 {
		d.r.closeBoth()
	}
}

// OnEvent: a wait of the direction ended (home queue).
func (d *spliceDir) OnEvent(_ *loop.Queue, ev loop.Event) {
	w := &d.in
	if ev.Tag == tagSpliceOut {
		w = &d.out
	}
	if !w.fired(ev) || d.r.stopped {
		return
	}
	d.pump()
}

func (r *spliceRelay) closeBoth() {
	r.conns[0].Close()
	r.conns[1].Close()
}

// fail ends the relay because a system call on connection i failed (a reset, an error): what
// the relay holds for the other connection goes to it, then both close (home queue).
func (r *spliceRelay) fail(i int, err error) {
	r.home.ctr.relayErrors.Add(1)
	r.st.setErr(r.conns[i].opErr("relay", err))
	r.end(i, endFailed)
	r.conns[i].Close()
}

// How connection i ended the relay (end).
const (
	endClosing = iota // a graceful close began: it waits for what the relay holds for it
	endFailed         // a system call on it failed
	endGone           // it closed (OnClose)
)

// end stops the relay because connection i is closing, failed or closed (home queue): the
// pipe towards i goes to i's send queue when i is closing gracefully (its close waits for
// it) and is lost otherwise; the pipe from i goes to the other connection, which is then
// closed (gracefully: it sends that first).
func (r *spliceRelay) end(i int, how int) {
	c, other := r.conns[i], r.conns[1-i]
	if r.stopped || !r.started {
		r.stop()
		if how == endClosing {
			c.releaseHold()
		}
		other.Close()
		return
	}
	toI, fromI := r.dirs[1-i], r.dirs[i]
	if how == endClosing {
		if !toI.handOver(true) {
			c.releaseHold()
		}
	}
	fromI.handOver(false)
	r.stop()
	other.Close()
}

// handOver stops the direction and, when its pipe holds bytes, queues them on its
// destination (held: the destination's graceful close waits for them, enqueueHeld). It
// reports whether it queued a pipe (home queue).
func (d *spliceDir) handOver(held bool) bool {
	if d.done || d.inPipe == 0 {
		d.done = true
		return false
	}
	d.done = true
	ps := &pipeSeg{p: d.p, home: d.r.home, total: d.total, spliced: d.spliced, st: d.r.st}
	s := fileRangeSeg(&fileSeg{c: d.dst, pipe: ps}, int32(d.inPipe))
	d.p, d.inPipe = pipePair{}, 0
	if held {
		d.dst.enqueueHeld(s) // dropped (and counted lost) when the close no longer waits
	} else {
		d.dst.enqueue(s)
	}
	return true
}

// stop releases the relay's descriptors and pipes (home queue; idempotent). Bytes still in a
// pipe (not handed over) are lost.
func (r *spliceRelay) stop() {
	if r.stopped {
		return
	}
	r.stopped = true
	if r.home.splq().relays != nil {
		delete(r.home.splq().relays, r)
	}
	for _, d := range r.dirs {
		d.done = true
		if d.in.q != nil {
			d.in.stop()
			d.out.stop()
		}
		if d.sfd >= 0 {
			rawfd.Close(d.sfd)
			d.sfd = -1
		}
		if d.dfd >= 0 {
			rawfd.Close(d.dfd)
			d.dfd = -1
		}
		if d.inPipe > 0 {
			r.st.lose(uint64(d.inPipe), d.dst.opErr("relay", fmt.Errorf("the connection ended before they were sent: %w", ErrClosed)))
			d.inPipe = 0
		}
		if d.p.r > 0 {
			r.home.putPipe(d.p, true)
			d.p = pipePair{}
		}
	}
}

// ---- the connections' handler -------------------------------------------------------------

// OnData: bytes received before the splice took over go on with SendData.
func (s *spliceSide) OnData(c *Conn, d Data) {
	n := d.Len()
	if err := s.r.conns[1-s.i].SendData(d); err != nil {
		d.Release()                 // a refused copy (mapped Data) is still ours; otherwise ErrStale, harmless
		s.r.st.lose(uint64(n), err) // taken from c, never delivered
		c.Close()
		return
	}
	s.r.dirs[s.i].total.Add(uint64(n))
}

func (s *spliceSide) OnEOF(c *Conn, err error) {
	peer := s.r.conns[1-s.i]
	if err != io.EOF {
		s.r.st.setErr(err)
		c.Close()
		peer.Close()
		return
	}
	s.preEOF.Store(true)
	peer.CloseWrite()
	if s.r.st.ended.Add(1) == 2 {
		s.r.closeBoth()
	}
}

// OnWritable: the connection drained what SendData queued before the splice took over.
func (s *spliceSide) OnWritable(c *Conn) { s.r.onHome(s.r.kick) }

// closing: c began a graceful close; it waits until the relay queued what its pipe holds
// for c (closeHolder).
func (s *spliceSide) closing(c *Conn) {
	if !s.r.onHome(func() { s.r.end(s.i, endClosing) }) {
		c.releaseHold()
		s.r.conns[1-s.i].Close()
	}
}

func (s *spliceSide) OnClose(c *Conn, err error) {
	s.r.st.closeLost(c, err) // what SendData forwarded before the splice took over (the pipe's own bytes are end's)
	s.r.st.closed.Add(1)
	if !s.r.onHome(func() { s.r.end(s.i, endGone) }) {
		s.r.conns[1-s.i].Close()
	}
}
