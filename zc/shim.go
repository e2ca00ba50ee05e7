package zc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/kmod/shim"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// The shim backend: the Conn API over the zcshim kernel module's queues (/dev/zcshim, see
// kmod/ and kmod/shim), for kernels or containers where io_uring is disabled or blocked.
//
// Each of Config.Queues shim queues is owned by one goroutine locked to its OS thread. The
// engine's send and receive regions are registered (pinned) with every queue once. A
// connection's socket is attached to one queue for its whole life; its sends are the
// module's zero-copy SENDs of the loaned buffers (several in flight: the module keeps one
// socket's operations in order), each returned to its region at its notification; one RECV
// per connection is kept posted into a free receive buffer, which the handler borrows as
// Data. SendPath does not apply: the module has only its zero-copy send, and its
// notification says whether the stack copied (BytesSentZC / BytesZCCopied, SendZCOps).
// Received bytes are counted in BytesRecvRing. Sockets are connected and accepted with
// blocking syscalls, as on the plain backend.

func init() {
	shimBackend = newShimBackend
	shimAvailable = func() error { return shimErr(shim.Probe()) }
}

// shimErr makes the module's "cannot" errors match ErrNotSupported too.
func shimErr(err error) error {
	if err != nil && (errors.Is(err, shim.ErrNotSupported) || errors.Is(err, shim.ErrABIMismatch)) && !errors.Is(err, ErrNotSupported) {
		return fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	return err
}

const (
	shimSQEntries   = 1024
	shimCQEntries   = 4096
	shimMaxInflight = 32 // SENDs in flight per connection
	shimCQSlack     = 16
)

type shimState struct {
	e          *Engine
	send, recv *memreg.Region
	space      chan struct{}
	ctr        counters
	queues     []*shimQueue
	rr         atomic.Uint32

	fmu  sync.Mutex
	free []int // receive buffers (lent to us) not posted
}

func newShimBackend(e *Engine) (altBackend, error) {
	if err := shimErr(shim.Probe()); err != nil {
		return nil, err
	}
	st := &shimState{e: e, space: make(chan struct{}, 1)}
	var err error
	if st.send, err = memreg.New(memreg.Options{BufSize: e.cfg.SendBufSize, Count: e.cfg.SendBufs}); err != nil {
		st.close()
		return nil, err
	}
	if st.recv, err = memreg.New(memreg.Options{BufSize: e.cfg.RecvBufSize, Count: e.cfg.RecvBufs}); err != nil {
		st.close()
		return nil, err
	}
	st.recv.Provide(e.cfg.RecvBufs, func(l memreg.Loan) { st.free = append(st.free, l.Index()) })
	st.recv.SetRecycler(st.recycle)
	for i := 0; i < e.cfg.Queues; i++ {
		q, err := st.newQueue(i)
		if err != nil {
			for _, q := range st.queues {
				q.closeFiles()
			}
			st.queues = nil
			st.close()
			return nil, err
		}
		st.queues = append(st.queues, q)
	}
	for _, q := range st.queues {
		go q.run()
	}
	return st, nil
}

func (st *shimState) sendRegion() *memreg.Region { return st.send }
func (st *shimState) spaceChan() chan struct{}   { return st.space }
func (st *shimState) counters() *counters        { return &st.ctr }

// close stops the queue loops (the module cancels what is left and keeps pages the stack
// still references pinned until it lets go), then unmaps the regions.
func (st *shimState) close() {
	for _, q := range st.queues {
		q.stop()
	}
	for _, q := range st.queues {
		<-q.exited
	}
	for _, r := range []*memreg.Region{st.send, st.recv} {
		if r != nil {
			r.Abandon()
			r.Close()
		}
	}
}

// recycle takes a receive buffer back (any goroutine) and wakes queues waiting for one.
func (st *shimState) recycle(idx int) {
	st.fmu.Lock()
	st.free = append(st.free, idx)
	st.fmu.Unlock()
	for _, q := range st.queues {
		if q.needBufs.CompareAndSwap(true, false) {
			q.post(nil)
		}
	}
}

func (st *shimState) takeFree() (int, bool) {
	st.fmu.Lock()
	defer st.fmu.Unlock()
	n := len(st.free)
	if n == 0 {
		return 0, false
	}
	idx := st.free[n-1]
	st.free = st.free[:n-1]
	return idx, true
}

func (st *shimState) pickQueue() *shimQueue {
	return st.queues[int(st.rr.Add(1)-1)%len(st.queues)]
}

// shimQueue is one /dev/zcshim queue and the goroutine that owns it.
type shimQueue struct {
	st  *shimState
	idx int
	// Two module contexts: the module runs one socket's operations in one ordered list, so a
	// RECV waiting for data would hold back every SEND queued after it on the same context.
	// SENDs go to tx and RECVs to rx; the socket is attached to both.
	tx, rx *shim.Queue
	efd    int
	// epfd tells which sockets have data: a RECV is posted only then (EPOLLONESHOT,
	// re-armed after a short read), so idle connections hold no receive buffer.
	epfd             int
	sendKey, recvKey shim.RegionKey // in tx: the send region, and the receive region (SendData)
	rxKey            shim.RegionKey // in rx: the receive region
	tid              atomic.Int32
	needBufs         atomic.Bool // a connection waits for a receive buffer
	exited           chan struct{}

	mu       sync.Mutex
	inbox    []func()
	kicked   []*shimConn
	sleeping bool
	woken    bool
	stopping bool
	gone     bool // the loop exited: nothing more is accepted, efd is closed

	// Loop side.
	ops      []shimOp
	freeOps  []uint32
	conns    map[*shimConn]struct{}
	byID     map[int32]*shimConn // epoll data -> connection
	nextID   int32
	events   []unix.EpollEvent
	starved  []*shimConn // waiting for a receive buffer
	blocked  []*shimConn // waiting for completion-queue room or a send buffer
	closing  int         // connections closing (the loop wakes up periodically for them)
	cqCap    int         // tx's completion queue
	sendRes  int         // tx CQ slots reserved by SENDs (2 until the completion, 1 until the notification)
	recvRes  int         // rx CQ slots reserved by RECVs (at most one per connection)
	cqes     []shim.Completion
	inboxBuf []func()
}

const (
	opSend uint8 = iota + 1
	opRecv
)

// shimOp is one operation the module holds; its index (with a generation) is the user_data.
type shimOp struct {
	gen   uint32
	kind  uint8
	live  bool
	sc    *shimConn
	loan  memreg.Loan // SEND: returned at the notification
	n     int         // SEND: length; RECV: receive buffer index
	sent  int         // SEND: bytes the completion reported
	owned bool        // SEND: the loan is a copy made by the loop (foreign region)
}

func (st *shimState) newQueue(i int) (*shimQueue, error) {
	sq := &shimQueue{st: st, idx: i, efd: -1, epfd: -1, exited: make(chan struct{}), conns: map[*shimConn]struct{}{},
		byID: map[int32]*shimConn{}, cqes: make([]shim.Completion, 256), events: make([]unix.EpollEvent, 128)}
	err := sq.open()
	if err != nil {
		sq.closeFiles()
		return nil, fmt.Errorf("zc: shim queue %d: %w", i, err)
	}
	return sq, nil
}

func (q *shimQueue) open() error {
	st := q.st
	var err error
	if q.tx, err = shim.Open(shim.Config{Entries: shimSQEntries, CQEntries: shimCQEntries}); err != nil {
		return shimErr(err)
	}
	// At most one RECV per connection, and at most shim.MaxSocks connections.
	if q.rx, err = shim.Open(shim.Config{Entries: shim.MaxSocks, CQEntries: 2 * shim.MaxSocks}); err != nil {
		return shimErr(err)
	}
	_, cq := q.tx.Entries()
	q.cqCap = int(cq)
	if q.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		q.efd = -1
		return os.NewSyscallError("eventfd", err)
	}
	if q.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		q.epfd = -1
		return os.NewSyscallError("epoll_create1", err)
	}
	if q.sendKey, err = q.tx.RegisterRegion(st.send.Base(), st.send.Info().Size, 0); err != nil {
		return err
	}
	if q.recvKey, err = q.tx.RegisterRegion(st.recv.Base(), st.recv.Info().Size, 0); err != nil {
		return err
	}
	q.rxKey, err = q.rx.RegisterRegion(st.recv.Base(), st.recv.Info().Size, 0)
	return err
}

