package zc

import (
	"fmt"
	"runtime"
	"time"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/tcpglue"
)

// SendPath selects how sends are made.
type SendPath int

const (
	// SendAdaptive uses SEND_ZC for sends of at least ZCThreshold bytes until the kernel
	// reports it copied them anyway, then copying sends, probing zero-copy again now and then.
	// It does not try zero-copy while the peer's receive window cuts the connection's
	// segments below a page (TCP_INFO's send MSS under 4 KiB where the path MTU allows more):
	// over loopback such segments shrink the peer's window for good, down to one small
	// segment per persist timer (Stats.Send.ZCSmallWindow counts these refusals).
	SendAdaptive SendPath = iota
	// SendCopy forces copying sends.
	SendCopy
	// SendZeroCopy forces SEND_ZC for every send, whatever its size, whatever the kernel
	// reports and whatever the peer's window (to a loopback peer with a receive buffer of a
	// few KiB it crawls at a few KiB/s: see SendAdaptive).
	SendZeroCopy
)

func (p SendPath) String() string {
	switch p {
	case SendAdaptive:
		return "adaptive"
	case SendCopy:
		return "copy"
	case SendZeroCopy:
		return "zerocopy"
	}
	return fmt.Sprintf("SendPath(%d)", int(p))
}

// RecvPath selects the receive path.
type RecvPath int

const (
	// RecvRing: multishot recv into a provided-buffer ring (one copy, into registered memory).
	RecvRing RecvPath = iota
	// RecvMapped: TCP_ZEROCOPY_RECEIVE maps the socket's receive pages into a per-connection
	// window; what cannot be mapped is copied. The kernel maps only page-multiple payloads
	// from order-0 page frags (a MSG_ZEROCOPY/SEND_ZC sender with a 4 KiB-multiple MSS);
	// ConnStats.BytesRecvMapped says how much was mapped. Where the window cannot be set up
	// the connection uses RecvRing, counted in Stats.Recv.MappedFallbacks. io_uring backend
	// only.
	RecvMapped
	// RecvZcrx: io_uring zero-copy receive. Each queue registers a zcrx interface queue and
	// an area of ZcrxAreaSize bytes at start; connections receive with multishot RECV_ZC,
	// and each Data is a view of the area that Release hands back through the refill ring
	// (from any goroutine); SendData copies it. On Linux 7.1+ the instance is device-less:
	// any TCP socket, loopback included, receives through it, the kernel copying the
	// payload into the area (Stats.Recv.BytesZcrxCopied says so). It needs CAP_NET_ADMIN and
	// io_uring rings with CQE32 and DEFER_TASKRUN. Where zcrx cannot be set up (an older
	// kernel, no privilege, another backend) the queue receives through RecvRing: counted
	// per connection in Stats.Recv.ZcrxFallbacks, with the reason in Stats.Recv.ZcrxFallback;
	// with NoFallback New fails with a *NotSupportedError instead (saying which queue, and why). Stats.Recv.BytesZcrx
	// and Stats.Recv.BytesRing say which path each byte took.
	RecvZcrx
)

func (p RecvPath) String() string {
	switch p {
	case RecvRing:
		return "ring"
	case RecvMapped:
		return "mapped"
	case RecvZcrx:
		return "zcrx"
	}
	return fmt.Sprintf("RecvPath(%d)", int(p))
}

// Backend selects the queue implementation.
type Backend int

const (
	// BackendAuto uses io_uring, falling back to the zcshim module's queues (when loaded) and
	// then to plain sockets, unless NoFallback is set.
	BackendAuto Backend = iota
	// BackendIOUring demands io_uring.
	BackendIOUring
	// BackendPlain uses non-blocking sockets with epoll, one event loop per queue (no
	// io_uring, no registered memory in the kernel).
	BackendPlain
	// BackendShim uses the zcshim kernel module's queues (/dev/zcshim, see kmod/).
	BackendShim
)

func (b Backend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendIOUring:
		return "io_uring"
	case BackendPlain:
		return "plain"
	case BackendShim:
		return "shim"
	}
	return fmt.Sprintf("Backend(%d)", int(b))
}

