package loop

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
)

// ErrClosed is returned for work posted to a stopped queue.
var ErrClosed = fmt.Errorf("loop: queue closed: %w", errs.ErrClosed)

// ErrWouldBlock: a call made on the queue's own goroutine would wait for that goroutine.
var ErrWouldBlock = errors.New("loop: would block the queue's own goroutine")

// Config describes one queue.
type Config struct {
	ID    int
	CPU   int  // pin the queue's thread to this CPU (unless NoPin)
	NoPin bool // leave the thread free to run anywhere
	// BusyPoll, when positive, makes the loop poll (non-blocking waits) for up to this long
	// before it goes to sleep: lower latency for a CPU that spins.
	BusyPoll time.Duration
}

// Driver waits for a queue's events and dispatches them (Queue.Dispatch). All its methods
// run on the loop.
type Driver interface {
	// Wait submits prepared work and waits up to timeout (< 0: no limit, 0: do not block) for
	// events, dispatching those that arrived. It must return soon after the queue's eventfd
	// (Queue.WakeFD) becomes readable, and consume that readiness.
	Wait(timeout time.Duration) error
	// Close releases the driver's kernel objects. It runs after the last Wait.
	Close()
}

// Owner receives the events of the operations it registered with NewOp.
type Owner interface {
	OnEvent(q *Queue, ev Event)
}

// Event is one completion or readiness report.
type Event struct {
	UD    uint64 // the operation's id
	Tag   uint32 // the tag given to NewOp
	Res   int32  // result (io_uring: cqe.res; epoll: 0)
	Flags uint32 // io_uring: cqe.flags; epoll: the event mask
	Big   [2]uint64
}

// Flusher is called on the loop before it next waits, after Schedule or MarkDirty.
type Flusher interface {
	Flush(q *Queue)
}

type opSlot struct {
	gen   uint32
	tag   uint32
	owner Owner
}

// Reserved operation ids (generation 0 is never handed out).
const (
	UDIgnore uint64 = 0 // completions nobody waits for (cancel requests)
	UDWake   uint64 = 1 // the wake-up eventfd
)

// Stats are a queue's counters, safe to read from any goroutine.
type Stats struct {
	Waits     uint64 // driver waits (io_uring_enter / epoll_wait calls)
	Events    uint64 // events dispatched
	Wakeups   uint64 // eventfd writes by other goroutines to wake the queue
	Stray     uint64 // events for operations that no longer exist
	OpsLive   int64  // operations registered and not freed
	Overflows uint64 // completion-queue overflows the driver had to flush
	Spins     uint64 // non-blocking polls made while busy-polling
}

// Queue is one event loop.
type Queue struct {
	cfg Config
	drv Driver

	inbox    inbox
	bufs     idStack // PostBuffer's ids (sized by SizeBufferIDs), outside the inbox
	sleeping atomic.Int32
	efd      int
	tid      atomic.Int32

	dirty   []Flusher
	timers  timerHeap
	ops     []opSlot
	freeOps []uint32
	onBuf   func(arg int32) // buffer-return tasks (see PostBuffer)
	yield   atomic.Bool     // YieldSoon was called
	// lastYield is when the loop last called runtime.Gosched (nanos; loop only)
	lastYield int64
	// inCode: the loop may be running code other than its own (tasks, events, timers,
	// flushes); false while it waits or polls in the kernel. OnLoop asks the thread id only
	// when it is set: a goroutine that sees it clear cannot be the loop (the loop sets it
	// before it runs anything, and sees its own writes).
	inCode    atomic.Bool
	atStop    []func()
	afterStop []func()

	stopReq atomic.Bool
	done    chan struct{}
	closed  atomic.Bool
	runErr  error
	mu      sync.Mutex

	waits, events, wakeups, stray, overflows, spins atomic.Uint64
	opsLive                                         atomic.Int64
}