// closeFiles closes the module contexts (the module cancels what they hold; pages the stack
// still references stay pinned by the module until it lets go) and the eventfd.
func (q *shimQueue) closeFiles() {
	if q.tx != nil {
		q.tx.Close()
	}
	if q.rx != nil {
		q.rx.Close()
	}
	if q.efd >= 0 {
		unix.Close(q.efd)
		q.efd = -1
	}
	if q.epfd >= 0 {
		unix.Close(q.epfd)
		q.epfd = -1
	}
}

// post runs f on the loop (f nil: just wake it). It fails once the loop is stopping.
func (q *shimQueue) post(f func()) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.gone || (q.stopping && f != nil) {
		return ErrClosed
	}
	if f != nil {
		q.inbox = append(q.inbox, f)
	}
	q.wakeLocked()
	return nil
}

// wakeLocked wakes a sleeping loop (q.mu held, so efd cannot be closed meanwhile).
func (q *shimQueue) wakeLocked() {
	if q.sleeping && !q.woken && !q.gone {
		q.woken = true
		var one = [8]byte{1}
		unix.Write(q.efd, one[:])
	}
}

func (q *shimQueue) kick(sc *shimConn) {
	if !sc.kicked.CompareAndSwap(false, true) {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.gone {
		return
	}
	q.kicked = append(q.kicked, sc)
	q.wakeLocked()
}

func (q *shimQueue) stop() {
	q.mu.Lock()
	q.stopping = true
	q.wakeLocked()
	q.mu.Unlock()
}

func (q *shimQueue) onLoop() bool { return int32(unix.Gettid()) == q.tid.Load() }

func (q *shimQueue) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	q.tid.Store(int32(unix.Gettid()))
	if !q.st.e.cfg.NoPin {
		// Like internal/loop's queues: one CPU per queue. Best effort (the CPU may be outside this
		// process's set).
		var set unix.CPUSet
		set.Set(q.idx % runtime.NumCPU())
		unix.SchedSetaffinity(0, &set)
	}
	defer close(q.exited)
	var kicked []*shimConn
	for {
		q.mu.Lock()
		inbox := q.inbox
		q.inbox = q.inboxBuf[:0]
		kicked, q.kicked = q.kicked, kicked[:0]
		stopping := q.stopping
		q.mu.Unlock()
		for i, f := range inbox {
			f()
			inbox[i] = nil
		}
		q.inboxBuf = inbox
		for _, sc := range kicked {
			sc.kicked.Store(false)
			q.service(sc)
		}
		if stopping {
			q.shutdown()
			return
		}
		q.readable()
		q.retry()
		q.submit()
		if q.reap() > 0 {
			continue
		}
		if q.closing > 0 {
			q.tick()
		}
		q.mu.Lock()
		idle := len(q.inbox) == 0 && len(q.kicked) == 0 && !q.stopping
		q.sleeping = idle
		q.mu.Unlock()
		if !idle {
			continue
		}
		timeout := 1000
		if q.closing > 0 || len(q.blocked) > 0 {
			timeout = 10
		}
		fds := []unix.PollFd{{Fd: int32(q.efd), Events: unix.POLLIN},
			{Fd: int32(q.tx.Fd()), Events: unix.POLLIN}, {Fd: int32(q.rx.Fd()), Events: unix.POLLIN},
			{Fd: int32(q.epfd), Events: unix.POLLIN}}
		if q.tx.Ready() == 0 && q.rx.Ready() == 0 {
			unix.Poll(fds, timeout) // EINTR: just go round
		}
		q.mu.Lock()
		q.sleeping, q.woken = false, false
		q.mu.Unlock()
		if fds[0].Revents != 0 {
			var buf [8]byte
			unix.Read(q.efd, buf[:])
		}
	}
}