// Config configures an Engine. The zero value is a good default; a zero field takes the
// default noted; a negative or nonsensical value is refused by New with a *ConfigError.
type Config struct {
	Queues  int // number of queues, each a goroutine on its own thread (default: one per CPU)
	Backend Backend
	// NoFallback makes New fail instead of falling back to another backend, or from
	// RecvZcrx to RecvRing.
	NoFallback bool
	SendPath   SendPath
	// ZCThreshold is the smallest send that uses SEND_ZC in adaptive mode (default 32 KiB:
	// below that, the page pinning and the extra notification cost more than the copy).
	ZCThreshold int
	// ZCReprobe is how many sends an adaptive connection makes by copy before trying
	// zero-copy again after the kernel reported copies (default 256; doubles on every
	// failed probe, up to 64 Ki).
	ZCReprobe int
	NoBundles bool // disable recv bundles
	// RecvPath selects how received bytes reach handlers (default RecvRing).
	RecvPath RecvPath
	// ZcrxAreaSize is the zcrx receive area of each queue in bytes (RecvZcrx; default 4 MiB,
	// rounded up to whole pages). It is mapped and registered at start and does not grow: it
	// is the receive window of all the queue's connections together (each still bounded by
	// MaxRecvHeld); when handlers hold all of it, receiving waits for releases.
	ZcrxAreaSize int
	// SocketOptions, if set, runs on every listening socket before bind and every dialed
	// socket before connect (accepted sockets inherit from their listener): TCP_MAXSEG,
	// buffer sizes, congestion control, pacing ... An error fails Listen or Dial.
	SocketOptions func(s *tcpglue.Socket) error
	// Nagle leaves Nagle's algorithm on (TCP_NODELAY off). Off by default, as in Go's net.
	Nagle bool
	// KeepAlive is the TCP keep-alive idle time and probe interval of accepted and dialed
	// connections (9 probes), as in Go's net: default 15 s; negative disables keep-alive.
	// ListenOptions and DialOptions override it per listener / dial.
	KeepAlive time.Duration
	NoPin     bool // do not pin queue threads to CPUs
	// BusyPoll, when positive, makes each queue poll for events without sleeping for up to
	// this long before it waits in the kernel: lower and steadier latency (request/response,
	// ping-pong) for a CPU kept busy. Off by default (the default stays CPU-friendly). See
	// the package documentation, "Queues and Go's scheduler", for GOMAXPROCS.
	BusyPoll time.Duration
	// AddProcs makes New raise GOMAXPROCS by the number of queues, and Close lower it by as
	// many again (each relative to the value then). A queue waiting in the kernel holds a P;
	// where no other P is idle, Go's monitor takes it back from every wait, which costs CPU
	// and latency (package doc, "Queues and Go's scheduler"; zcbench's zc-extra-p mode
	// measures it). Off by default: setting GOMAXPROCS is the
	// program's call, and it stops Go's automatic adjustment of GOMAXPROCS to CPU limits
	// (Go 1.25+).
	AddProcs bool

	// Memory. Each queue has a send pool (registered with the kernel: pinned, counted against
	// RLIMIT_MEMLOCK) and a receive pool. Both start small and grow, doubling, with demand up
	// to their caps.
	SendBufSize int // bytes per send buffer (default 64 KiB, at most 16 MiB)
	SendBufs    int // send buffers per queue at start (default 8)
	SendPoolMax int // cap of a queue's send pool in bytes (default 32 MiB)
	// RecvBufSize is the bytes per receive buffer (default 32 KiB, at most 16 MiB). Unlike a
	// read size, bigger is rarely faster: a completion carries what had arrived, and the ring
	// cycles through all its buffers, so 1 MiB buffers spread a stream over many MiB that the
	// kernel's copy and the handler's reads take from memory rather than cache (zcbench's
	// bulk scenario at 1 MiB writes compares buffer sizes).
	RecvBufSize int
	RecvBufs    int // receive buffers per queue at start (default 16)
	RecvPoolMax int // cap of a queue's receive pool in bytes (default 32 MiB; at most 32768 buffers)

	// MaxQueuedBytes bounds the bytes one connection may have queued or in flight: Write
	// blocks above it, Send and SendData still queue but make the sending side wait (see
	// MaxRecvHeld) (default 4 MiB).
	MaxQueuedBytes int
	// MaxRecvHeld bounds the receive-buffer bytes one connection may hold: Data not yet
	// released, and Data forwarded by SendData and not yet sent. A connection at its bound
	// stops receiving until some is released (default 1 MiB). With many connections on a
	// queue the bound shrinks to their share of half the receive pool (RecvPoolMax / (2 ×
	// connections), at least one buffer): together they can never hold the whole pool, so
	// the connections that would drain held data can always receive.
	MaxRecvHeld int
	// CloseTimeout bounds how long a graceful Close waits on a silent peer: queued sends go
	// out while the peer takes them or answers, however slowly it reads (a byte leaving,
	// the peer acknowledging bytes, or its kernel answering the window probes of a closed
	// window within CloseTimeout — TCP_INFO's bytes_acked, last_ack_recv, probes — each
	// count), as from Go's net. Once the kernel asked the peer at least twice without an
	// answer and none came for CloseTimeout, the connection is reset and OnClose gets an
	// error matching ErrCloseTimeout (a *CloseTimeoutError: Unsent counts what was queued
	// and what the kernel held unacknowledged). The kernel's probes back off (up to two
	// minutes apart), so a peer that falls silent after a long alive wait is found at the
	// kernel's next probe. A peer that stops reading but whose kernel answers is not silent:
	// its close waits, up to CloseStall without taking a byte (or until Engine.Close, whose
	// bound is absolute: CloseTimeout from its start, or Engine.CloseContext's context). It
	// bounds the wait for zero-copy notifications after the sends, again (default 5 s).
	CloseTimeout time.Duration
	// CloseStall bounds how long a graceful Close waits on a peer that answers but takes
	// nothing: its window stays closed and its kernel answers the window probes, yet no
	// byte is acknowledged (a client that never reads). Past it the connection is reset as
	// for a silent peer: OnClose gets a *CloseTimeoutError whose Timeout is CloseStall, and
	// the queued buffers go back to the pool. Without it such a peer would hold the closed
	// connection's send buffers until the engine closes; Go's net hands them to the kernel,
	// which gives an orphaned connection up after tcp_orphan_retries probes (about two
	// minutes on loopback). A peer that reads, however slowly, is not stalled: each byte it
	// acknowledges starts CloseStall again (a reader of 1 KB/s reopens its window in ~64 KiB
	// steps, a minute apart). Default 2 minutes; at least CloseTimeout.
	CloseStall time.Duration
	// Steering decides which queue owns each accepted connection (default SteerAuto: the BPF
	// steering program where it loads, else the kernel's SO_REUSEPORT hash, visibly).
	Steering SteeringMode
	// SteerPolicy places connections without a flow-table entry under BPF steering. The
	// default (bpf.PolicyAuto) is bpf.PolicyCPU, a flow goes to the queue of the CPU that
	// received its SYN (the CPU→queue map is filled from the queues' placement), where every
	// queue runs pinned on a CPU of its own, and bpf.PolicyHash elsewhere (NoPin, more
	// queues than CPUs), counted in Stats.Steering.PolicyFallbacks. Listener.Stats().Steering
	// says which policy is in effect and why. bpf.PolicyHash asks for the hash explicitly.
	SteerPolicy bpf.Policy
	// OnFallback is called when the engine falls back to another backend (for logging).
	OnFallback func(reason error)
	// OnLimit is called (for logging) with a *LimitError when a configured size cannot be
	// reached because of a process limit: at New when SendPoolMax × Queues does not fit
	// under RLIMIT_MEMLOCK (without CAP_IPC_LOCK), and when a send pool's growth is refused
	// for lack of locked memory. Such a refusal is a cap, not an error: senders wait for
	// buffers as at SendPoolMax (Stats.Memory.MemlockCaps counts it). It may run on a queue
	// goroutine: it must not block.
	OnLimit func(err error)
	// Debug turns on misuse checks (writes to sent or released buffers, slow handlers,
	// Data never released) that cost CPU: for tests and debugging (see DebugOptions).
	Debug DebugOptions
}