// Start starts a queue: its goroutine locks an OS thread (pinned unless NoPin), creates the
// driver there with init, and loops. It returns once the queue runs or init failed.
func Start(cfg Config, init func(q *Queue) (Driver, error)) (*Queue, error) {
	q := &Queue{cfg: cfg, efd: -1, done: make(chan struct{}), ops: make([]opSlot, 2, 64)}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC) // blocking: io_uring reads of an O_NONBLOCK file fail with EAGAIN
	if err != nil {
		return nil, os.NewSyscallError("eventfd", err)
	}
	q.efd = efd
	ready := make(chan error, 1)
	go q.run(init, ready)
	if err := <-ready; err != nil {
		<-q.done
		return nil, err
	}
	return q, nil
}

func (q *Queue) run(init func(q *Queue) (Driver, error), ready chan<- error) {
	defer close(q.done)
	// The thread stays locked until the goroutine exits; the runtime then retires it, taking
	// its io_uring task context with it.
	runtime.LockOSThread()
	q.tid.Store(int32(unix.Gettid()))
	q.inCode.Store(true)
	if !q.cfg.NoPin && q.cfg.CPU >= 0 {
		var set unix.CPUSet
		set.Set(q.cfg.CPU)
		unix.SchedSetaffinity(0, &set) // best effort: a cpuset may forbid it
	}
	drv, err := init(q)
	if err != nil {
		q.closed.Store(true)
		q.inbox.seal()
		q.bufs.seal()
		q.closeEventfd()
		ready <- err
		return
	}
	q.drv = drv
	ready <- nil
	q.loop()
	q.inCode.Store(true)
	// Stopping: work posted before the seal still runs (a successful Post always runs).
	for {
		t := q.inbox.seal()
		if t == nil {
			break
		}
		q.runTasks(t)
	}
	q.runBufs(q.bufs.seal())
	for _, f := range q.atStop {
		f()
	}
	q.drv.Close()
	for _, f := range q.afterStop {
		f()
	}
	q.closeEventfd()
}

func (q *Queue) loop() {
	for {
		q.inCode.Store(true)
		q.runTasks(q.inbox.takeAll())
		q.runBufs(q.bufs.take())
		q.runTimers()
		if q.stopReq.Load() {
			return
		}
		q.flush()
		timeout := q.nextTimeout()
		if timeout != 0 && (q.yield.Load() || q.schedDue()) {
			// A goroutine we readied sits in this thread's run queue: the thread is locked to
			// us and is about to block in the kernel (or to busy-poll, holding its P), where
			// the runtime would leave it waiting until sysmon notices (20 µs to 10 ms). Hand
			// it over now. Also every yieldEvery of a loop that never yields: see schedDue.
			q.yield.Store(false)
			q.lastYield = nanos()
			runtime.Gosched()
		}
		if timeout != 0 && q.cfg.BusyPoll > 0 && q.posted() == 0 && len(q.dirty) == 0 {
			busy, err := q.spin(timeout)
			if err != nil {
				q.runErr = err
				return
			}
			if busy {
				continue
			}
		}
		if q.posted() != 0 || len(q.dirty) > 0 {
			timeout = 0
		} else if timeout != 0 {
			q.sleeping.Store(1)
			if q.posted() != 0 || q.stopReq.Load() {
				timeout = 0
			}
		}
		q.inCode.Store(false) // Dispatch sets it again before an event reaches its owner
		err := q.drv.Wait(timeout)
		q.sleeping.Store(0)
		q.waits.Add(1)
		if err != nil {
			q.runErr = err
			return
		}
	}
}

// yieldEvery is how often a loop that is about to wait in the kernel lets the runtime
// reschedule its goroutine (runtime.Gosched) when nothing else made it yield: half of Go's
// 10 ms preemption slice.
//
// Go's monitor thread (sysmon) treats a goroutine that has not been rescheduled for 10 ms
// as a CPU hog: it signals the thread and, when the goroutine is in a system call, takes
// its P away; having "found work", sysmon then polls every 20 µs for 50 rounds or more
// before it backs off again. A queue's goroutine runs its loop on its locked thread and is
// rescheduled only when something makes it (a YieldSoon, a P taken from a long wait), so
// under steady traffic sysmon did all that every 10 ms, on the queue's CPU: CPU billed to
// the process (rusage) that no pprof profile shows, since sysmon has no profiling timer
// (doc/notes/issue-20-kv-gap.md). A Gosched on a locked thread costs a hand-over between
// two threads; at most 200 a second here.
const yieldEvery = 5 * time.Millisecond

