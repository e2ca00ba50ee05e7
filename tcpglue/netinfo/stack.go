package netinfo

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
)

// ErrNotSupported is zcnet's one "this kernel or machine cannot" sentinel.
var ErrNotSupported = errs.ErrNotSupported

// OpError is the error of every failed operation of this package: Op names it ("route
// get", "neighbor", "reserve port", "watch mtu"), Target is what it was about (an address,
// an interface), Err the cause: a *netlink.OpError (errno plus the kernel's message), a
// tcpglue error, a *PortInUseError, a *NeighborError, a context error, or os.ErrClosed.
type OpError struct {
	Op     string
	Target string
	Err    error
}

func (e *OpError) Error() string {
	s := "netinfo: " + e.Op
	if e.Target != "" {
		s += " " + e.Target
	}
	if e.Err != nil {
		return s + ": " + e.Err.Error()
	}
	return s + ": unknown error"
}

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

func opErr(op, target string, err error) error {
	if err == nil {
		return nil
	}
	return &OpError{Op: op, Target: target, Err: err}
}

// Options configure Open.
type Options struct {
	// NetNS, when > 0, is an open descriptor of a network namespace: every query, watch and
	// port reservation of the Stack then happens in that namespace. The Stack keeps its own
	// duplicate of the descriptor. 0 means the caller's namespace.
	NetNS int
}

// openStacks counts Stacks not yet closed (the tests' leak check).
var openStacks atomic.Int64

// Stack answers questions about the kernel's IP stack of one network namespace over
// rtnetlink (github.com/jsimonetti/rtnetlink/v2 on github.com/mdlayher/netlink). Its
// methods are safe for concurrent use. Close is idempotent; later calls fail with
// os.ErrClosed. Watches and port reservations have their own sockets and outlive neither
// their own Close nor the process, but do not need the Stack to stay open.
type Stack struct {
	mu     sync.Mutex
	rt     *rtnetlink.Conn
	ns     int // own duplicate of Options.NetNS, -1 for the caller's namespace
	closed bool
}

// Open connects to the kernel's routing netlink in the caller's namespace or opts.NetNS.
func Open(opts Options) (*Stack, error) {
	s := &Stack{ns: -1}
	if opts.NetNS > 0 {
		fd, err := unix.FcntlInt(uintptr(opts.NetNS), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, opErr("open", "", os.NewSyscallError("fcntl", err))
		}
		s.ns = fd
	}
	rt, err := rtnetlink.Dial(s.netlinkConfig(0))
	if err != nil {
		s.closeNS()
		return nil, opErr("open", "", err)
	}
	_ = rt.SetOption(netlink.ExtendedAcknowledge, true)
	s.rt = rt
	openStacks.Add(1)
	return s, nil
}

func (s *Stack) netlinkConfig(groups uint32) *netlink.Config {
	return &netlink.Config{Groups: groups, NetNS: max(s.ns, 0)}
}

func (s *Stack) closeNS() {
	if s.ns >= 0 {
		unix.Close(s.ns)
		s.ns = -1
	}
}

// Close releases the Stack's socket and namespace descriptor.
func (s *Stack) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	openStacks.Add(-1)
	err := s.rt.Close()
	s.closeNS()
	return err
}

// use runs fn while the Stack is open (Close waits for it).
func (s *Stack) use(op, target string, fn func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return opErr(op, target, os.ErrClosed)
	}
	return opErr(op, target, fn())
}

// dial opens a raw routing netlink socket in the Stack's namespace, subscribed to groups.
func (s *Stack) dial(groups uint32) (*netlink.Conn, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, os.ErrClosed
	}
	c, err := netlink.Dial(unix.NETLINK_ROUTE, s.netlinkConfig(groups))
	if err != nil {
		return nil, err
	}
	_ = c.SetOption(netlink.ExtendedAcknowledge, true)
	return c, nil
}

var errNoReply = errors.New("no reply")

var errClosed = os.ErrClosed