// readable posts RECVs for the sockets that have data (or EOF, or an error) now.
func (q *shimQueue) readable() {
	if len(q.byID) == 0 {
		return
	}
	for {
		n, err := unix.EpollWait(q.epfd, q.events, 0)
		if err == unix.EINTR {
			continue
		}
		if n <= 0 {
			return
		}
		for _, ev := range q.events[:n] {
			if sc := q.byID[ev.Fd]; sc != nil {
				sc.ready = true
				q.armRecv(sc)
			}
		}
		if n < len(q.events) {
			return
		}
	}
}

const shimEpollEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

// rearm asks epoll for the socket's next readiness (loop only).
func (q *shimQueue) rearm(sc *shimConn) {
	if sc.detached || sc.eof || sc.closing {
		return
	}
	ev := unix.EpollEvent{Events: shimEpollEvents, Fd: sc.id}
	unix.EpollCtl(q.epfd, unix.EPOLL_CTL_MOD, sc.c.fd, &ev)
}

// unwatch removes the socket from epoll before it is closed (loop only).
func (q *shimQueue) unwatch(sc *shimConn) {
	if _, ok := q.byID[sc.id]; ok {
		delete(q.byID, sc.id)
		unix.EpollCtl(q.epfd, unix.EPOLL_CTL_DEL, sc.c.fd, nil)
	}
}

