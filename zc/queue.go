package zc

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/memregops"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/zc/internal/becontract"
)

// counters are written by one queue (or its connections) and read by anyone.
type counters struct {
	becontract.Counters // the backend's (ring, plain and shim receives, send operations ...)

	sentZC, zcCopied, sentCopy                    atomic.Uint64
	recvMapped, recvMappedCopied, mappedFallbacks atomic.Uint64
	zcSwitches                                    atomic.Uint64
	creditPauses, closeTimeouts, handlerPanics    atomic.Uint64
	notifsUnexpected, acceptErrs, acceptBackoffs  atomic.Uint64
	sendPoolGrowFails                             atomic.Uint64
	sentSpliced, directWrites, recvDirect         atomic.Uint64
	poolWaits, memlockCaps                        atomic.Uint64
	// splice.go, sendfile.go
	relaySpliced, relaysSplice, relayFallbacks, relayErrors atomic.Uint64
	relaySpliceCalls, relayWaits                            atomic.Uint64
	pipeSizeRefused, fileSent, fileSendOps                  atomic.Uint64
	pipesOpen                                               atomic.Int64
}

// queue is one of the engine's queues: an event loop, its backend, its send pool and its
// connections.
type queue struct {
	*loop.Queue
	e     *Engine
	idx   int
	cpu   int // the CPU the queue's thread is pinned on unless NoPin (allowedCPUs()[idx % n])
	be    backend
	caps  backendCaps // the backend's optional capabilities (setBackend)
	send  *memreg.Pool
	space chan struct{} // signalled when send buffers return

	// Waiters for a send buffer, oldest first (under wmu): goroutines blocked in Write or
	// BufferWait, and connections that were refused a buffer (ErrExhausted, ErrWouldBlock)
	// and are owed an OnWritable. Every buffer that returns (or that growth adds) goes to the
	// oldest waiter: the pool is served in arrival order, and no refused connection is ever
	// left without an event (grants, wakeGrants).
	wmu      sync.Mutex
	waiters  []poolWaiter
	nwait    atomic.Int32
	waiting  map[*Conn]connWait // connections in waiters or granted a buffer
	nwaiting atomic.Int32       // len(waiting)
	granted  []*Conn            // connections granted a buffer, to be told on the loop
	grantsUp atomic.Bool        // a wakeGrants is posted

	// memCap: a growth was refused for lack of locked memory (RLIMIT_MEMLOCK was memCapAt):
	// the pool stays at its size, as at SendPoolMax, until the limit changes.
	memCap     atomic.Bool
	memCapAt   atomic.Uint64
	memCapSeen atomic.Int64 // when memCapped last read the limit (UnixNano)

	holds map[*Conn][]connHold // what features keep for connections, ended with them (loop only)

	conns  []*Conn // loop only; Conn.qi is the index (a slice: 8 bytes a connection, a map took ~50)
	nconns atomic.Int64
	// lateSends: finished connections with a send still in the kernel (finish at the second
	// close deadline): its buffers go back with its completion (lateSendDone), or when the
	// queue stops (abortAll). Loop only.
	lateSends map[*Conn]struct{}
	// lateNotifs: finished connections with zero-copy notifications outstanding: a late
	// notification still retires its send (zcFinish); once the queue stopped, the
	// application memory (SendBytes) of those that never came is handed back
	// (appAfterStop). Loop only.
	lateNotifs map[*Conn]struct{}
	stopping   bool // abortAll runs: finish keeps nothing for a completion that will not come

	notifsPending atomic.Int64
	growErr       atomic.Pointer[error]
	growPosted    atomic.Bool // a background pool growth is posted (getBuf)
	ctr           counters
	parts         []queuePart // the features' state on the queue: zcrx, splice (hooks.go)
}

func (q *queue) signalSpace() {
	select {
	case q.space <- struct{}{}:
	default:
	}
}

// poolWaiter is one waiter for a send buffer: a blocked goroutine (ch) or a connection (c).
type poolWaiter struct {
	ch chan memreg.Buf
	c  *Conn
}

// connWait is a connection's place among the pool's waiters.
type connWait struct {
	buf    memreg.Buf // granted, not yet taken
	inList bool       // in q.waiters
	again  bool       // refused again while granted: back in line after its OnWritable
}

// sendBufFreed runs (any goroutine) when a send buffer returns to the pool.
func (q *queue) sendBufFreed() {
	if q.nwait.Load() == 0 {
		q.signalSpace()
		return
	}
	q.serveWaiters()
	q.signalSpace()
}

