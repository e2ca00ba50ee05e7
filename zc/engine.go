package zc

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/memregops"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
)

// Engine owns queues, listeners and connections.
type Engine struct {
	cfg      Config
	backend  Backend
	fallback error // why the engine fell back to another backend (nil when it did not)
	queues   []*queue
	rr       atomic.Uint32

	mu        sync.Mutex
	listeners map[*Listener]struct{}
	closed    atomic.Bool
	done      chan struct{}
	closeErr  error

	steerFallbacks atomic.Uint64
	memlockShort   atomic.Bool   // SendPoolMax × Queues exceeds RLIMIT_MEMLOCK (checkMemlock)
	callbackPanics atomic.Uint64 // OnLimit or Debug.OnMisuse panicked (counted in HandlerPanics)
	shareCtr       shareCounters // shared sends and SendData copies (shared.go)

	addedProcs int           // GOMAXPROCS Ps added by New (Config.AddProcs), taken back by Close
	dbg        debugHooks    // Config.Debug (nil: no checks)
	stopWatch  chan struct{} // ends watchStalls
	stalls     atomic.Uint64 // Stats.Loop.Stalls
	parts      []enginePart  // the features' state on the engine: TLS, steering (hooks.go)
}

// procsMu serializes the engines' GOMAXPROCS adjustments (Config.AddProcs): each adds or
// takes back its own count relative to the current value.
var procsMu sync.Mutex

func adjustProcs(delta int) {
	procsMu.Lock()
	runtime.GOMAXPROCS(max(1, runtime.GOMAXPROCS(0)+delta))
	procsMu.Unlock()
}

// allowedCPUs lists the CPUs this process may run on, so queue i is pinned to the i-th of
// them: the affinity mask the process started with (a container or taskset may have
// narrowed it). It is read once, during package initialization, on the main thread: later,
// the thread New happens to run on may carry another goroutine's pinning (a goroutine that
// locked its thread, pinned it and unlocked it leaves the mask behind), which would put
// every queue on one CPU. A CPU taken away later makes pinning fail, which the steering
// report shows (ListenerStats.Steering.QueueCPUs).
func allowedCPUs() []int { return slices.Clone(startCPUs) }

var startCPUs = loop.ThreadCPUs()

// New creates an engine: its queues, each on its own locked OS thread. A bad Config is
// refused with a *ConfigError (matching ErrInvalid); a backend that cannot start falls back
// (io_uring → zcshim → plain sockets) unless NoFallback or a specific Backend is asked for.
func New(cfg Config) (*Engine, error) {
	e, err := startEngine(cfg)
	if err == nil && e.cfg.AddProcs {
		e.addedProcs = e.cfg.Queues
		adjustProcs(e.addedProcs)
	}
	if err == nil {
		e.checkMemlock()
		if e.dbg != nil {
			e.dbg.start()
		}
		e.stopWatch = make(chan struct{})
		go e.watchStalls(stallTick)
	}
	return e, err
}

// checkMemlock reports (Config.OnLimit, Stats.MemlockLimit) when the send pools' caps
// together do not fit under RLIMIT_MEMLOCK: the pools will stop growing there and senders
// wait, as at SendPoolMax.
func (e *Engine) checkMemlock() {
	if e.backend == BackendPlain {
		return // plain sockets register nothing
	}
	limit, ok := memregops.MemlockLimit()
	if !ok {
		return
	}
	want := uint64(e.cfg.SendPoolMax) * uint64(len(e.queues))
	if want <= limit {
		return
	}
	e.memlockShort.Store(true)
	e.reportLimit(&LimitError{What: "send pool", Queue: -1, Have: int(min(limit, 1<<62)), Want: int(min(want, 1<<62)),
		Err: memreg.NewMemlockError(int(min(want, 1<<62)), unix.ENOMEM)})
}

// reportLimit hands err to Config.OnLimit, which must not take the engine down.
func (e *Engine) reportLimit(err error) {
	if e.cfg.OnLimit == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			e.callbackPanics.Add(1)
		}
	}()
	e.cfg.OnLimit(err)
}