// submit hands prepared entries to the module. ErrCQFull cannot happen with the loop's own
// accounting, but would only mean "retry after reaping".
func (q *shimQueue) submit() {
	if q.tx.Prepared() > 0 {
		q.tx.Submit(-1, 0, 0)
	}
	if q.rx.Prepared() > 0 {
		q.rx.Submit(-1, 0, 0)
	}
}

func (q *shimQueue) newOp(op shimOp) uint64 {
	var idx uint32
	if n := len(q.freeOps); n > 0 {
		idx = q.freeOps[n-1]
		q.freeOps = q.freeOps[:n-1]
	} else {
		idx = uint32(len(q.ops))
		q.ops = append(q.ops, shimOp{})
	}
	op.gen = q.ops[idx].gen + 1
	op.live = true
	q.ops[idx] = op
	return uint64(op.gen)<<32 | uint64(idx)
}

func (q *shimQueue) freeOp(idx uint32) {
	q.ops[idx] = shimOp{gen: q.ops[idx].gen}
	q.freeOps = append(q.freeOps, idx)
}

// reap handles every ready completion and returns how many there were.
func (q *shimQueue) reap() int {
	total := 0
	for {
		n := q.tx.Completions(q.cqes)
		if n == 0 {
			n = q.rx.Completions(q.cqes)
		}
		if n == 0 {
			return total
		}
		total += n
		for _, cqe := range q.cqes[:n] {
			idx := uint32(cqe.UserData)
			if int(idx) >= len(q.ops) || !q.ops[idx].live || q.ops[idx].gen != uint32(cqe.UserData>>32) {
				continue // not ours: cannot happen, and must not crash
			}
			if q.ops[idx].kind == opRecv {
				q.onRecv(idx, cqe)
			} else {
				q.onSend(idx, cqe)
			}
		}
	}
}

// retry serves connections that waited for receive buffers or completion-queue room.
func (q *shimQueue) retry() {
	if len(q.starved) > 0 {
		starved := q.starved
		q.starved = nil
		for i, sc := range starved {
			sc.starved = false
			q.armRecv(sc)
			if sc.starved {
				// Out of buffers again: keep the order, wait for a recycle.
				q.starved = append(q.starved, starved[i+1:]...)
				for _, s := range starved[i+1:] {
					s.starved = true
				}
				break
			}
		}
		if len(q.starved) > 0 {
			q.needBufs.Store(true)
			// A buffer may have come back before the flag was set.
			q.st.fmu.Lock()
			avail := len(q.st.free) > 0
			q.st.fmu.Unlock()
			if avail && q.needBufs.CompareAndSwap(true, false) {
				q.post(nil)
			}
		}
	}
	if len(q.blocked) > 0 {
		blocked := q.blocked
		q.blocked = nil
		for _, sc := range blocked {
			sc.blocked = false
			q.service(sc)
			q.armRecv(sc)
		}
	}
}

// tick advances closing connections (their deadlines).
func (q *shimQueue) tick() {
	for sc := range q.conns {
		if sc.closing {
			q.advanceClose(sc)
		}
	}
}

// shutdown runs when the engine closes: whatever is still open is torn down at once.
func (q *shimQueue) shutdown() {
	for sc := range q.conns {
		if !sc.closing {
			q.beginClose(sc, ErrClosed)
		}
		sc.deadline = time.Time{}
		q.advanceClose(sc)
		if !sc.finished {
			q.finish(sc)
		}
	}
	// Work posted before stopping was set ran before this; later posts were refused.
	q.mu.Lock()
	q.gone = true
	q.closeFiles()
	q.mu.Unlock()
	// Buffers still lent come back with the regions' Abandon.
}

// ---- connections ------------------------------------------------------------------------