// schedDue reports whether the loop has gone yieldEvery without yielding (loop only).
func (q *Queue) schedDue() bool { return nanos()-q.lastYield >= int64(yieldEvery) }

// nanos is a monotonic clock in nanoseconds.
func nanos() int64 { return int64(time.Since(clockBase)) }

var clockBase = time.Now()

// spin polls the driver without sleeping for up to BusyPoll (or the next timer); it reports
// whether something happened.
func (q *Queue) spin(timeout time.Duration) (bool, error) {
	until := time.Now().Add(q.cfg.BusyPoll)
	if timeout > 0 && timeout < q.cfg.BusyPoll {
		until = time.Now().Add(timeout)
	}
	for {
		before := q.events.Load()
		q.inCode.Store(false)
		err := q.drv.Wait(0)
		q.waits.Add(1)
		q.spins.Add(1)
		if err != nil {
			return false, err
		}
		if q.events.Load() != before || q.posted() != 0 || len(q.dirty) > 0 || q.stopReq.Load() {
			return true, nil
		}
		if !time.Now().Before(until) {
			return false, nil
		}
	}
}

// posted is nonzero when posted work (tasks or buffer returns) waits for the loop.
func (q *Queue) posted() int {
	if !q.inbox.empty() || !q.bufs.empty() {
		return 1
	}
	return 0
}

// runBufs hands the buffer ids of a chain taken from q.bufs to the buffer hook.
func (q *Queue) runBufs(h int64) {
	if h != 0 && q.onBuf != nil {
		q.bufs.each(h, q.onBuf)
	}
}

func (q *Queue) runTasks(t *task) {
	for t != nil {
		next := t.next
		switch {
		case t.fn != nil:
			t.fn()
		case t.f != nil:
			q.MarkDirty(t.f)
		case q.onBuf != nil:
			q.onBuf(t.arg)
		}
		*t = task{}
		taskPool.Put(t)
		t = next
	}
}

// flush runs the dirty flushers (loop only).
func (q *Queue) flush() {
	for len(q.dirty) > 0 {
		d := q.dirty
		q.dirty = nil
		for _, f := range d {
			f.Flush(q)
		}
		if q.dirty == nil {
			clear(d)
			q.dirty = d[:0]
		}
	}
}

// ID returns the queue's id.
func (q *Queue) ID() int { return q.cfg.ID }

// OnLoop reports whether the caller runs on the queue's goroutine (its thread is locked to
// it, so the thread id tells; while the loop waits in the kernel no caller can be it, and
// the answer costs no system call).
func (q *Queue) OnLoop() bool { return q.inCode.Load() && int32(unix.Gettid()) == q.tid.Load() }

// MayBeOnLoop is false when the caller certainly does not run on the queue's goroutine (the
// loop waits in the kernel); true means OnLoop must be asked.
func (q *Queue) MayBeOnLoop() bool { return q.inCode.Load() }

// TID returns the loop thread's id.
func (q *Queue) TID() int32 { return q.tid.Load() }

// WakeFD returns the eventfd a driver must watch (loop only).
func (q *Queue) WakeFD() int { return q.efd }

// MarkDirty asks the loop to call f.Flush before it next waits (loop only).
func (q *Queue) MarkDirty(f Flusher) { q.dirty = append(q.dirty, f) }

// YieldSoon makes the loop let other goroutines run (runtime.Gosched) before it next
// blocks: call it after waking a goroutine (a channel send) that should run now.
func (q *Queue) YieldSoon() {
	if !q.yield.Load() {
		q.yield.Store(true)
	}
}