func startEngine(cfg Config) (*Engine, error) {
	if err := cfg.normalize(); err != nil {
		return nil, &OpError{Op: "new", Err: err}
	}
	e := &Engine{cfg: cfg, listeners: map[*Listener]struct{}{}, done: make(chan struct{})}
	e.makeParts()
	if newDebugHooks != nil {
		e.dbg = newDebugHooks(e, cfg.Debug)
	}
	switch cfg.Backend {
	case BackendPlain, BackendShim:
		if err := e.startQueues(cfg.Backend); err != nil {
			return nil, &OpError{Op: "new", Err: err}
		}
		if err := features.backendCheck(e); err != nil {
			e.stopQueues()
			return nil, &OpError{Op: "new", Err: err}
		}
		return e, nil
	}
	err := e.startQueues(BackendIOUring)
	if err == nil {
		return e, nil
	}
	if fr := (*featureRefused)(nil); errors.As(err, &fr) {
		return nil, &OpError{Op: "new", Err: err} // io_uring works; a feature does not
	}
	if cfg.Backend == BackendIOUring || cfg.NoFallback {
		return nil, &OpError{Op: "new", Err: fmt.Errorf("io_uring backend unavailable (fallback forbidden): %w", err)}
	}
	// Fall back: the kernel-queue shim when its module is loaded, else plain sockets.
	reason := err
	started := false
	if shimAvailable() == nil {
		if serr := e.startQueues(BackendShim); serr == nil {
			started = true
		} else {
			reason = fmt.Errorf("%w; zcshim: %v", err, serr)
		}
	}
	if !started {
		if perr := e.startQueues(BackendPlain); perr != nil {
			return nil, &OpError{Op: "new", Err: fmt.Errorf("%v; plain: %w", reason, perr)}
		}
	}
	e.fallback = reason
	if cfg.OnFallback != nil {
		cfg.OnFallback(reason)
	}
	return e, nil
}

func (e *Engine) startQueues(b Backend) error {
	var caps *uring.Capabilities
	if b == BackendIOUring {
		// Probe again: io_uring may have been enabled (or blocked) since the last engine.
		caps = uring.Reprobe()
		if caps.Err != nil {
			return caps.Err
		}
		if err := caps.NeedOp(uring.OpSendZC, "SEND_ZC", "6.0"); err != nil && e.cfg.SendPath == SendZeroCopy {
			return err
		}
	}
	if b == BackendShim {
		if err := shimAvailable(); err != nil {
			return err
		}
	}
	cpus := allowedCPUs()
	for i := 0; i < e.cfg.Queues; i++ {
		q := &queue{e: e, idx: i, cpu: cpus[i%len(cpus)], space: make(chan struct{}, 1)}
		q.makeParts()
		lq, err := loop.Start(loop.Config{ID: i, CPU: q.cpu, NoPin: e.cfg.NoPin, BusyPoll: e.cfg.BusyPoll}, func(lq *loop.Queue) (loop.Driver, error) {
			q.Queue = lq
			lq.AtStop(q.abortAll)
			lq.AfterStop(q.appAfterStop)
			drv, be, err := newBackend(b, caps)((*beQueue)(q))
			if err != nil {
				return nil, err
			}
			q.setBackend(be)
			return drv, nil
		})
		if err != nil {
			e.stopQueues()
			e.queues = nil // New is still single-threaded: the next backend starts afresh
			return err
		}
		q.Queue = lq
		e.queues = append(e.queues, q)
	}
	e.backend = b
	return nil
}

func (e *Engine) stopQueues() error {
	var first error
	for _, q := range e.queues {
		if err := q.Close(); err != nil && first == nil {
			first = err
		}
	}
	for _, q := range e.queues {
		q.be.close()
	}
	// e.queues stays: other goroutines read it without a lock (Dial, Stats, onAnyLoop) and a
	// closed queue refuses work by itself.
	return first
}

// Config returns the engine's configuration with defaults filled in; its Backend is the
// backend in use (where New fell back, Stats().Fallback says why).
func (e *Engine) Config() Config {
	cfg := e.cfg
	cfg.Backend = e.backend
	return cfg
}

func (e *Engine) pickQueue() *queue {
	return e.queues[int(e.rr.Add(1)-1)%len(e.queues)]
}

// onAnyLoop reports whether the caller runs on one of the engine's queue goroutines.
func (e *Engine) onAnyLoop() bool {
	maybe := false
	for _, q := range e.queues {
		if q.MayBeOnLoop() {
			maybe = true
			break
		}
	}
	if !maybe {
		return false // every queue waits in the kernel: no system call needed to know
	}
	tid := loop.CurrentTID()
	for _, q := range e.queues {
		if q.TID() == tid {
			return true
		}
	}
	return false
}