type shimConn struct {
	c      *Conn
	q      *shimQueue
	txSock shim.SockID // in q.tx
	rxSock shim.SockID // in q.rx
	id     int32       // epoll data
	kicked atomic.Bool

	// Loop side.
	attached   bool
	detached   bool
	fdClosed   bool
	pending    []shimReq // taken from the producer, not yet submitted
	inflight   int       // SENDs waiting for their completion
	notifs     int       // SENDs waiting for their notification
	recvOut    bool
	ready      bool // epoll said readable and no RECV has consumed it yet
	starved    bool
	blocked    bool
	paused     bool
	eof        bool
	closing    bool
	finished   bool
	closeErr   error
	deadline   time.Time
	shutWant   bool
	wrShut     bool
	sendFailed error
}

type shimReq struct {
	loan memreg.Loan
	n    int
	off  int // bytes already copied out (foreign regions only)
}

func (sc *shimConn) onLoop() bool { return sc.q.onLoop() }

func (sc *shimConn) kick() { sc.q.kick(sc) }

// post runs fn on the connection's queue goroutine (Conn.Post), unless it has closed by then.
func (sc *shimConn) post(fn func()) error {
	if sc.c.closeReq.Load() {
		return ErrClosed
	}
	return sc.q.post(func() {
		if !sc.finished {
			fn()
		}
	})
}

func (sc *shimConn) close(err error) {
	sc.q.post(func() { sc.q.beginClose(sc, err) })
}

func (sc *shimConn) shutdownWrite() {
	sc.q.post(func() {
		sc.shutWant = true
		sc.q.service(sc)
	})
}

func (sc *shimConn) setPaused(on bool) {
	sc.q.post(func() {
		sc.paused = on
		if !on {
			sc.q.armRecv(sc)
		}
	})
}

// attach attaches the connection's socket (loop only) and starts receiving.
func (q *shimQueue) attach(sc *shimConn) error {
	tx, err := q.tx.Attach(sc.c.fd)
	if err != nil {
		return err
	}
	rx, err := q.rx.Attach(sc.c.fd)
	if err != nil {
		q.tx.Detach(tx)
		return err
	}
	q.nextID++
	if q.nextID <= 0 {
		q.nextID = 1
	}
	sc.id = q.nextID
	ev := unix.EpollEvent{Events: shimEpollEvents, Fd: sc.id}
	if err := unix.EpollCtl(q.epfd, unix.EPOLL_CTL_ADD, sc.c.fd, &ev); err != nil {
		q.tx.Detach(tx)
		q.rx.Detach(rx)
		return os.NewSyscallError("epoll_ctl", err)
	}
	q.byID[sc.id] = sc
	sc.txSock, sc.rxSock, sc.attached = tx, rx, true
	q.conns[sc] = struct{}{}
	return nil
}

// service moves the producer's work into SENDs and handles a requested half-close (loop only).
func (q *shimQueue) service(sc *shimConn) {
	if sc.finished || !sc.attached {
		return
	}
	if !sc.detached {
		q.takeWork(sc)
		q.prepSends(sc)
		q.maybeShutdownWrite(sc)
	}
	if sc.closing {
		q.advanceClose(sc)
	}
}

// takeWork moves pending producer requests to sc.pending; it clears busy when the connection
// has nothing left to send (see Conn.kickLocked).
func (q *shimQueue) takeWork(sc *shimConn) {
	c := sc.c
	c.wmu.Lock()
	if len(c.wpending) == 0 && sc.inflight == 0 && len(sc.pending) == 0 {
		c.flushStageLocked()
	}
	if len(c.wpending) == 0 {
		if sc.inflight == 0 && len(sc.pending) == 0 {
			c.busy = false
		}
		c.wmu.Unlock()
		return
	}
	for _, r := range c.wpending {
		sc.pending = append(sc.pending, shimReq{loan: r.loan, n: r.n})
	}
	clear(c.wpending)
	c.wpending = c.wpending[:0]
	c.wmu.Unlock()
}