// serveWaiters hands free buffers to the oldest waiters (any goroutine): a blocked goroutine
// gets its buffer at once, a connection is granted one and told on the loop.
func (q *queue) serveWaiters() {
	q.wmu.Lock()
	grants := false
	for len(q.waiters) > 0 {
		b, err := q.send.Get()
		if err != nil {
			break
		}
		w := q.waiters[0]
		q.waiters[0] = poolWaiter{}
		q.waiters = q.waiters[1:]
		q.nwait.Add(-1)
		if w.ch != nil {
			w.ch <- b // buffered: never blocks
			q.YieldSoon()
			continue
		}
		q.waiting[w.c] = connWait{buf: b}
		q.granted = append(q.granted, w.c)
		grants = true
	}
	if len(q.waiters) == 0 {
		q.waiters = nil
	}
	q.wmu.Unlock()
	if grants && q.grantsUp.CompareAndSwap(false, true) {
		if q.Post(q.wakeGrants) != nil {
			q.grantsUp.Store(false)
			q.dropGrants() // the queue stopped: nobody will be told
		}
	}
}

// waitConn queues c for the next free send buffer (any goroutine): it was refused one, and
// the rule is that it hears OnWritable (or OnClose) when one is free for it.
func (q *queue) waitConn(c *Conn) {
	q.wmu.Lock()
	if w, ok := q.waiting[c]; ok {
		if !w.inList {
			w.again = true // refused during its own OnWritable: in line again after it
			q.waiting[c] = w
		}
		q.wmu.Unlock()
		return
	}
	if q.waiting == nil {
		q.waiting = map[*Conn]connWait{}
	}
	q.waiting[c] = connWait{inList: true}
	q.nwaiting.Add(1)
	q.waiters = append(q.waiters, poolWaiter{c: c})
	q.nwait.Add(1)
	q.wmu.Unlock()
	q.ctr.poolWaits.Add(1)
	// A buffer may have come back (or the pool grown) before we queued up.
	q.serveWaiters()
}

// takeGrant returns the buffer granted to c, if any (any goroutine).
func (q *queue) takeGrant(c *Conn) (memreg.Buf, bool) {
	if q.nwaiting.Load() == 0 {
		return memreg.Buf{}, false
	}
	q.wmu.Lock()
	defer q.wmu.Unlock()
	w, ok := q.waiting[c]
	if !ok || !w.buf.Valid() {
		return memreg.Buf{}, false
	}
	b := w.buf
	w.buf = memreg.Buf{}
	q.waiting[c] = w // still in q.granted: wakeGrants finishes it
	return b, true
}

// maxGrantsPerTurn bounds the OnWritable calls one wakeGrants makes before it lets the loop
// serve completions again (the rest follow in the next turn).
const maxGrantsPerTurn = 64

// wakeGrants tells the connections granted a buffer, oldest first (loop only): OnWritable
// runs with the grant reserved for the connection (its next Buffer or Write takes it); a
// grant the handler did not take goes back to the pool, that is to the next waiter.
func (q *queue) wakeGrants() {
	q.grantsUp.Store(false)
	for i := 0; i < maxGrantsPerTurn; i++ {
		q.wmu.Lock()
		if len(q.granted) == 0 {
			q.granted = nil
			q.wmu.Unlock()
			return
		}
		c := q.granted[0]
		q.granted[0] = nil
		q.granted = q.granted[1:]
		q.wmu.Unlock()
		if !c.ended() && !c.inClose() {
			c.writable()
		}
		q.wmu.Lock()
		w, ok := q.waiting[c]
		switch {
		case !ok:
		case w.again && !c.ended():
			q.waiting[c] = connWait{inList: true}
			q.waiters = append(q.waiters, poolWaiter{c: c})
			q.nwait.Add(1)
		default:
			delete(q.waiting, c)
			q.nwaiting.Add(-1)
		}
		q.wmu.Unlock()
		if w.buf.Valid() {
			w.buf.Release() // not taken: the next waiter's
		} else if ok && w.again {
			q.serveWaiters() // back in line: a buffer may be free already
		}
	}
	if q.grantsUp.CompareAndSwap(false, true) {
		if q.Post(q.wakeGrants) != nil {
			q.grantsUp.Store(false)
			q.dropGrants()
		}
	}
}