// checkOwn accepts memory from this engine's pools only.
func (e *Engine) checkOwn(r *memreg.Region) error {
	if r == nil || r.Pool() == nil || r.Pool().Tag() != e {
		return ErrForeignBuffer
	}
	return nil
}

// Close closes listeners and connections (letting queued sends go out and zero-copy
// notifications arrive, bounded by CloseTimeout), then the queues. Memory the application
// still holds (a Buf, a Data) stays valid until released. It is idempotent; later calls
// return an error wrapping ErrClosed. Called from a handler (a queue goroutine) it cannot
// wait for its own queue: it starts the close in the background and returns nil (Done
// tells when it finished). Close waits at most about 2 × CloseTimeout, whether or not the
// peers still answer (a connection's own Close waits on a slow peer as long as it answers);
// CloseContext bounds the wait by a context instead. When a connection's peer did not take
// its queued bytes within CloseTimeout, the connection is reset, its OnClose gets a
// *CloseTimeoutError (Unsent: what the peer did not acknowledge), and Close returns an
// error matching ErrCloseTimeout: never nil when a connection lost bytes it had accepted.
func (e *Engine) Close() error { return e.CloseContext(context.Background()) }

// CloseContext is Close bounded by ctx as well: when ctx ends before the connections
// finished closing gracefully, the rest are reset (queued sends dropped) and the queues
// stop at once (a queue waits at most 50 ms more for the sends it cancelled to say what the
// kernel took of them, so those bytes are not counted as dropped); it then returns an error
// wrapping ctx's error. Buffers the application holds stay valid, as with Close.
func (e *Engine) CloseContext(ctx context.Context) error {
	if ctx == nil {
		return &OpError{Op: "close", Err: fmt.Errorf("nil context: %w", ErrInvalid)}
	}
	if !e.closed.CompareAndSwap(false, true) {
		return &OpError{Op: "close", Err: ErrClosed}
	}
	if e.onAnyLoop() {
		go e.shutdown(ctx)
		return nil
	}
	e.shutdown(ctx)
	return e.closeErr
}

// Done is closed when Close has finished.
func (e *Engine) Done() <-chan struct{} { return e.done }

