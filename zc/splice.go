package zc

import (
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/rawfd"
)

// Readiness-driven splice(2) from the queue goroutine: the relay's splice path (relay.go,
// spliceRelay below) and Conn.SendFile (sendfile.go) wait for a descriptor to become
// readable or writable with an fdWatch, then move bytes with non-blocking system calls.
//
// Why not IORING_OP_SPLICE: io_uring never runs a splice inline; io_splice returns -EAGAIN
// when issued non-blocking (io_uring/splice.c), so every one goes to an io-wq worker thread,
// and a splice from an empty socket blocks that worker until data comes. A relay of 64 idle
// connections would hold 128 kernel threads, and on a 2-CPU machine each wake-up is a thread
// switch. Readiness (an epoll registration; see ringEpoll for the io_uring backend) followed
// by non-blocking splice(2) calls on the queue's own thread costs no thread at all while idle.

// fdWatch waits for readiness of a descriptor it does not own, on one queue (loop only): a
// one-shot registration in the queue's watch epoll (watchEpoll: the backend's own, or on
// io_uring a private one the ring reports on), or with ring set a POLL_ADD through the ring
// per wait. In an epoll the descriptor must not be registered already: the relay watches
// duplicates of the connections' descriptors. One wait at a time; the owner's OnEvent calls
// fired first.
type fdWatch struct {
	q     *queue
	fd    int
	owner loop.Owner
	tag   uint32
	ud    uint64
	armed bool // a wait is in the kernel
	added bool // epoll: the descriptor is registered
	ep    *loop.Epoll
	ring  bool // waits are POLL_ADDs through the ring
}

// spliceCapable reports whether the splice relay runs on the queue's backend: io_uring,
// plain, and zcshim (whose module sends and receives through the socket's own operations, so
// a splice(2) of a duplicate sees the same stream; the watches use its epoll; a paused
// connection posts no RECV there, not even on a hang-up: zc/internal/be/shim's onReadable). Test
// backends keep SendData.
func spliceCapable(q *queue) bool { return q.caps.splice != nil }

// recvQuiet reports whether no receive of c can still take bytes from its socket (loop only):
// the splice relay starts reading the socket itself only then.
func recvQuiet(c *Conn) bool {
	if c.recvArmed {
		return false
	}
	if f := c.q.caps.inFlight; f != nil && f.recvInFlight(c) {
		return false
	}
	return true
}

// watchEpoll returns the epoll instance the queue's watches use: the backend's own (plain,
// shim), or on the io_uring backend a private one whose readiness the ring reports
// (spliceQueue.ep): nil when that cannot be made (then each wait is a POLL_ADD).
func (q *queue) watchEpoll() *loop.Epoll {
	if s := q.caps.splice; s != nil {
		return s.watchEpoll(q)
	}
	return nil
}

// arm starts a one-shot wait for events (POLLIN or POLLOUT); a wait already armed stays.
func (w *fdWatch) arm(events uint32) error {
	if w.armed {
		return nil
	}
	if w.ep == nil && !w.ring {
		if w.ep = w.q.watchEpoll(); w.ep == nil {
			w.ring = true
		}
	}
	if w.ring {
		r := w.q.caps.ring
		if r == nil {
			return unix.EOPNOTSUPP
		}
		w.ud = w.q.NewOp(w.owner, w.tag)
		sqe := r.uring().GetSQE()
		sqe.PrepPollAdd(int32(w.fd), events, false)
		sqe.UserData = w.ud
		w.armed = true
		return nil
	}
	ev := events | unix.EPOLLONESHOT
	if !w.added {
		w.ud = w.q.NewOp(w.owner, w.tag)
		if err := w.ep.Add(w.fd, ev, w.ud); err != nil {
			w.q.FreeOp(w.ud)
			w.ud = 0
			return err
		}
		w.added = true
	} else if err := w.ep.Mod(w.fd, ev, w.ud); err != nil {
		return err
	}
	w.armed = true
	return nil
}

// fired records that the wait's event arrived (the owner's OnEvent calls it first); it
// reports whether the event is the watch's current one.
func (w *fdWatch) fired(ev loop.Event) bool {
	if ev.UD != w.ud || !w.armed {
		if w.ring {
			w.q.FreeOp(ev.UD) // a cancelled wait's completion
		}
		return false
	}
	w.armed = false
	if w.ring {
		w.q.FreeOp(ev.UD)
		w.ud = 0
	}
	return true
}