// AtStop registers f to run on the loop when it stops, before the driver closes (loop only).
func (q *Queue) AtStop(f func()) { q.atStop = append(q.atStop, f) }

// AfterStop registers f to run on the loop's goroutine once the driver closed (its kernel
// objects are gone, so the kernel no longer reads memory its operations named), before
// Close returns (loop only).
func (q *Queue) AfterStop(f func()) { q.afterStop = append(q.afterStop, f) }

// Drain lets an AtStop function wait for operations it ended (cancels): it submits prepared
// work and dispatches events until done reports true or timeout passed (AtStop only; posted
// work and timers no longer run then). It returns whether done reported true.
func (q *Queue) Drain(timeout time.Duration, done func() bool) bool {
	end := time.Now().Add(timeout)
	for !done() {
		left := time.Until(end)
		if left <= 0 || q.runErr != nil {
			return false
		}
		q.flush()
		q.inCode.Store(false)
		err := q.drv.Wait(min(left, time.Millisecond))
		q.inCode.Store(true)
		if err != nil {
			return false
		}
	}
	return true
}

// Post runs fn on the queue's goroutine. It never blocks and wakes the queue only if it
// sleeps. After the queue stopped it returns ErrClosed; a Post that returned nil always runs.
func (q *Queue) Post(fn func()) error {
	t := taskPool.Get().(*task)
	t.fn = fn
	return q.push(t)
}

// Schedule asks the loop to call f.Flush, from any goroutine, without allocating.
func (q *Queue) Schedule(f Flusher) error {
	t := taskPool.Get().(*task)
	t.f = f
	return q.push(t)
}

// PostBuffer hands arg to the buffer-return hook (SetBufferHook) on the loop, without
// allocating and without waking a sleeping loop: a returned receive buffer is not urgent
// (the loop wakes for the next completion anyway, and a receive that finds the ring empty
// completes with ENOBUFS, which wakes it), and a wake-up is a syscall and a thread switch.
func (q *Queue) PostBuffer(arg int32) error {
	if q.bufs.fits(arg) {
		// The common case: an id below SizeBufferIDs, returned without a task.
		if !q.bufs.push(arg) {
			return ErrClosed
		}
		return nil
	}
	t := taskPool.Get().(*task)
	t.arg = arg
	if !q.inbox.push(t) {
		*t = task{}
		taskPool.Put(t)
		return ErrClosed
	}
	return nil
}

// Nudge wakes the loop if it sleeps (after a PostBuffer that someone waits for).
func (q *Queue) Nudge() {
	if q.sleeping.Load() == 1 && q.sleeping.CompareAndSwap(1, 0) {
		q.wake()
	}
}

// SetBufferHook sets what PostBuffer runs (before the queue starts taking work: in init).
func (q *Queue) SetBufferHook(fn func(arg int32)) { q.onBuf = fn }

// SizeBufferIDs makes PostBuffer of the ids 0..n-1 cheaper (no task, no allocation, no pool:
// an array of n links), before the queue starts taking work (in init; NewRecvRing does it
// for its buffer ids). Other args still go through the inbox.
func (q *Queue) SizeBufferIDs(n int) {
	if len(q.bufs.next) < n {
		q.bufs.init(n)
	}
}

func (q *Queue) push(t *task) error {
	if !q.inbox.push(t) {
		*t = task{}
		taskPool.Put(t)
		return ErrClosed
	}
	if q.sleeping.Load() == 1 && q.sleeping.CompareAndSwap(1, 0) {
		q.wake()
	}
	return nil
}

// wake writes the eventfd. The lock keeps it from being closed (and its number reused) under
// a waker that saw the loop asleep just before it exited.
func (q *Queue) wake() {
	var one = [8]byte{1}
	q.mu.Lock()
	if q.efd >= 0 {
		unix.Write(q.efd, one[:])
	}
	q.mu.Unlock()
	q.wakeups.Add(1)
}

func (q *Queue) closeEventfd() {
	q.mu.Lock()
	if q.efd >= 0 {
		unix.Close(q.efd)
		q.efd = -1
	}
	q.mu.Unlock()
}

