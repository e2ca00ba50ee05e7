package zc

import (
	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/memreg"
)

// The backends' shared vocabulary, in one place: the contract every backend implements
// (backend), the optional capabilities some have (asserted once, when the queue's backend is
// set: queue.caps), the tags of the operations they and the core put in the kernel, and the
// limits they share. The zero-copy policy a backend asks before a send is zcpolicy.go's
// (Conn.tx.zc); what a backend may read of a connection and must report is life.go's.
// No backend names another, and nothing outside be_*.go asserts or names a concrete backend
// type (TestBackendsStayInTheirFiles).

// backend is how one queue moves bytes. Every method runs on the queue's goroutine.
type backend interface {
	name() Backend
	// newConnState makes the backend's own state of a new connection (Conn.bk, life.go).
	newConnState() backendState
	// start attaches a connected socket to the queue (epoll registration, module attach).
	start(c *Conn) error
	armRecv(c *Conn)  // start receiving (sets c.recvArmed)
	stopRecv(c *Conn) // stop receiving; what is in flight still completes
	// send hands the head of c.tx.pend to the kernel, as much as the backend takes at once.
	send(c *Conn)
	sending(c *Conn) bool     // a send is in the kernel
	inFlightSegs(c *Conn) int // how many head segments of c.tx.pend it covers
	// cancelSend ends the send in the kernel early (an abort): it completes with what it
	// took. A send that waits for room would otherwise hold the socket open (no reset) and
	// its buffers lent for as long as the peer does not read.
	cancelSend(c *Conn)
	// closeSocket detaches and closes the socket; operations in flight then complete.
	closeSocket(c *Conn)
	freeOp(c *Conn, ud uint64)
	zeroCopy() bool // sends can be zero-copy
	directOK() bool // a writer may write(2) the socket itself when nothing is queued
	// appDirect: sends go from the application's memory itself (SendBytes' segApp);
	// false: the backend copies it into its own send buffers (rehomePend) first
	appDirect() bool
	// dial starts connecting c (its socket is non-blocking, c.connect holds the address).
	dial(c *Conn)
	cancelDial(c *Conn)
	// dropDial forgets the connect in flight without waiting for its completion (the queue
	// is stopping).
	dropDial(c *Conn)
	// listen starts accepting on p's socket; stopListen stops it (p.stopped() when done).
	listen(p *lpart)
	stopListen(p *lpart)
	pauseListen(p *lpart) // stop accepting until listen is called again
	// recvPool is the pool receive buffers come from.
	recvPool() *memreg.Pool
	close()
}

// Tags of the operations in the kernel (loop.NewOp): the backends' and the core's own (the
// splice machinery's fd watches), one space so that no two mean the same.
const (
	tagRecv uint32 = iota + 1
	tagSend
	tagSendZC
	tagConnect
	tagPoll
	tagAccept
	tagDial // epoll: connect readiness
	tagShim // shim module completions
)

const (
	tagSpliceIn uint32 = 100 + iota
	tagSpliceOut
	tagFileOut
	tagSpliceEpoll
)

// Limits the backends share.
const (
	maxIov       = 64      // buffers per gathered send (SENDMSG, writev)
	maxSendBatch = 1 << 20 // bytes per gathered send (latency stays low behind a big batch)
)

// Optional capabilities of a backend: small interfaces, asserted once when the queue's
// backend is set (setBackend), so that the core asks q.caps and never the backend's type.

// spliceBackend: the splice relay (and SendFile's splice) run on this backend: a splice(2)
// of a duplicate of a connection's socket sees the connection's own stream.
type spliceBackend interface {
	// watchEpoll returns the epoll instance the queue's fd watches use (the backend's own,
	// or one whose readiness the ring reports); nil when each wait is a ring poll.
	watchEpoll(q *queue) *loop.Epoll
}

// ringBackend: the backend owns an io_uring ring the core may put operations of its own
// in (polls of fd watches, their cancels, zcrx receivers, the mapped receive's poll).
type ringBackend interface {
	uring() *loop.URing
	// armPoll arms a multishot readability poll as c's receive (its completions reach the
	// connection's receive path: the mapped receive's onPoll).
	armPoll(c *Conn)
	// cancelRecv cancels c's armed receive or poll: its last completion follows.
	cancelRecv(c *Conn)
}

// recvInFlighter is a backend whose stopRecv clears c.recvArmed while a receive it posted
// may still complete (the zcshim backend: a RECV in the module): it reports whether one is
// out.
type recvInFlighter interface {
	recvInFlight(c *Conn) bool
}

// ringStatser is a backend with a provided-buffer ring, whose counters Stats adds up.
type ringStatser interface{ ringStats() ringStats }

// backendCaps are the capabilities of a queue's backend (nil: absent).
type backendCaps struct {
	splice   spliceBackend
	ring     ringBackend
	inFlight recvInFlighter
	stats    ringStatser
}

// setBackend makes b the queue's backend and asserts its capabilities, once.
func (q *queue) setBackend(b backend) {
	q.be = b
	q.caps = backendCaps{}
	q.caps.splice, _ = b.(spliceBackend)
	q.caps.ring, _ = b.(ringBackend)
	q.caps.inFlight, _ = b.(recvInFlighter)
	q.caps.stats, _ = b.(ringStatser)
}
