package zc

import (
	"errors"
	"fmt"
	"github.com/zcnet/zcnet/internal/errs"
	"net"
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
	SendAdaptive SendPath = iota
	// SendCopy forces copying sends (IORING_OP_SEND).
	SendCopy
	// SendZeroCopy forces SEND_ZC for every send, whatever its size and whatever the kernel
	// reports.
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
	// the connection uses RecvRing, counted in Stats.RecvMappedFallbacks. io_uring backend
	// only.
	RecvMapped
)

// Backend selects the queue implementation.
type Backend int

const (
	// BackendAuto uses io_uring, falling back to plain sockets unless NoFallback is set.
	BackendAuto Backend = iota
	// BackendIOUring demands io_uring.
	BackendIOUring
	// BackendPlain uses blocking syscalls (a goroutine pair per connection).
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

// Config configures an Engine. The zero value is a good default.
type Config struct {
	Queues  int // number of queues (default: one per CPU)
	Backend Backend
	// NoFallback makes New fail instead of falling back to plain sockets.
	NoFallback bool
	SendPath   SendPath
	// ZCThreshold is the smallest send that uses SEND_ZC in adaptive mode (default 32 KiB:
	// below that, the page pinning and the extra notification cost more than the copy; see
	// bench/ for the measurement on this kind of machine).
	ZCThreshold int
	// ZCReprobe is how many sends an adaptive connection makes by copy before trying
	// zero-copy again after the kernel reported copies (default 256; doubles on every
	// failed probe, up to 64 Ki).
	ZCReprobe int
	NoBundles bool // disable recv bundles
	// RecvPath selects how received bytes reach handlers (default RecvRing).
	RecvPath RecvPath
	// SocketOptions, if set, runs on every listening socket before bind and every dialed
	// socket before connect (accepted sockets inherit from their listener): TCP_MAXSEG,
	// buffer sizes, congestion control, pacing ... An error fails Listen or Dial.
	SocketOptions func(s *tcpglue.Socket) error
	// Nagle leaves Nagle's algorithm on (TCP_NODELAY off). Off by default, as in Go's net.
	Nagle       bool
	NoPin       bool // do not pin queue threads to CPUs
	SendBufSize int  // bytes per send buffer (default 64 KiB)
	SendBufs    int  // send buffers per queue (default 512)
	RecvBufSize int  // bytes per receive buffer (default 32 KiB)
	RecvBufs    int  // receive buffers per queue, a power of two (default 512)
	// MaxQueuedBytes bounds the bytes one connection may have queued or in flight before
	// Write blocks (default 4 MiB).
	MaxQueuedBytes int
	// CloseTimeout bounds how long Close waits for queued sends and zero-copy notifications
	// (default 5 s).
	CloseTimeout time.Duration
	// Steering decides which queue owns each accepted connection (default SteerAuto: the BPF
	// steering program where it loads, else the kernel's SO_REUSEPORT hash, visibly).
	Steering SteeringMode
	// SteerPolicy places connections without a flow-table entry under BPF steering
	// (default bpf.PolicyHash; bpf.PolicyCPU keeps a flow on the queue of the CPU that
	// received its SYN).
	SteerPolicy bpf.Policy
	// Hooks are called when the engine falls back (for logging); optional.
	OnFallback func(reason error)
}

// SteeringMode says how accepted flows are spread over queues.
type SteeringMode int

const (
	// SteerAuto: SteerBPF when the programs load (root: CAP_BPF and CAP_NET_ADMIN), else
	// SteerReuseportHash, with the reason in Listener.SteeringFallback and Stats.
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

func (c *Config) defaults() {
	if c.Queues <= 0 {
		c.Queues = runtime.NumCPU()
	}
	if c.ZCThreshold <= 0 {
		c.ZCThreshold = 32 << 10
	}
	if c.ZCReprobe <= 0 {
		c.ZCReprobe = 256
	}
	if c.SendBufSize <= 0 {
		c.SendBufSize = 64 << 10
	}
	if c.SendBufs <= 0 {
		c.SendBufs = 512
	}
	if c.RecvBufSize <= 0 {
		c.RecvBufSize = 32 << 10
	}
	if c.RecvBufs <= 0 {
		c.RecvBufs = 512
	}
	if c.MaxQueuedBytes <= 0 {
		c.MaxQueuedBytes = 4 << 20
	}
	if c.CloseTimeout <= 0 {
		c.CloseTimeout = 5 * time.Second
	}
}

func (c *Config) validate() error {
	switch {
	case c.Queues > 1024:
		return fmt.Errorf("zc: %d queues (at most 1024): %w", c.Queues, ErrInvalid)
	case c.SendPath < SendAdaptive || c.SendPath > SendZeroCopy:
		return fmt.Errorf("zc: unknown send path %d: %w", c.SendPath, ErrInvalid)
	case c.Backend < BackendAuto || c.Backend > BackendShim:
		return fmt.Errorf("zc: unknown backend %d: %w", c.Backend, ErrInvalid)
	case c.RecvBufs&(c.RecvBufs-1) != 0 || c.RecvBufs > 32768:
		return fmt.Errorf("zc: %d receive buffers (a power of two, at most 32768): %w", c.RecvBufs, ErrInvalid)
	case c.SendBufs > 1<<20 || c.SendBufSize > 1<<30 || c.RecvBufSize > 1<<30:
		return fmt.Errorf("zc: buffer geometry too large: %w", ErrInvalid)
	case c.RecvPath < RecvRing || c.RecvPath > RecvMapped:
		return fmt.Errorf("zc: unknown receive path %d: %w", c.RecvPath, ErrInvalid)
	case c.Steering < SteerAuto || c.Steering > SteerSingleListener:
		return fmt.Errorf("zc: unknown steering mode %d: %w", c.Steering, ErrInvalid)
	}
	return nil
}

var (
	// ErrNotSupported: this kernel or process cannot do what was asked (see the wrapped cause).
	ErrNotSupported = errs.ErrNotSupported
	// ErrInvalid: a bad argument.
	ErrInvalid = errors.New("invalid argument")
	// ErrClosed is net.ErrClosed: the engine, listener or connection is closed.
	ErrClosed = net.ErrClosed
	// ErrTooLarge: a send larger than its buffer.
	ErrTooLarge = errors.New("send larger than its buffer")
)

// OpError is the error type of zc operations. It matches *net.OpError's fields so callers can
// treat both alike, and unwraps to Err.
type OpError struct {
	Op   string   // "dial", "listen", "accept", "send", "read", "write", "close", "new"
	Net  string   // "tcp", "tcp4", "tcp6"
	Addr net.Addr // remote (or local for listen) address, when known
	Err  error
}

func (e *OpError) Error() string {
	s := "zc: " + e.Op
	if e.Net != "" {
		s += " " + e.Net
	}
	if e.Addr != nil {
		s += " " + e.Addr.String()
	}
	return s + ": " + e.Err.Error()
}

func (e *OpError) Unwrap() error { return e.Err }

// Timeout reports whether the error is a timeout (net.Error).
func (e *OpError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

// Temporary is part of net.Error; always false.
func (e *OpError) Temporary() bool { return false }