// Do runs fn on the queue's goroutine and waits for its result. On the loop itself it runs
// fn at once.
func (q *Queue) Do(fn func() error) error {
	if q.OnLoop() {
		return fn()
	}
	ch := make(chan error, 1)
	if err := q.Post(func() { ch <- fn() }); err != nil {
		return err
	}
	return <-ch // a successful Post always runs
}

// NewOp registers an operation of owner o and returns its id (user_data) (loop only).
func (q *Queue) NewOp(o Owner, tag uint32) uint64 {
	var slot uint32
	if n := len(q.freeOps); n > 0 {
		slot = q.freeOps[n-1]
		q.freeOps = q.freeOps[:n-1]
	} else {
		slot = uint32(len(q.ops))
		q.ops = append(q.ops, opSlot{})
	}
	s := &q.ops[slot]
	s.gen++
	if s.gen == 0 {
		s.gen = 1
	}
	s.owner, s.tag = o, tag
	q.opsLive.Add(1)
	return uint64(s.gen)<<32 | uint64(slot)
}

// FreeOp unregisters an operation; events still arriving for it are counted as stray
// (loop only). Idempotent for a given id.
func (q *Queue) FreeOp(ud uint64) {
	slot, gen := uint32(ud), uint32(ud>>32)
	if gen == 0 || int(slot) >= len(q.ops) || q.ops[slot].gen != gen || q.ops[slot].owner == nil {
		return
	}
	q.ops[slot].owner = nil
	q.freeOps = append(q.freeOps, slot)
	q.opsLive.Add(-1)
}

// OpLive reports whether ud is a registered operation (loop only).
func (q *Queue) OpLive(ud uint64) bool {
	slot, gen := uint32(ud), uint32(ud>>32)
	return gen != 0 && int(slot) < len(q.ops) && q.ops[slot].gen == gen && q.ops[slot].owner != nil
}

// Dispatch hands an event to its operation's owner (drivers call it; loop only).
func (q *Queue) Dispatch(ev Event) {
	if !q.inCode.Load() {
		q.inCode.Store(true)
		// The loop is back from the kernel: work that handlers post from here on is taken by
		// its next round (runTasks) before it can wait again, so no eventfd write is needed
		// for it. Left set, every Post or Schedule of a handler run by this wait's
		// completions would write the eventfd (a system call, a completion and one more
		// io_uring_enter) to wake a loop that is not asleep.
		q.sleeping.Store(0)
	}
	q.events.Add(1)
	slot, gen := uint32(ev.UD), uint32(ev.UD>>32)
	if gen == 0 {
		return // UDIgnore, UDWake: handled by the driver
	}
	if int(slot) >= len(q.ops) || q.ops[slot].gen != gen || q.ops[slot].owner == nil {
		q.stray.Add(1)
		return
	}
	ev.Tag = q.ops[slot].tag
	q.ops[slot].owner.OnEvent(q, ev)
}

// NoteOverflow counts a completion-queue overflow flush (drivers).
func (q *Queue) NoteOverflow() { q.overflows.Add(1) }

// Stats returns the queue's counters.
func (q *Queue) Stats() Stats {
	return Stats{Waits: q.waits.Load(), Events: q.events.Load(), Wakeups: q.wakeups.Load(),
		Stray: q.stray.Load(), OpsLive: q.opsLive.Load(), Overflows: q.overflows.Load(), Spins: q.spins.Load()}
}

// Stopped is closed when the queue's loop has exited.
func (q *Queue) Stopped() <-chan struct{} { return q.done }

// Close stops the loop: posted work still runs, then the AtStop functions, then the driver
// closes. It waits for all of that unless called on the loop itself (then the loop stops
// after the current work and Close returns at once). Idempotent; later calls return
// ErrClosed.
func (q *Queue) Close() error {
	if !q.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	q.stopReq.Store(true)
	q.wake()
	if q.OnLoop() {
		return nil
	}
	<-q.done
	return q.runErr
}