func (e *Engine) shutdown(ctx context.Context) {
	defer close(e.done)
	if e.stopWatch != nil {
		close(e.stopWatch)
	}
	e.mu.Lock()
	ls := make([]*Listener, 0, len(e.listeners))
	for l := range e.listeners {
		ls = append(ls, l)
	}
	e.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, p := range e.parts {
		p.closeStart()
	}
	timeouts := func() (n uint64) {
		for _, q := range e.queues {
			n += q.ctr.closeTimeouts.Load()
		}
		return n
	}
	before := timeouts()
	for _, q := range e.queues {
		q.Post(q.closeAll)
	}
	deadline := time.Now().Add(2*e.cfg.CloseTimeout + time.Second)
	var cut error
wait:
	for _, q := range e.queues {
		for q.nconns.Load() > 0 && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				cut = ctx.Err() // the queues' stop resets what is left (abortAll)
				break wait
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
	e.closeErr = e.stopQueues()
	for _, p := range e.parts {
		p.closeEnd()
	}
	if cut != nil && e.closeErr == nil {
		e.closeErr = &OpError{Op: "close", Err: fmt.Errorf("connections reset before they finished closing: %w", cut)}
	}
	if n := timeouts() - before; n > 0 && e.closeErr == nil {
		// Their OnClose said so too (a *CloseTimeoutError each).
		e.closeErr = &OpError{Op: "close", Err: fmt.Errorf("%d connections reset after CloseTimeout with queued bytes unsent: %w", n, ErrCloseTimeout)}
	}
	if e.addedProcs > 0 {
		adjustProcs(-e.addedProcs) // the queues no longer hold Ps
	}
	if e.dbg != nil {
		e.dbg.close()
	}
}

// Stats are engine-wide counters, by concern: Send, Recv, Forward, Memory, Loop, Faults,
// Debug, Steering (one type: what each group holds is documented where it is declared).
type Stats struct {
	Backend  string
	Fallback string // why the engine fell back to another backend; "" when it did not
	Queues   int
	Conns    int
	// AddedProcs: the GOMAXPROCS Ps New added for the queues (Config.AddProcs); Close takes
	// them back.
	AddedProcs int

	// Send: every byte sent, by the path it took, and the send operations.
	Send struct {
		BytesZC       uint64 // sent with SEND_ZC (or the shim's zero-copy send), not copied by the kernel
		BytesZCCopied uint64 // sent zero-copy, but the kernel reported it copied them
		BytesCopy     uint64 // sent by copying sends (io_uring SEND/SENDMSG, writev)
		// BytesSpliced: sent by ReadFrom (Conn's, which the net.Conn face's is) with
		// sendfile(2) or splice(2), never through user memory.
		BytesSpliced uint64
		Ops          uint64 // copying send operations (one may carry many buffers)
		ZCOps        uint64 // zero-copy send operations
		// DirectWrites: Writes made with write(2) by the writing goroutine itself because nothing
		// was queued (no hand-off to the queue; or, on a queue goroutine, no free buffer to stage
		// in); the bytes count in BytesCopy.
		DirectWrites uint64
		ZCSwitches   uint64 // times an adaptive connection switched to copying sends
		ZCProbes     uint64 // times an adaptive connection tried zero-copy again
		// ZCSmallWindow: times an adaptive connection sent by copy instead of trying zero-copy
		// because the peer's receive window cuts its segments below a page (see SendAdaptive).
		ZCSmallWindow uint64
		// NotifsPending: zero-copy notifications outstanding (never negative; Close waits for
		// them). NotifsUnexpected: notifications for no known send (0 expected).
		NotifsPending    int64
		NotifsUnexpected uint64
		// PoolWaits counts the times a connection was refused a send buffer (Buffer, Write or
		// BufferWait on a queue goroutine found the pool empty) and queued for one: each is owed
		// an OnWritable when a buffer is free for it (or OnClose).
		PoolWaits uint64
		// BytesFile: sent by Conn.SendFile with sendfile(2) from the page cache, in FileOps
		// system calls.
		BytesFile, FileOps uint64
		// Shared sends (Shared.Send, SendData of a retained Data): SharedSends sends of a buffer
		// others may send too, BytesShared their bytes (no copy made for them). BytesDataCopied:
		// bytes SendData copied into send buffers because their memory cannot be lent to a send
		// (mapped Data; zcrx Data on the shim backend).
		SharedSends     uint64
		BytesShared     uint64
		BytesDataCopied uint64
		// BytesZcrxSent: zcrx Data that SendData sent from the zcrx area itself (no copy into
		// send buffers: the area's buffer is held until the send is done).
		BytesZcrxSent uint64
		// BytesApp: sent from the application's own memory by Conn.SendBytes (also counted
		// in BytesZC, BytesZCCopied or BytesCopy by how they left). BytesAppCopied: the part
		// copied into send buffers first: by the zcshim backend, all of it (it sends only from
		// memory registered with the module); elsewhere small slices given without a callback,
		// copied behind the bytes Write staged (see SendBytes).
		BytesApp, BytesAppCopied uint64
	}

	// TLS: the engine's TLS connections (ListenOptions.TLS, DialOptions.TLS) by the path
	// their records took, and the kernel path's work on the queues.
	TLS struct {
		Kernel          uint64 // handshakes that moved the records into the kernel
		User            uint64 // handshakes that stayed in crypto/tls (the connection's TLS info says why)
		Refused         uint64 // connections refused because kernel TLS could not serve them (NoFallback)
		HandshakeErrors uint64 // handshakes that failed (the peer, a timeout, the engine's close)
		ControlRecords  uint64 // non-data records (alerts, KeyUpdates, tickets) the queues read on the kernel path
		KeyUpdates      uint64 // KeyUpdates received and applied in the kernel
		KeyUpdatesSent  uint64 // KeyUpdates sent because the peer asked (then new TX keys)
		TxRekeys        uint64 // TX key updates (a KeyUpdate, then new TX keys): those the peer asked for and those at TLSOptions.RekeyRecords' bound
		CloseNotifies   uint64 // close_notify alerts the kernel path sent on Close and CloseWrite
		// KernelCounters are the kernel's own TLS counters (/proc/net/tls_stat of the
		// calling thread's network namespace: TlsCurrTxSw, TlsTxSw, TlsRxSw,
		// TlsDecryptError, TlsRxRekeyOk, ...), read by Stats once this engine has moved a
		// connection's records into the kernel (nil before, and where the kernel has no TLS).
		KernelCounters map[string]uint64
	}

	// Recv: every byte received, by the path it took, and what receiving waited for.
	Recv struct {
		BytesRing  uint64 // received through the provided-buffer ring
		BytesPlain uint64 // received with read(2) (plain backend)
		BytesShim  uint64 // received through the zcshim module
		// BytesDirect: read by Conn.Read on ReadSelf connections, with read(2) on the reading
		// goroutine (the net.Conn face's default, zc/netconn; its Options.Ring turns it off).
		BytesDirect uint64
		// BytesMapped / BytesMappedCopied: received through the mapped window (RecvMapped), as
		// mapped pages / copied because they could not be mapped.
		BytesMapped       uint64
		BytesMappedCopied uint64
		MappedFallbacks   uint64 // connections that wanted RecvMapped and use the ring
		// BytesZcrx: received through zcrx (RecvZcrx), of which BytesZcrxCopied the kernel copied
		// into the area (all of it on a device-less instance: no NIC delivers there). ZcrxQueues
		// counts the queues with a device-less instance, ZcrxAreaStalls the times a connection
		// waited because handlers held the whole area. ZcrxFallbacks counts the connections
		// that wanted RecvZcrx and receive through the ring, ZcrxFallback says why.
		BytesZcrx       uint64
		BytesZcrxCopied uint64
		ZcrxQueues      int
		ZcrxAreaStalls  uint64
		ZcrxFallbacks   uint64
		ZcrxFallback    string
		BufRingEmpty    uint64 // receives that found no receive buffer (the pool at its cap)
		BundleMismatch  uint64
		CreditPauses    uint64 // times a connection stopped receiving at MaxRecvHeld
	}

	// Forward: Relay's splice path (socket -> pipe -> socket, never through user memory).
	Forward struct {
		// BytesSpliced: forwarded by Relay's splice path (RelaySplice). SpliceRelays counts
		// relays that took that path, Fallbacks relays that RelayAuto sent through SendData
		// instead (RelayStats.Fallback says why), Errors splice relays ended by a failed system
		// call (a reset).
		BytesSpliced                    uint64
		SpliceRelays, Fallbacks, Errors uint64
		// SpliceCalls counts the splice relays' splice(2) calls (EAGAIN included), Waits their
		// waits for readiness: bytes per call is what a splice relay's CPU goes to.
		SpliceCalls, Waits uint64
		// PipesOpen is the pipes the splice relays hold or keep for reuse; PipeSizeRefused
		// counts pipes the kernel left at its default size (RelayOptions.PipeSize above the
		// limit).
		PipesOpen, PipeSizeRefused uint64
	}

	// Memory: what the pools have mapped (send pools are registered with the kernel:
	// pinned) and their caps; how often they grew and failed to.
	Memory struct {
		SendPoolBytes    uint64
		SendPoolMax      uint64
		RecvPoolBytes    uint64
		RecvPoolMax      uint64
		PoolGrows        uint64
		PoolGrowFailures uint64
		PoolGrowError    string // the last growth failure
		// MemlockCaps counts the send pools whose growth RLIMIT_MEMLOCK refused (they stay at
		// their size and senders wait); MemlockShort says the caps of all queues together do
		// not fit under the limit (Config.OnLimit was told at New).
		MemlockCaps  uint64
		MemlockShort bool
	}

	// Loop: the queues' event loops.
	Loop struct {
		Waits       uint64 // io_uring_enter / epoll_wait calls
		BusyPolls   uint64 // non-blocking polls made while busy-polling (Config.BusyPoll)
		Events      uint64 // completions and readiness events handled
		Wakeups     uint64 // cross-goroutine wake-ups of sleeping queues
		CQOverflows uint64
		StrayEvents uint64 // events for operations already gone (a bug if it grows without closes)
		// Stalls counts the times a queue was found running one piece of code (a handler, a
		// posted function) for over 250 ms without returning to its loop: every other
		// connection of the queue waited meanwhile. Handlers must not block.
		Stalls uint64
	}

	// Faults: failures the engine handled.
	Faults struct {
		CloseTimeouts  uint64 // graceful closes that reset the connection after CloseTimeout
		HandlerPanics  uint64 // handler methods that panicked (their connections were closed), and OnLimit/OnMisuse callbacks
		AcceptErrors   uint64
		AcceptBackoffs uint64 // accept paused because the process ran out of descriptors
	}

	// Debug: Config.Debug's findings (each also reported to DebugOptions.OnMisuse): buffers
	// written after Send or after Release, handler calls over SlowHandler, Data held over
	// HeldData.
	Debug struct {
		Misuses          uint64
		SlowHandlerCalls uint64
		DataHeldLong     uint64
	}

	// Steering: BPF steering and its fallbacks.
	Steering struct {
		// Fallbacks counts listeners that wanted BPF steering (SteerAuto) and fell back to plain
		// SO_REUSEPORT hashing (the reason: Listener.Stats().Steering.Fallback).
		Fallbacks uint64
		// CPU counts listeners whose BPF steering places connections by CPU locality (PolicyCPU,
		// the CPU→queue map filled from the queues' placement).
		CPU uint64
		// PolicyFallbacks counts multi-queue listeners with BPF steering whose default policy
		// (PolicyAuto) is the hash because the CPU policy could not be exact (NoPin, more queues
		// than CPUs, pinning refused); Listener.Stats().Steering says why.
		PolicyFallbacks uint64
		// AttachFallbacks counts ListenOptions.SteerInterfaces entries that SteerAuto left
		// incomplete (XDP or tc not attached, XDP without redirect, XPS overriding tc).
		AttachFallbacks uint64
	}
}

func (s *Stats) addCounters(c *counters) {
	s.Send.BytesZC += c.sentZC.Load()
	s.Send.BytesZCCopied += c.zcCopied.Load()
	s.Send.BytesCopy += c.sentCopy.Load()
	s.Send.BytesSpliced += c.sentSpliced.Load()
	s.Forward.BytesSpliced += c.relaySpliced.Load()
	s.Forward.SpliceRelays += c.relaysSplice.Load()
	s.Forward.Fallbacks += c.relayFallbacks.Load()
	s.Forward.Errors += c.relayErrors.Load()
	s.Forward.SpliceCalls += c.relaySpliceCalls.Load()
	s.Forward.Waits += c.relayWaits.Load()
	s.Forward.PipesOpen += uint64(max(c.pipesOpen.Load(), 0))
	s.Forward.PipeSizeRefused += c.pipeSizeRefused.Load()
	s.Send.BytesFile += c.fileSent.Load()
	s.Send.FileOps += c.fileSendOps.Load()
	s.Recv.BytesRing += c.RecvRing.Load()
	s.Recv.BytesPlain += c.RecvPlain.Load()
	s.Recv.BytesShim += c.RecvShim.Load()
	s.Recv.BytesDirect += c.recvDirect.Load()
	s.Recv.BytesMapped += c.recvMapped.Load()
	s.Recv.BytesMappedCopied += c.recvMappedCopied.Load()
	s.Recv.MappedFallbacks += c.mappedFallbacks.Load()
	s.Send.Ops += c.SendOps.Load()
	s.Send.DirectWrites += c.directWrites.Load()
	s.Send.ZCOps += c.SendZCOps.Load()
	s.Send.ZCSwitches += c.zcSwitches.Load()
	s.Send.ZCProbes += c.ZCProbes.Load()
	s.Send.ZCSmallWindow += c.ZCSmallWindow.Load()
	s.Recv.BufRingEmpty += c.BufEmpty.Load()
	s.Recv.CreditPauses += c.creditPauses.Load()
	s.Faults.CloseTimeouts += c.closeTimeouts.Load()
	s.Faults.HandlerPanics += c.handlerPanics.Load()
	s.Send.NotifsUnexpected += c.notifsUnexpected.Load()
	s.Faults.AcceptErrors += c.acceptErrs.Load()
	s.Faults.AcceptBackoffs += c.acceptBackoffs.Load()
	s.Memory.PoolGrows += c.PoolGrows.Load()
	s.Memory.PoolGrowFailures += c.sendPoolGrowFails.Load()
	s.Send.PoolWaits += c.poolWaits.Load()
	s.Memory.MemlockCaps += c.memlockCaps.Load()
}

// Stats returns engine-wide counters.
func (e *Engine) Stats() Stats {
	s := Stats{Backend: e.backend.String(), Queues: len(e.queues), AddedProcs: e.addedProcs}
	s.Steering.Fallbacks = e.steerFallbacks.Load()
	s.Memory.MemlockShort = e.memlockShort.Load()
	s.Loop.Stalls = e.stalls.Load()
	s.Faults.HandlerPanics += e.callbackPanics.Load()
	if e.dbg != nil {
		e.dbg.stats(&s)
	}
	if e.fallback != nil {
		s.Fallback = e.fallback.Error()
	}
	for _, p := range e.parts {
		p.stats(&s) // steering, TLS
	}
	e.shareCtr.fill(&s)
	for _, q := range e.queues {
		s.Conns += int(q.nconns.Load())
		s.addCounters(&q.ctr)
		for _, p := range q.parts {
			p.stats(&s) // zcrx
		}
		ls := q.Queue.Stats()
		s.Loop.Waits += ls.Waits
		s.Loop.BusyPolls += ls.Spins
		s.Loop.Events += ls.Events
		s.Loop.Wakeups += ls.Wakeups
		s.Loop.CQOverflows += ls.Overflows
		s.Loop.StrayEvents += ls.Stray
		s.Send.NotifsPending += q.notifsPending.Load()
		s.Memory.SendPoolBytes += uint64(q.send.Bytes())
		s.Memory.SendPoolMax += uint64(q.send.MaxBytes())
		if p := q.be.recvPool(); p != nil {
			s.Memory.RecvPoolBytes += uint64(p.Bytes())
			s.Memory.RecvPoolMax += uint64(p.MaxBytes())
		}
		if ge := q.growErr.Load(); ge != nil {
			s.Memory.PoolGrowError = (*ge).Error()
		}
		if rs := q.caps.stats; rs != nil {
			r := rs.ringStats()
			s.Recv.BufRingEmpty += uint64(r.Empty)
			s.Recv.BundleMismatch += uint64(r.Mismatch)
			s.Memory.PoolGrows += uint64(r.Grows)
			s.Memory.PoolGrowFailures += uint64(r.GrowFails)
			if r.LastError != nil {
				s.Memory.PoolGrowError = r.LastError.Error()
			}
		}
	}
	return s
}

// stallTick is how often watchStalls looks at the queues.
const stallTick = 250 * time.Millisecond

// watchStalls counts queues stuck in one piece of code (Stats.Loop.Stalls): a queue that
// runs code (not waiting in the kernel) and made no progress (no event dispatched, no wait)
// between two looks. One stall is counted once however long it lasts. It costs a look per
// queue every tick.
func (e *Engine) watchStalls(tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	last := make([]uint64, len(e.queues))
	stuck := make([]bool, len(e.queues))
	for {
		select {
		case <-e.stopWatch:
			return
		case <-t.C:
		}
		for i, q := range e.queues {
			st := q.Queue.Stats()
			progress := st.Events + st.Waits + st.Spins
			if q.MayBeOnLoop() && progress == last[i] {
				if !stuck[i] {
					stuck[i] = true
					e.stalls.Add(1)
				}
			} else {
				stuck[i] = false
			}
			last[i] = progress
		}
	}
}

// featureRefused is New's (or Listen's) error when the backend works but a feature Config
// asks for cannot be set up on it and Config.NoFallback forbids doing without it (RecvZcrx:
// zcrx.go's zcrxUnavailable): New fails rather than falling back to another backend.
type featureRefused struct{ err error }

func (f *featureRefused) Error() string { return f.err.Error() }
func (f *featureRefused) Unwrap() error { return f.err }

// shareCounters are the engine's counters of sends from memory other than a connection's
// own send buffers (Stats.Send): shared buffers (SendData counts them, shared.go the rest),
// SendData's copies, zcrx areas (zcrx.go) and the application's memory (sendbytes.go).
type shareCounters struct {
	sends, bytes, dataCopied, zcrxSent atomic.Uint64
	appSent, appCopied                 atomic.Uint64 // SendBytes (sendbytes.go)
	appHeld                            atomic.Int64  // SendBytes' slices pinned and not handed back
}

func (c *shareCounters) fill(s *Stats) {
	s.Send.SharedSends, s.Send.BytesShared = c.sends.Load(), c.bytes.Load()
	s.Send.BytesDataCopied = c.dataCopied.Load()
	s.Send.BytesZcrxSent = c.zcrxSent.Load()
	s.Send.BytesApp, s.Send.BytesAppCopied = c.appSent.Load(), c.appCopied.Load()
}

// poolOptions adds what Config.Debug's checks need to a pool's options (send: a send pool).
func (e *Engine) poolOptions(o memreg.PoolOptions, send bool) memreg.PoolOptions {
	if e.dbg != nil {
		return e.dbg.poolOptions(o, send)
	}
	return o
}