// SteeringMode says how accepted flows are spread over queues.
type SteeringMode int

const (
	// SteerAuto: SteerBPF when the programs load (root: CAP_BPF and CAP_NET_ADMIN), else
	// SteerReuseportHash, with the reason in Listener.Stats().Steering.Fallback and Stats.
	SteerAuto SteeringMode = iota
	// SteerBPF: one listening socket per queue in a SO_REUSEPORT group with zcnet's
	// sk_reuseport program: flow table first (Listener.Steering().SetFlow), then the policy,
	// then a hash; drained queues are skipped. Listen fails if the program cannot load.
	SteerBPF
	// SteerReuseportHash: one listening socket per queue in a SO_REUSEPORT group; the
	// kernel's hash picks the queue.
	SteerReuseportHash
	// SteerSingleListener: one listening socket on queue 0; accepted connections are spread
	// round-robin over the queues.
	SteerSingleListener
)

func (m SteeringMode) String() string {
	switch m {
	case SteerAuto:
		return "auto"
	case SteerBPF:
		return "bpf"
	case SteerReuseportHash:
		return "reuseport-hash"
	case SteerSingleListener:
		return "single-listener"
	}
	return fmt.Sprintf("SteeringMode(%d)", int(m))
}

const (
	defaultKeepAlive = 15 * time.Second
	maxBufSize       = 16 << 20
	maxRingBufs      = 32768
)

