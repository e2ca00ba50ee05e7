package zc

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/memreg"
)

// backend is how one queue moves bytes. Every method runs on the queue's goroutine.
type backend interface {
	name() Backend
	// start attaches a connected socket to the queue (epoll registration, module attach).
	start(c *Conn) error
	armRecv(c *Conn)  // start receiving (sets c.recvArmed)
	stopRecv(c *Conn) // stop receiving; what is in flight still completes
	// send hands the head of c.tx.pend to the kernel, as much as the backend takes at once.
	send(c *Conn)
	sending(c *Conn) bool     // a send is in the kernel
	inFlightSegs(c *Conn) int // how many head segments of c.tx.pend it covers
	// closeSocket detaches and closes the socket; operations in flight then complete.
	closeSocket(c *Conn)
	freeOp(c *Conn, ud uint64)
	zeroCopy() bool // sends can be zero-copy
	directOK() bool // a writer may write(2) the socket itself when nothing is queued
	// dial starts connecting c (its socket is non-blocking, c.connect holds the address).
	dial(c *Conn)
	cancelDial(c *Conn)
	// listen starts accepting on p's socket; stopListen stops it (p.stopped() when done).
	listen(p *lpart)
	stopListen(p *lpart)
	pauseListen(p *lpart) // stop accepting until listen is called again
	// recvPool is the pool receive buffers come from.
	recvPool() *memreg.Pool
	close()
}

// counters are written by one queue (or its connections) and read by anyone.
type counters struct {
	sentZC, zcCopied, sentCopy, sendOps, sendZCOps atomic.Uint64
	recvRing, recvPlain, recvShim                  atomic.Uint64
	recvMapped, recvMappedCopied, mappedFallbacks  atomic.Uint64
	zcSwitches, zcProbes, bufEmpty                 atomic.Uint64
	creditPauses, closeTimeouts, handlerPanics     atomic.Uint64
	notifsUnexpected, acceptErrs, acceptBackoffs   atomic.Uint64
	sendPoolGrows, sendPoolGrowFails               atomic.Uint64
	sentSpliced, directWrites, recvDirect          atomic.Uint64
}

// queue is one of the engine's queues: an event loop, its backend, its send pool and its
// connections.
type queue struct {
	*loop.Queue
	e     *Engine
	idx   int
	cpu   int // the CPU the queue's thread is pinned on unless NoPin (allowedCPUs()[idx % n])
	be    backend
	send  *memreg.Pool
	space chan struct{} // signalled when send buffers return

	wmu     sync.Mutex
	waiters []chan memreg.Buf // goroutines waiting for a send buffer, oldest first
	nwait   atomic.Int32

	conns  []*Conn // loop only; Conn.qi is the index (a slice: 8 bytes a connection, a map took ~50)
	nconns atomic.Int64

	notifsPending atomic.Int64
	growErr       atomic.Pointer[error]
	growPosted    atomic.Bool // a background pool growth is posted (getSendBufFor)
	ctr           counters
	zx            zcrxQueue // RecvZcrx (zcrx.go)
}

func (q *queue) signalSpace() {
	select {
	case q.space <- struct{}{}:
	default:
	}
}

// sendBufFreed runs (any goroutine) when a send buffer returns to the pool: the oldest
// waiters get buffers first, so a crowd of senders cannot starve one of them.
func (q *queue) sendBufFreed() {
	if q.nwait.Load() == 0 {
		q.signalSpace()
		return
	}
	q.wmu.Lock()
	for len(q.waiters) > 0 {
		b, err := q.send.Get()
		if err != nil {
			break
		}
		ch := q.waiters[0]
		q.waiters[0] = nil
		q.waiters = q.waiters[1:]
		q.nwait.Add(-1)
		ch <- b // buffered: never blocks
		q.YieldSoon()
	}
	q.wmu.Unlock()
	q.signalSpace()
}