// dropGrants returns every grant (the queue stopped).
func (q *queue) dropGrants() {
	q.wmu.Lock()
	var bufs []memreg.Buf
	for _, c := range q.granted {
		if w, ok := q.waiting[c]; ok {
			if w.buf.Valid() {
				bufs = append(bufs, w.buf)
			}
			delete(q.waiting, c)
			q.nwaiting.Add(-1)
		}
	}
	q.granted = nil
	q.wmu.Unlock()
	for _, b := range bufs {
		b.Release()
	}
}

// forgetConn drops c from the waiters (it finished: OnClose is its event).
func (q *queue) forgetConn(c *Conn) {
	if q.nwaiting.Load() == 0 {
		return
	}
	q.wmu.Lock()
	w, ok := q.waiting[c]
	if ok {
		delete(q.waiting, c)
		q.nwaiting.Add(-1)
		if w.inList {
			for i, x := range q.waiters {
				if x.c == c {
					q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
					q.nwait.Add(-1)
					break
				}
			}
		}
	}
	q.wmu.Unlock()
	if w.buf.Valid() {
		w.buf.Release()
	}
}

// waitSendBuf waits for a send buffer in FIFO order with the other waiters, until done is
// closed (ErrClosed), cancel is closed (errCanceled; nil: never) or the deadline dl returns
// passes (re-read while waiting: a deadline may change).
func (q *queue) waitSendBuf(done, cancel <-chan struct{}, dl func() time.Time) (memreg.Buf, error) {
	b, err := q.awaitSendBuf(done, cancel, dl)
	if err == nil && q.e.dbg != nil {
		q.e.dbg.taken(b, nil)
	}
	return b, err
}

func (q *queue) awaitSendBuf(done, cancel <-chan struct{}, dl func() time.Time) (memreg.Buf, error) {
	ch := make(chan memreg.Buf, 1)
	q.wmu.Lock()
	q.waiters = append(q.waiters, poolWaiter{ch: ch})
	q.nwait.Add(1)
	q.wmu.Unlock()
	leave := func() (memreg.Buf, bool) {
		q.wmu.Lock()
		defer q.wmu.Unlock()
		for i, w := range q.waiters {
			if w.ch == ch {
				q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
				q.nwait.Add(-1)
				return memreg.Buf{}, false
			}
		}
		return <-ch, true // handed a buffer just now
	}
	// A buffer may have come back (or the pool grown) before we queued up.
	q.serveWaiters()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var t <-chan time.Time
		if dl != nil {
			if d := dl(); !d.IsZero() {
				left := time.Until(d)
				if left <= 0 {
					if b, ok := leave(); ok {
						return b, nil
					}
					return memreg.Buf{}, errTimeout
				}
				tm := time.NewTimer(left)
				defer tm.Stop()
				t = tm.C
			}
		}
		select {
		case b := <-ch:
			return b, nil
		case <-cancel:
			if b, ok := leave(); ok {
				return b, nil // handed one just now: better than giving up
			}
			return memreg.Buf{}, errCanceled
		case <-done:
			if b, ok := leave(); ok {
				b.Release()
			}
			return memreg.Buf{}, ErrClosed
		case <-t:
		case <-tick.C:
			// The pool may have grown meanwhile: serve the waiters (us among them) again.
			if q.send.Free() > 0 {
				q.serveWaiters()
			}
		}
	}
}

// getSendBuf takes a send buffer for no connection in particular (the net.Conn face's
// sendfile path waits with waitSendBuf itself).
func (q *queue) getSendBuf() (memreg.Buf, error) { return q.getBuf(nil, nil) }

// getBuf takes a send buffer for connection c: the one granted to it, else a free one, else
// one from a growth of the pool (on the loop: registration needs the ring's thread), which
// is not made for a connection that already has MaxQueuedBytes queued (growth serves many
// connections, not one unbounded queue). A refusal (an error matching memreg.ErrExhausted)
// queues waiter among the pool's waiters — OnWritable follows when a buffer is free for it —
// unless waiter is nil (a caller that waits with waitSendBuf instead). A growth refused for
// lack of locked memory (RLIMIT_MEMLOCK) is a cap, as SendPoolMax is: counted, reported once
// (Config.OnLimit), and waited out like it. Under Config.Debug the buffer's poison is checked.
func (q *queue) getBuf(c, waiter *Conn) (memreg.Buf, error) {
	b, err := q.takeBuf(c, waiter)
	if err == nil && q.e.dbg != nil {
		q.e.dbg.taken(b, c)
	}
	return b, err
}