// prepSends prepares SENDs for pending requests while there is room (loop only).
func (q *shimQueue) prepSends(sc *shimConn) {
	st := q.st
	for len(sc.pending) > 0 && sc.inflight < shimMaxInflight {
		if q.sendRes+2 > q.cqCap-shimCQSlack {
			q.block(sc)
			return
		}
		if q.tx.SQSpace() == 0 {
			q.submit()
			if q.tx.SQSpace() == 0 {
				q.block(sc)
				return
			}
		}
		r := &sc.pending[0]
		loan, n, owned := r.loan, r.n, false
		var key shim.RegionKey
		switch loan.Region() {
		case st.send:
			key = q.sendKey
		case st.recv:
			key = q.recvKey
		default:
			// A buffer from another engine's region: not registered here, copy it into ours.
			b, err := st.send.Get()
			if err != nil {
				q.block(sc)
				return
			}
			k := copy(b.Bytes(), loan.Data()[r.off:r.n])
			l, err := b.Lend()
			if err != nil {
				b.Release()
				q.block(sc)
				return
			}
			r.off += k
			loan, n, owned, key = l, k, true, q.sendKey
		}
		off := uint64(loan.Addr() - loan.Region().Base())
		ud := q.newOp(shimOp{kind: opSend, sc: sc, loan: loan, n: n, owned: owned})
		if err := q.tx.PrepSend(sc.txSock, key, off, uint32(n), ud); err != nil {
			q.freeOp(uint32(ud))
			if owned {
				r.off -= n
				loan.Return()
			}
			q.block(sc)
			return
		}
		q.sendRes += 2
		sc.inflight++
		sc.c.ctr.sendZCOps.Add(1)
		st.ctr.sendZCOps.Add(1)
		if !owned {
			sc.pending = sc.pending[1:]
		} else if r.off >= r.n {
			r.loan.Return() // copied out entirely
			sc.pending = sc.pending[1:]
		}
	}
	if len(sc.pending) == 0 {
		sc.pending = nil
	}
}

func (q *shimQueue) block(sc *shimConn) {
	if !sc.blocked {
		sc.blocked = true
		q.blocked = append(q.blocked, sc)
	}
}

func (q *shimQueue) onSend(idx uint32, cqe shim.Completion) {
	op := &q.ops[idx]
	sc, c := op.sc, op.sc.c
	st := q.st
	if cqe.Notif() {
		q.sendRes--
		sc.notifs--
		c.ctr.notifs.Add(-1)
		if cqe.Copied() {
			c.ctr.zcCopied.Add(uint64(op.sent))
			st.ctr.zcCopied.Add(uint64(op.sent))
		} else {
			c.ctr.sentZC.Add(uint64(op.sent))
			st.ctr.sentZC.Add(uint64(op.sent))
		}
		q.releaseSend(idx)
		if sc.closing {
			q.advanceClose(sc)
		} else if sc.inflight == 0 {
			// A buffer came back after the last send completed: a Writable sender that ran
			// out of buffers hears about it here.
			c.writable()
		}
		return
	}
	sc.inflight--
	q.sendRes--
	res := int(cqe.Res)
	if res > 0 {
		op.sent = res
	}
	c.sent(op.n) // the bytes left the queue (sent, or lost with the connection)
	if res < op.n && cqe.Res != -int32(unix.ECANCELED) && sc.sendFailed == nil {
		err := cqe.Err()
		if err == nil {
			err = io.ErrShortWrite
		}
		sc.sendFailed = c.opErr("write", err)
	}
	if cqe.More() {
		sc.notifs++
		c.ctr.notifs.Add(1)
	} else {
		q.sendRes-- // no notification follows: its slot is free as well
		q.releaseSend(idx)
	}
	if sc.sendFailed != nil && !sc.closing {
		c.wmu.Lock()
		if c.werr == nil || c.werr == ErrClosed {
			c.werr = sc.sendFailed
		}
		c.wmu.Unlock()
		q.beginClose(sc, sc.sendFailed)
		return
	}
	q.service(sc)
	if !sc.closing {
		c.writable()
	}
}

// releaseSend returns a SEND's buffer to its region (or, for a forwarded receive buffer, to
// the receive pool) and frees the op.
func (q *shimQueue) releaseSend(idx uint32) {
	q.ops[idx].loan.Return()
	q.freeOp(idx)
	select {
	case q.st.space <- struct{}{}:
	default:
	}
}

// armRecv keeps one RECV posted for the connection (loop only).
func (q *shimQueue) armRecv(sc *shimConn) {
	if !sc.ready || sc.recvOut || sc.eof || sc.paused || sc.closing || sc.detached || !sc.attached || sc.starved {
		return
	}
	if q.rx.SQSpace() == 0 {
		q.submit()
		if q.rx.SQSpace() == 0 {
			q.block(sc)
			return
		}
	}
	st := q.st
	bi, ok := st.takeFree()
	if !ok {
		sc.starved = true
		q.starved = append(q.starved, sc)
		return
	}
	n := q.recvLen()
	off := uint64(st.recv.Addr(bi) - st.recv.Base())
	ud := q.newOp(shimOp{kind: opRecv, sc: sc, n: bi})
	if err := q.rx.PrepRecv(sc.rxSock, q.rxKey, off, uint32(n), ud); err != nil {
		q.freeOp(uint32(ud))
		st.recycle(bi)
		q.block(sc)
		return
	}
	sc.recvOut = true
	sc.ready = false
	q.recvRes++
}