// waitSendBuf waits for a send buffer in FIFO order with the other waiters, until done is
// closed or the deadline dl returns passes (re-read while waiting: a deadline may change).
func (q *queue) waitSendBuf(done <-chan struct{}, dl func() time.Time) (memreg.Buf, error) {
	ch := make(chan memreg.Buf, 1)
	q.wmu.Lock()
	q.waiters = append(q.waiters, ch)
	q.nwait.Add(1)
	q.wmu.Unlock()
	leave := func() (memreg.Buf, bool) {
		q.wmu.Lock()
		defer q.wmu.Unlock()
		for i, w := range q.waiters {
			if w == ch {
				q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
				q.nwait.Add(-1)
				return memreg.Buf{}, false
			}
		}
		return <-ch, true // handed a buffer just now
	}
	// A buffer may have come back (or the pool grown) before we queued up.
	if b, err := q.send.Get(); err == nil {
		if got, ok := leave(); ok {
			got.Release()
		}
		return b, nil
	}
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
		case <-done:
			if b, ok := leave(); ok {
				b.Release()
			}
			return memreg.Buf{}, ErrClosed
		case <-t:
		case <-tick.C:
			// The pool may have grown (or a release missed the hand-off): try once more,
			// keeping our place.
			if q.send.Free() > 0 && q.oldest(ch) {
				if b, err := q.send.Get(); err == nil {
					if got, ok := leave(); ok {
						got.Release()
					}
					return b, nil
				}
			}
		}
	}
}

func (q *queue) oldest(ch chan memreg.Buf) bool {
	q.wmu.Lock()
	defer q.wmu.Unlock()
	return len(q.waiters) > 0 && q.waiters[0] == ch
}

// getSendBuf takes a send buffer, growing the pool (on the loop: registration needs the
// ring's thread) when it is empty and may grow.
func (q *queue) getSendBuf() (memreg.Buf, error) { return q.getSendBufFor(nil) }

// getSendBufFor is getSendBuf for connection c: the pool does not grow for a connection that
// already has MaxQueuedBytes queued (growth serves many connections, not one unbounded queue).
func (q *queue) getSendBufFor(c *Conn) (memreg.Buf, error) {
	for {
		b, err := q.send.Get()
		if errors.Is(err, memreg.ErrClosed) {
			return b, ErrClosed // the engine closed
		}
		if err == nil || !errors.Is(err, memreg.ErrExhausted) {
			return b, err
		}
		if !q.send.CanGrow() {
			return b, memreg.ErrPoolCap
		}
		if c != nil && c.Queued() >= q.e.cfg.MaxQueuedBytes {
			return b, err
		}
		grow := func() error {
			if q.send.Free() > 0 {
				return nil // someone released or grew meanwhile
			}
			_, err := q.send.Grow()
			if err != nil {
				q.ctr.sendPoolGrowFails.Add(1)
				q.growErr.Store(&err)
			} else {
				q.ctr.sendPoolGrows.Add(1)
			}
			return err
		}
		if !q.OnLoop() && q.e.onAnyLoop() {
			// Another queue's goroutine (a handler using a connection of this queue) must not
			// wait for this queue: two queues doing that to each other wait forever. Grow in
			// the background; the caller sees ErrExhausted and tries again (OnWritable, or a
			// returning buffer).
			if q.growPosted.CompareAndSwap(false, true) {
				if q.Post(func() { q.growPosted.Store(false); grow() }) != nil {
					q.growPosted.Store(false)
				}
			}
			return b, err
		}
		if err := q.Do(grow); err != nil {
			if errors.Is(err, loop.ErrClosed) {
				return memreg.Buf{}, ErrClosed
			}
			return memreg.Buf{}, err
		}
	}
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
		if c.finished {
			continue
		}
		if c.connect != nil {
			c.dialFailed(ErrClosed)
			continue
		}
		c.mu.Lock()
		c.closeReq = true
		if c.werr == nil {
			c.werr = ErrClosed
		}
		c.mu.Unlock()
		c.beginClose(nil)
	}
}

// abortAll finishes whatever is left when the queue stops (AtStop): the kernel objects go
// away with the driver right after.
func (q *queue) abortAll() {
	for _, c := range slices.Clone(q.conns) { // finishing removes connections
		if c.finished {
			continue
		}
		if c.connect != nil {
			c.dialFailed(ErrClosed)
			continue
		}
		if !c.closing {
			c.beginClose(ErrClosed)
		}
		c.cl.deadline = c.cl.deadline.Add(-2 * c.e.cfg.CloseTimeout)
		c.advanceClose()
		c.finish()
	}
}