// ringPoll reports whether the watch's waits are POLL_ADDs through the ring (each one an
// operation until its completion) rather than epoll registrations.
func (w *fdWatch) ringPoll() bool { return w.ring }

// stop ends the watch before the descriptor is closed: a wait in the ring is cancelled (its
// completion comes back to the owner, which ignores it) and submitted now, so no prepared
// request names the descriptor after it is closed; an epoll registration is removed.
func (w *fdWatch) stop() {
	if w.ring {
		if r := w.q.caps.ring; r != nil {
			if w.armed {
				r.uring().CancelOp(w.ud)
			}
			r.uring().Submit()
		}
	} else if w.added {
		w.ep.Del(w.fd)
		w.q.FreeOp(w.ud)
		w.added = false
	}
	w.armed = false
	w.ud = 0
}

// sockWait waits for room in connection c's socket (loop only): an fdWatch for POLLOUT on a
// duplicate of the socket, made at the first wait and kept until release. The duplicate
// keeps the registration away from the connection's own descriptor (registered in the
// backend's epoll already, and closed by the core while a wait may be out). SendFile's
// segments (fileSeg.wait) and an owed TLS KeyUpdate (tlsRekey) wait with it. Its work in the
// kernel counts in c's operations, so that a close waits for it: the registration until
// release, and on the io_uring backend without a watch epoll each POLL_ADD until its
// completion (the owner's OnEvent passes every event to fired, a cancelled one's too).
type sockWait struct {
	w   *fdWatch
	dup bool // w.fd is open (until release)
}

// arm starts a one-shot wait for room (a wait already armed stays) whose event goes to
// owner's OnEvent with tag. After a release it starts over with a new duplicate (a cancelled
// wait's completion still coming is told apart by its operation, which stays registered
// until then).
func (s *sockWait) arm(c *Conn, owner loop.Owner, tag uint32) error {
	if !s.dup {
		d, err := c.sock.Dup()
		if err != nil {
			return err
		}
		s.w, s.dup = &fdWatch{q: c.q, fd: d, owner: owner, tag: tag}, true
		c.opStarted() // the registration, until release
	}
	if s.w.armed {
		return nil
	}
	if err := s.w.arm(unix.POLLOUT); err != nil {
		return err
	}
	if s.w.ringPoll() {
		c.opStarted() // the poll, until its completion
	}
	return nil
}

// armed reports whether a wait is out.
func (s *sockWait) armed() bool { return s.w != nil && s.w.armed }

// fired takes an event of the wait (the owner's OnEvent calls it first): it reports whether
// it is the armed wait's (the socket has room, or an error or hang-up), not a cancelled one.
func (s *sockWait) fired(c *Conn, ev loop.Event) bool {
	if s.w == nil {
		return false
	}
	if s.w.ringPoll() {
		c.opEnded()
	}
	return s.w.fired(ev)
}

// release ends the wait and closes the duplicate: a POLL_ADD out is cancelled (its
// completion still comes to the owner's OnEvent, and fired ignores it).
func (s *sockWait) release(c *Conn) {
	if !s.dup {
		return
	}
	s.w.stop()
	rawfd.Close(s.w.fd)
	s.dup = false
	c.opEnded()
}

// ---- pipes -------------------------------------------------------------------------------

// spliceQueue is a queue's splice state (loop only): its pool of empty pipes and its live
// relays (closed with the queue). It is a queue part (hooks.go), and the io_uring backend's
// watch epoll through it (a watchPart: ringEpoll).
type spliceQueue struct {
	pipes    []pipePair
	relays   map[*spliceRelay]struct{}
	atStopOn bool
	stopped  bool // the queue stopped: nothing is kept any more
	// io_uring backend: the private epoll instance of the watches (ringEpoll)
	ep       *loop.Epoll
	epOwner  *ringEpoll
	epFailed bool
}

// splicePart is the index of the queue's spliceQueue in queue.parts.
var splicePart = registerQueuePart(func() queuePart { return new(spliceQueue) })

// splq is the queue's splice state.
func (q *queue) splq() *spliceQueue { return q.parts[splicePart].(*spliceQueue) }

// stats: the splice counters are the queue's own (queue.ctr).
func (s *spliceQueue) stats(*Stats) {}