// normalize checks every field and fills in defaults for the zero ones.
func (c *Config) normalize() error {
	bad := func(field string, v any, reason string) error {
		return &ConfigError{Field: field, Value: v, Reason: reason}
	}
	type intField struct {
		name string
		p    *int
		def  int
		max  int
	}
	for _, f := range []intField{
		{"Queues", &c.Queues, runtime.NumCPU(), 1024},
		{"ZCThreshold", &c.ZCThreshold, 32 << 10, 1 << 30},
		{"ZCReprobe", &c.ZCReprobe, 256, 64 << 10},
		{"SendBufSize", &c.SendBufSize, 64 << 10, maxBufSize},
		{"SendBufs", &c.SendBufs, 8, 1 << 20},
		{"SendPoolMax", &c.SendPoolMax, 32 << 20, 1 << 40},
		{"RecvBufSize", &c.RecvBufSize, 32 << 10, maxBufSize},
		{"RecvBufs", &c.RecvBufs, 16, maxRingBufs},
		{"RecvPoolMax", &c.RecvPoolMax, 32 << 20, 1 << 40},
		{"MaxQueuedBytes", &c.MaxQueuedBytes, 4 << 20, 1 << 40},
		{"MaxRecvHeld", &c.MaxRecvHeld, 1 << 20, 1 << 40},
		{"ZcrxAreaSize", &c.ZcrxAreaSize, 4 << 20, 1 << 36},
	} {
		switch {
		case *f.p < 0:
			return bad(f.name, *f.p, "negative (0 takes the default)")
		case *f.p == 0:
			*f.p = f.def
		case *f.p > f.max:
			return bad(f.name, *f.p, fmt.Sprintf("at most %d", f.max))
		}
	}
	if c.Debug.SlowHandler < 0 {
		return bad("Debug.SlowHandler", c.Debug.SlowHandler, "negative (0: not timed)")
	}
	if c.Debug.HeldData < 0 {
		return bad("Debug.HeldData", c.Debug.HeldData, "negative (0: not tracked)")
	}
	if c.BusyPoll < 0 || c.BusyPoll > time.Second {
		return bad("BusyPoll", c.BusyPoll, "want 0 (off) .. 1s")
	}
	switch {
	case c.CloseTimeout < 0:
		return bad("CloseTimeout", c.CloseTimeout, "negative (0 takes the default, 5s)")
	case c.CloseTimeout == 0:
		c.CloseTimeout = 5 * time.Second
	}
	switch {
	case c.CloseStall < 0:
		return bad("CloseStall", c.CloseStall, "negative (0 takes the default, 2m)")
	case c.CloseStall == 0:
		c.CloseStall = max(2*time.Minute, c.CloseTimeout)
	case c.CloseStall < c.CloseTimeout:
		return bad("CloseStall", c.CloseStall, fmt.Sprintf("shorter than CloseTimeout (%v)", c.CloseTimeout))
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = defaultKeepAlive
	}
	if c.KeepAlive > maxKeepAlive {
		return bad("KeepAlive", c.KeepAlive, fmt.Sprintf("at most %v (the kernel's TCP_KEEPIDLE limit; negative disables keep-alive)", maxKeepAlive))
	}
	switch {
	case c.SendPath < SendAdaptive || c.SendPath > SendZeroCopy:
		return bad("SendPath", c.SendPath, "unknown send path")
	case c.Backend < BackendAuto || c.Backend > BackendShim:
		return bad("Backend", c.Backend, "unknown backend")
	case c.RecvPath < RecvRing || c.RecvPath > RecvZcrx:
		return bad("RecvPath", c.RecvPath, "unknown receive path")
	case c.Steering < SteerAuto || c.Steering > SteerSingleListener:
		return bad("Steering", c.Steering, "unknown steering mode")
	case !validPolicy(c.SteerPolicy):
		return bad("SteerPolicy", c.SteerPolicy, "unknown policy (PolicyHash cannot be combined with another)")
	case c.SendBufs*c.SendBufSize > c.SendPoolMax:
		return bad("SendPoolMax", c.SendPoolMax, fmt.Sprintf("smaller than the initial send pool (%d buffers of %d bytes)", c.SendBufs, c.SendBufSize))
	case c.RecvBufs*c.RecvBufSize > c.RecvPoolMax:
		return bad("RecvPoolMax", c.RecvPoolMax, fmt.Sprintf("smaller than the initial receive pool (%d buffers of %d bytes)", c.RecvBufs, c.RecvBufSize))
	case c.RecvPoolMax/c.RecvBufSize > maxRingBufs:
		return bad("RecvPoolMax", c.RecvPoolMax, fmt.Sprintf("more than %d receive buffers of %d bytes (a provided-buffer ring's limit): raise RecvBufSize or lower the cap", maxRingBufs, c.RecvBufSize))
	case c.MaxRecvHeld < c.RecvBufSize:
		return bad("MaxRecvHeld", c.MaxRecvHeld, fmt.Sprintf("below one receive buffer (%d bytes)", c.RecvBufSize))
	}
	return nil
}