func (q *queue) takeBuf(c, waiter *Conn) (memreg.Buf, error) {
	if c != nil {
		if b, ok := q.takeGrant(c); ok {
			return b, nil
		}
	}
	for {
		b, err := q.send.Get()
		if errors.Is(err, memreg.ErrClosed) {
			return b, ErrClosed // the engine closed
		}
		if err == nil || !errors.Is(err, memreg.ErrExhausted) {
			return b, err
		}
		refuse := func(err error) (memreg.Buf, error) {
			if waiter != nil {
				q.waitConn(waiter)
			}
			return memreg.Buf{}, err
		}
		if !q.send.CanGrow() {
			return refuse(memreg.ErrPoolCap)
		}
		if q.memCapped() {
			return refuse(errMemlockCap)
		}
		if c != nil && c.Queued() >= q.e.cfg.MaxQueuedBytes {
			return refuse(err)
		}
		grow := func() error {
			if q.send.Free() > 0 {
				return nil // someone released or grew meanwhile
			}
			_, err := q.send.Grow()
			var me *memreg.MemlockError
			switch {
			case err == nil:
				q.ctr.PoolGrows.Add(1)
				q.serveWaiters()
			case errors.As(err, &me):
				q.ctr.sendPoolGrowFails.Add(1)
				q.growErr.Store(&err)
				q.capByMemlock(me)
				return errMemlockCap
			default:
				q.ctr.sendPoolGrowFails.Add(1)
				q.growErr.Store(&err)
			}
			return err
		}
		if !q.OnLoop() && q.e.onAnyLoop() {
			// Another queue's goroutine (a handler using a connection of this queue) must not
			// wait for this queue: two queues doing that to each other wait forever. Grow in
			// the background; the caller is refused and queued (the growth serves it).
			if q.growPosted.CompareAndSwap(false, true) {
				if q.Post(func() { q.growPosted.Store(false); grow() }) != nil {
					q.growPosted.Store(false)
				}
			}
			return refuse(err)
		}
		if err := q.Do(grow); err != nil {
			if errors.Is(err, loop.ErrClosed) {
				return memreg.Buf{}, ErrClosed
			}
			if errors.Is(err, errMemlockCap) {
				return refuse(err)
			}
			return memreg.Buf{}, err
		}
	}
}

// errMemlockCap: the send pool cannot grow because RLIMIT_MEMLOCK is reached; it matches
// memreg.ErrExhausted (the pool is at its cap) and waits the same way.
var errMemlockCap = fmt.Errorf("send pool at the RLIMIT_MEMLOCK limit: %w", memreg.ErrExhausted)

// capByMemlock records a growth refused for lack of locked memory (loop only).
func (q *queue) capByMemlock(me *memreg.MemlockError) {
	q.memCapAt.Store(me.Limit)
	q.memCapSeen.Store(time.Now().UnixNano())
	if q.memCap.CompareAndSwap(false, true) {
		q.ctr.memlockCaps.Add(1)
		q.e.reportLimit(&LimitError{What: "send pool", Queue: q.idx, Have: q.send.Bytes(),
			Want: q.send.MaxBytes(), Err: me})
	}
}

// memCapped reports whether growth is capped by RLIMIT_MEMLOCK; a changed limit lifts the
// cap (looked at once a second at most: a refused Buffer costs no system call).
func (q *queue) memCapped() bool {
	if !q.memCap.Load() {
		return false
	}
	now := time.Now().UnixNano()
	if last := q.memCapSeen.Load(); now-last < int64(time.Second) || !q.memCapSeen.CompareAndSwap(last, now) {
		return true
	}
	if soft, err := memregops.MemlockSoft(); err == nil && soft != q.memCapAt.Load() {
		q.memCap.Store(false) // someone raised (or lowered) it: try again
		return false
	}
	return true
}

func (q *queue) addConn(c *Conn) {
	c.qi = int32(len(q.conns))
	q.conns = append(q.conns, c)
	q.nconns.Add(1)
}

func (q *queue) removeConn(c *Conn) {
	if i := int(c.qi); i >= 0 && i < len(q.conns) && q.conns[i] == c {
		last := len(q.conns) - 1
		q.conns[i] = q.conns[last]
		q.conns[i].qi = int32(i)
		q.conns[last] = nil
		q.conns = q.conns[:last]
		c.qi = -1
		if cap(q.conns) > 1024 && len(q.conns) < cap(q.conns)/4 {
			q.conns = slices.Clip(slices.Clone(q.conns)) // give back what a churn peak took
		}
		q.nconns.Add(-1)
	}
}