// ringEpoll returns the io_uring queue's private epoll instance for watches, making it
// (loop only). Its readiness reaches the loop as a POLL_ADD completion through the ring,
// and one non-blocking epoll_wait then dispatches every ready watch: the waits of many
// relays cost one ring operation per batch instead of one each, and a burst of readiness is
// handled together (measured: 4-5x more bytes per splice call than a POLL_ADD per wait).
func (s *spliceQueue) ringEpoll(q *queue, u *loop.URing) *loop.Epoll {
	if s.ep != nil || s.epFailed {
		return s.ep
	}
	ep, err := loop.NewEpoll(q.Queue)
	if err == nil {
		// NewEpoll watches the queue's wake-up eventfd: the ring does that here.
		if err = ep.Del(q.WakeFD()); err != nil {
			ep.Close()
		}
	}
	if err != nil {
		s.epFailed = true
		return nil
	}
	s.ep = ep
	s.epOwner = &ringEpoll{q: q, u: u, ep: ep}
	s.epOwner.arm()
	if !s.atStopOn {
		s.atStopOn = true
		q.AtStop(q.spliceAtStop)
	}
	return ep
}

// ringEpoll is the owner of the POLL_ADD that reports the private epoll's readiness.
type ringEpoll struct {
	q      *queue
	u      *loop.URing
	ep     *loop.Epoll
	ud     uint64
	closed bool
}

func (r *ringEpoll) arm() {
	r.ud = r.q.NewOp(r, tagSpliceEpoll)
	sqe := r.u.GetSQE()
	sqe.PrepPollAdd(int32(r.ep.FD()), unix.POLLIN, false)
	sqe.UserData = r.ud
}

func (r *ringEpoll) OnEvent(_ *loop.Queue, ev loop.Event) {
	r.q.FreeOp(ev.UD)
	if r.closed {
		return
	}
	r.ep.Wait(0) // dispatches the ready watches
	if !r.closed {
		r.arm() // completes at once if more are ready than one wait took
	}
}

type pipePair struct {
	r, w int
	size int
}

// maxPooledPipes bounds the empty pipes a queue keeps for the next relay.
const maxPooledPipes = 64

// getPipe returns an empty non-blocking pipe of size bytes (the kernel may round it up).
func (q *queue) getPipe(size int) (pipePair, error) {
	s := q.splq()
	for i := len(s.pipes) - 1; i >= 0; i-- {
		if p := s.pipes[i]; p.size == size {
			s.pipes = append(s.pipes[:i], s.pipes[i+1:]...)
			return p, nil
		}
	}
	r, w, sized, err := rawfd.Pipe(size)
	if err != nil {
		return pipePair{}, err
	}
	p := pipePair{r: r, w: w, size: size}
	if !sized {
		// Above /proc/sys/fs/pipe-max-size, or the user's pipe pages are used up: the
		// default size still works, just in smaller steps.
		q.ctr.pipeSizeRefused.Add(1)
	}
	q.ctr.pipesOpen.Add(1)
	return p, nil
}

// putPipe takes a pipe back: an empty one is kept for the next relay (up to maxPooledPipes),
// the rest are closed.
func (q *queue) putPipe(p pipePair, empty bool) {
	if p.r <= 0 {
		return
	}
	if s := q.splq(); empty && len(s.pipes) < maxPooledPipes && !s.stopped {
		s.pipes = append(s.pipes, p)
		return
	}
	closePipe(q, p)
}

func closePipe(q *queue, p pipePair) {
	rawfd.Close(p.r)
	rawfd.Close(p.w)
	q.ctr.pipesOpen.Add(-1)
}

// spliceAtStop closes whatever the queue's splice machinery still holds (AtStop).
func (q *queue) spliceAtStop() {
	s := q.splq()
	s.stopped = true
	for r := range s.relays {
		r.stop()
	}
	s.relays = nil
	for _, p := range s.pipes {
		closePipe(q, p)
	}
	s.pipes = nil
	if s.ep != nil {
		s.epOwner.closed = true
		if r := q.caps.ring; r != nil {
			r.uring().CancelOp(s.epOwner.ud)
			r.uring().Submit()
		}
		s.ep.Close()
		s.ep = nil
	}
}

// addRelay registers a live relay on its home queue (loop only).
func (q *queue) addRelay(r *spliceRelay) {
	s := q.splq()
	if !s.atStopOn {
		s.atStopOn = true
		q.AtStop(q.spliceAtStop)
	}
	if s.relays == nil {
		s.relays = map[*spliceRelay]struct{}{}
	}
	s.relays[r] = struct{}{}
}

// dupSocket duplicates a connection's descriptor (close-on-exec), for a watcher that outlives
// nothing: the duplicate is the caller's to close.
func dupSocket(c *Conn) (int, error) {
	return c.sock.Dup()
}