// validPolicy reports whether p is a policy bpf accepts.
func validPolicy(p bpf.Policy) bool {
	known := bpf.PolicyDSCP | bpf.PolicyCPU | bpf.PolicyHash
	return p&^known == 0 && (p&bpf.PolicyHash == 0 || p == bpf.PolicyHash)
}

// DebugOptions turns on checks that catch misuse of the API at a cost (Config.Debug). All
// are off by default; each finding is counted in Stats and reported to OnMisuse as a
// *MisuseError, and the engine goes on: a check never changes what is sent or received.
type DebugOptions struct {
	// Buffers checks buffer ownership. Send and SendData record a checksum of the bytes,
	// verified when the buffer comes back (after the send, or the zero-copy notification): a
	// write to a buffer after it was sent is reported ("write after Send"); SendBytes
	// likewise, verified before its done callback ("write before SendBytes' done"). Send buffers are
	// filled with a poison byte when they return to the pool and checked when handed out again
	// (Buffer, BufferWait, Write): a write after Release is reported ("write after
	// Release"). The pools' memory stays mapped after Engine.Close, so a slice kept past
	// Release writes into pages given back to the system instead of crashing the process.
	// Costs a pass over every buffer sent and handed out.
	Buffers bool
	// SlowHandler counts handler calls (OnData, OnEOF, OnWritable, posted functions and
	// AfterFunc timers, DialAsync's done, SendBytes' done) that ran longer than this
	// (Stats.Debug.SlowHandlerCalls): a handler that blocks stalls every connection of its
	// queue. 0: not timed.
	SlowHandler time.Duration
	// HeldData counts received Data held unreleased for longer than this
	// (Stats.Debug.DataHeldLong, each Data once), whichever receive path delivered it (the
	// ring, or a zcrx area): a forgotten Release stops its connection at MaxRecvHeld. 0: not
	// tracked.
	HeldData time.Duration
	// OnMisuse, if set, is called with a *MisuseError for each finding, on a queue goroutine
	// or the goroutine that found it: it must not block.
	OnMisuse func(err error)
}
