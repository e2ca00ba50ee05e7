package tcpglue

import (
	"errors"
	"fmt"
	"github.com/zcnet/zcnet/internal/errs"
	"net"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNotSupported means this kernel or machine cannot do what was asked
// (for example an IPv6 socket on a host without IPv6, or TCP_ZEROCOPY_RECEIVE
// on a kernel older than 4.18). Match it with errors.Is.
// It is the one sentinel every zcnet package shares.
var ErrNotSupported = errs.ErrNotSupported

// OpError is the error type returned by every operation of this package that
// fails. Op names the operation ("listen", "setsockopt TCP_NODELAY", ...),
// Fd is the socket it was applied to (-1 when none existed yet), Addr is the
// address involved when there is one, and Err is the cause: an
// *os.SyscallError wrapping a unix.Errno, net.ErrClosed, ErrNotSupported, or
// one of *ValueError, *AddrError, *CongestionError.
type OpError struct {
	Op   string
	Fd   int
	Addr net.Addr
	Err  error
}

func (e *OpError) Error() string {
	if e == nil {
		return "<nil>"
	}
	var b strings.Builder
	b.WriteString("tcpglue: ")
	b.WriteString(e.Op)
	if e.Fd >= 0 {
		fmt.Fprintf(&b, " fd %d", e.Fd)
	}
	if e.Addr != nil {
		b.WriteString(" ")
		b.WriteString(e.Addr.String())
	}
	b.WriteString(": ")
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("unknown error")
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

// Timeout reports whether the cause is a timeout (ETIMEDOUT, EAGAIN on a
// socket with a timeout), like net.Error.
func (e *OpError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

// Temporary is kept for net.Error compatibility.
func (e *OpError) Temporary() bool {
	var t interface{ Temporary() bool }
	return errors.As(e.Err, &t) && t.Temporary()
}

// ValueError reports an argument rejected before any system call was made
// (a negative size, a ToS above 255, a socket of the wrong kind...).
type ValueError struct {
	Name   string // what was being set: "SO_SNDBUF", "IP_TOS", "window size", ...
	Value  any    // the rejected value
	Reason string // why, and what would be accepted
}

func (e *ValueError) Error() string {
	return fmt.Sprintf("invalid %s %v: %s", e.Name, e.Value, e.Reason)
}

// AddrError reports an address that cannot be used: unparseable, of the wrong
// family for the requested network, or unresolvable.
type AddrError struct {
	Addr   string
	Reason string
}

func (e *AddrError) Error() string {
	return fmt.Sprintf("address %q: %s", e.Addr, e.Reason)
}

// CongestionError reports a congestion control algorithm the kernel refused.
// Available lists the algorithms the kernel has loaded
// (/proc/sys/net/ipv4/tcp_available_congestion_control); Err is the kernel's
// answer (ENOENT for an unknown name, EPERM for one that is not in
// tcp_allowed_congestion_control for an unprivileged process).
type CongestionError struct {
	Name      string
	Available []string
	Err       error
}

func (e *CongestionError) Error() string {
	msg := fmt.Sprintf("congestion control %q not available", e.Name)
	if e.Err != nil {
		msg += " (" + e.Err.Error() + ")"
	}
	if len(e.Available) > 0 {
		msg += "; available: " + strings.Join(e.Available, " ")
	}
	if errors.Is(e.Err, unix.EPERM) {
		msg += "; as non-root only algorithms in net.ipv4.tcp_allowed_congestion_control may be used"
	}
	return msg
}

// Unwrap returns the kernel's error.
func (e *CongestionError) Unwrap() error { return e.Err }

func opErr(op string, fd int, addr net.Addr, err error) error {
	if err == nil {
		return nil
	}
	return &OpError{Op: op, Fd: fd, Addr: addr, Err: err}
}

// sysErr wraps an errno from the named system call.
func sysErr(call string, err error) error {
	if err == nil {
		return nil
	}
	return os.NewSyscallError(call, err)
}