// closeAll closes every connection of the queue (Engine.Close): graceful, bounded by
// CloseTimeout; connections still dialing fail with ErrClosed.
func (q *queue) closeAll() {
	for _, c := range slices.Clone(q.conns) { // closing removes connections
		if c.ended() {
			continue
		}
		if c.connect != nil {
			c.dialFailed(ErrClosed)
			continue
		}
		c.mu.Lock()
		c.requestCloseLocked()
		if c.werr == nil {
			c.werr = ErrClosed
		}
		c.mu.Unlock()
		c.beginClose(nil)
	}
}

// abortDrain bounds how long a stopping queue waits for the completions of the sends it
// cancelled (abortAll).
const abortDrain = 50 * time.Millisecond

// abortAll finishes whatever is left when the queue stops (AtStop): the kernel objects go
// away with the driver right after.
func (q *queue) abortAll() {
	q.stopping = true
	defer func() {
		for c := range q.lateSends {
			c.dropPend() // the ring goes: the kernel is done with them
		}
		q.lateSends = nil
	}()
	// First every connection gives up its close (a graceful one with work ends with a
	// *CloseTimeoutError) or is aborted: its sends still in the kernel are cancelled, and
	// their completions, which say how much each took, are waited for a moment (they come
	// at once unless the kernel misbehaves): what the peer got is not counted as dropped.
	for _, c := range slices.Clone(q.conns) {
		if c.ended() || c.connect != nil {
			continue
		}
		if !c.inClose() {
			c.beginClose(ErrClosed)
		}
		c.cl.deadline = time.Now().Add(-time.Nanosecond) // the first deadline, not the second
		c.advanceClose()
	}
	q.Drain(abortDrain, func() bool {
		for _, c := range q.conns {
			if !c.ended() && q.be.inFlightSegs(c) > 0 {
				return false
			}
		}
		for c := range q.lateSends {
			if q.be.inFlightSegs(c) > 0 {
				return false
			}
		}
		return true
	})
	for _, c := range slices.Clone(q.conns) { // finishing removes connections
		if c.ended() {
			continue
		}
		if c.connect != nil {
			c.dialFailed(ErrClosed)
			continue
		}
		if !c.inClose() {
			c.beginClose(ErrClosed)
		}
		c.cl.deadline = c.cl.deadline.Add(-2 * c.e.cfg.CloseTimeout)
		c.advanceClose()
		c.finish()
	}
}

// appAfterStop hands back the application memory of zero-copy sends whose notification
// never came before the queue stopped: the ring is gone, so the kernel no longer reads it
// (AfterStop, on the loop's goroutine). Their callbacks run now, exactly once.
func (q *queue) appAfterStop() {
	for c := range q.lateNotifs {
		for i := range c.zwaitLen() {
			w := &c.tx.zwait[i]
			if w.s.kind == segApp {
				s := w.s
				w.s = seg{}
				c.finishSeg(s)
			}
		}
	}
	q.lateNotifs = nil
}

// A connHold is something a feature keeps on a connection's queue for it that must go when
// the connection finishes (a pending Conn.AfterFunc timer, timer.go): the queue keeps the
// holds by connection (addHold, dropHold, loop only) and ends those left as the connection
// finishes (endHolds), so nothing of a finished connection stays on its loop.
type connHold interface {
	// connEnded: the connection finished (loop only).
	connEnded()
}

func (q *queue) addHold(c *Conn, h connHold) {
	if q.holds == nil {
		q.holds = map[*Conn][]connHold{}
	}
	q.holds[c] = append(q.holds[c], h)
}

func (q *queue) dropHold(c *Conn, h connHold) {
	hs := q.holds[c]
	for i, x := range hs {
		if x == h {
			hs[i] = hs[len(hs)-1]
			hs[len(hs)-1] = nil
			hs = hs[:len(hs)-1]
			break
		}
	}
	if len(hs) == 0 {
		delete(q.holds, c)
	} else {
		q.holds[c] = hs
	}
}

// endHolds ends a finishing connection's holds (loop only).
func (q *queue) endHolds(c *Conn) {
	hs, ok := q.holds[c]
	if !ok {
		return
	}
	delete(q.holds, c)
	for _, h := range hs {
		h.connEnded()
	}
}