func (q *shimQueue) recvLen() int { return min(q.st.recv.BufSize(), int(shim.RecvMax)) }

func (q *shimQueue) onRecv(idx uint32, cqe shim.Completion) {
	op := q.ops[idx]
	q.freeOp(idx)
	sc, c, st := op.sc, op.sc.c, q.st
	sc.recvOut = false
	q.recvRes--
	switch res := int(cqe.Res); {
	case res > 0:
		b, err := st.recv.Received(op.n)
		if err != nil {
			break // cannot happen: the buffer was ours
		}
		c.ctr.recv.Add(uint64(res))
		st.ctr.recvRing.Add(uint64(res))
		if sc.closing {
			b.Release()
		} else {
			c.h.OnData(c, Data{buf: b, n: res})
		}
	case res == 0:
		st.recycle(op.n)
		if !sc.eof {
			sc.eof = true
			if !sc.closing {
				c.h.OnEOF(c, io.EOF)
			}
		}
	case cqe.Res == -int32(unix.ECANCELED):
		st.recycle(op.n)
	default:
		st.recycle(op.n)
		err := c.opErr("read", cqe.Err())
		if !sc.eof {
			sc.eof = true
			if !sc.closing {
				c.h.OnEOF(c, err)
			}
		}
		q.beginClose(sc, err)
	}
	if sc.closing {
		q.advanceClose(sc)
		return
	}
	if cqe.Res > 0 {
		// Even after a full buffer, ask epoll (level-triggered: it answers at once when
		// more is waiting): a RECV posted on a drained socket would hold its buffer until
		// the peer sends again, and enough of those starve every other connection.
		q.rearm(sc)
	}
}

func (q *shimQueue) maybeShutdownWrite(sc *shimConn) {
	if !sc.shutWant || sc.wrShut || sc.inflight > 0 || len(sc.pending) > 0 || sc.fdClosed {
		return
	}
	c := sc.c
	c.wmu.Lock()
	empty := len(c.wpending) == 0 && !c.hasStage
	c.wmu.Unlock()
	if empty {
		sc.wrShut = true
		unix.Shutdown(c.fd, unix.SHUT_WR)
	}
}

// beginClose starts closing (loop only): err == nil is a graceful local Close.
func (q *shimQueue) beginClose(sc *shimConn, err error) {
	c := sc.c
	if sc.finished {
		return
	}
	if sc.closing {
		if err != nil && sc.closeErr == nil {
			// An error while closing gracefully: stop waiting for the sends.
			sc.closeErr = err
			q.dropPending(sc)
			unix.Shutdown(c.fd, unix.SHUT_RDWR)
			q.advanceClose(sc)
		}
		return
	}
	sc.closing = true
	sc.closeErr = err
	sc.deadline = time.Now().Add(c.e.cfg.CloseTimeout)
	q.closing++
	c.closeReq.Store(true)
	c.wmu.Lock()
	if c.werr == nil || (err != nil && c.werr == ErrClosed) {
		c.werr = ErrClosed
		if err != nil {
			c.werr = err
		}
	}
	c.wmu.Unlock()
	if err != nil {
		q.dropPending(sc)
		if !sc.fdClosed {
			unix.Shutdown(c.fd, unix.SHUT_RDWR)
		}
	}
	q.service(sc)
	if sc.attached && !sc.finished {
		q.advanceClose(sc)
	}
}

// dropPending abandons every send not yet submitted (loop only).
func (q *shimQueue) dropPending(sc *shimConn) {
	c := sc.c
	for _, r := range sc.pending {
		c.sent(r.n - r.off)
		r.loan.Return()
	}
	sc.pending = nil
	c.dropProducer()
}

// advanceClose moves a closing connection on (loop only): queued sends go out first (bounded
// by CloseTimeout), then the socket is detached (the posted RECV completes with ECANCELED)
// and closed; the connection is finished when the module has given back every operation and
// every notification has come (or, for notifications, twice CloseTimeout passed: the buffers
// then stay lent until they come).
func (q *shimQueue) advanceClose(sc *shimConn) {
	if sc.finished || !sc.closing {
		return
	}
	c := sc.c
	now := time.Now()
	if !sc.detached {
		if !sc.blocked && sc.closeErr == nil {
			q.takeWork(sc)
			q.prepSends(sc)
		}
		c.wmu.Lock()
		producer := len(c.wpending) > 0 || c.hasStage
		c.wmu.Unlock()
		sending := sc.inflight > 0 || len(sc.pending) > 0 || producer
		if sending && now.Before(sc.deadline) {
			return
		}
		if sending {
			// Close timeout: the peer is not reading. Abort what is left.
			q.dropPending(sc)
			unix.Shutdown(c.fd, unix.SHUT_RDWR)
		}
		if sending || sc.closeErr != nil {
			// Reset rather than leave an orphan socket trying to deliver: the stack then
			// drops its write queue and the notifications (our buffers) come back now.
			unix.SetsockoptLinger(c.fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		}
		if sc.attached {
			q.tx.Detach(sc.txSock)
			q.rx.Detach(sc.rxSock)
		}
		sc.detached = true
		q.unwatch(sc)
		closeFD(c.fd)
		sc.fdClosed = true
	}
	if sc.recvOut || sc.inflight > 0 {
		return
	}
	if sc.notifs > 0 && (sc.deadline.IsZero() || now.Before(sc.deadline.Add(c.e.cfg.CloseTimeout))) && !q.isStopping() {
		return
	}
	q.finish(sc)
}

func (q *shimQueue) isStopping() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.stopping
}

// finish completes a close: OnClose, Done (loop only).
func (q *shimQueue) finish(sc *shimConn) {
	c := sc.c
	if !sc.detached {
		if sc.attached {
			q.tx.Detach(sc.txSock)
			q.rx.Detach(sc.rxSock)
		}
		sc.detached = true
	}
	if !sc.fdClosed {
		q.unwatch(sc)
		closeFD(c.fd)
		sc.fdClosed = true
	}
	q.dropPending(sc)
	sc.finished = true
	if sc.closing {
		q.closing--
	}
	delete(q.conns, sc)
	c.e.removeConn(c)
	c.h.OnClose(c, sc.closeErr)
	close(c.done)
}

// ---- dial and accept ----------------------------------------------------------------------

// start attaches c (already added to the engine) to a queue and runs ready on the loop once
// attached; it reports the attach error otherwise (the caller owns c.fd then).
// prepare gives a new connection its queue (before the engine can see it).
func (st *shimState) prepare(c *Conn) {
	c.alt = &shimConn{c: c, q: st.pickQueue()}
}

// start attaches a prepared connection on its queue's loop.
func (st *shimState) start(c *Conn, ready func(), failed func(error)) {
	sc := c.alt.(*shimConn)
	q := sc.q
	err := q.post(func() {
		if err := q.attach(sc); err != nil {
			failed(err)
			return
		}
		ready()
		q.armRecv(sc)
	})
	if err != nil {
		failed(err)
	}
}

func (st *shimState) dial(ctx context.Context, network string, ap netip.AddrPort, h Handler) (*Conn, error) {
	e := st.e
	c, err := e.dialBlocking(ctx, network, ap, h, st.prepare)
	if err != nil {
		return nil, err
	}
	fd := c.fd
	res := make(chan error, 1)
	st.start(c, func() { res <- nil }, func(err error) { res <- err })
	if err := <-res; err != nil {
		e.removeConn(c)
		closeFD(fd)
		return nil, c.opErr("dial", shimErr(err))
	}
	return c, nil
}

func (st *shimState) serve(l *Listener, s *tcpglue.Socket) {
	l.acceptBlocking(s, st.prepare, func(c *Conn) {
		fd := c.fd
		st.start(c, func() {
			l.accepted.Add(1)
			h := l.accept(c)
			if c.h == nil {
				c.h = h
			}
			if h == nil {
				c.h = HandlerFuncs{}
				sc := c.alt.(*shimConn)
				sc.q.beginClose(sc, nil)
			}
		}, func(error) {
			l.acceptErrs.Add(1)
			l.e.removeConn(c)
			closeFD(fd)
		})
	})
}

func (st *shimState) numQueues() int { return len(st.queues) }

func (sc *shimConn) queueIndex() int { return sc.q.idx }
