package zc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime/debug"
	"time"

	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/internal/loop"
)

var (
	// ErrNotSupported: this kernel or process cannot do what was asked (see the wrapped
	// cause). It is the one sentinel every zcnet package shares: a refusal from tcpglue, bpf,
	// memreg or kmod matches it too.
	ErrNotSupported = errs.ErrNotSupported
	// ErrInvalid: a bad argument or configuration value.
	ErrInvalid = errors.New("invalid argument")
	// ErrClosed is net.ErrClosed: the engine, listener or connection is closed.
	ErrClosed = net.ErrClosed
	// ErrTooLarge: a send longer than its buffer.
	ErrTooLarge = errors.New("send larger than its buffer")
	// ErrEmpty: a send of zero bytes (a Data or buffer with nothing in it).
	ErrEmpty = errors.New("empty send")
	// ErrForeignBuffer: a buffer (or Data) that belongs to another engine. Its memory is not
	// this engine's to lend: copy it (Write) instead.
	ErrForeignBuffer = errors.New("buffer of another engine")
	// ErrWouldBlock: a call made on one of the engine's queue goroutines (from a Handler, an
	// accept function or a posted function) would have to wait for a queue goroutine.
	// Handlers must not block: use the asynchronous forms (DialAsync, Buffer instead of
	// BufferWait, OnWritable instead of a blocking Write).
	ErrWouldBlock = loop.ErrWouldBlock
	// ErrCloseTimeout: a graceful close (Close, or Engine.Close's) waited Config.CloseTimeout
	// for the peer to take the queued bytes and gave up: the connection was reset and what
	// was still queued was dropped. OnClose gets a *CloseTimeoutError that says how much. It
	// matches ErrClosed too: the connection is closed.
	ErrCloseTimeout = fmt.Errorf("close timed out, queued bytes dropped: %w", net.ErrClosed)
)

// NotSupportedError is a refusal with its reason (what was asked, what it needs, the cause),
// shared by every zcnet package: errors.As finds it in any error matching ErrNotSupported
// that says why. Its fields (the type is defined in an internal package, so go doc does not
// show them here):
//
//	What string // what was asked: "SEND_ZC", "MAP_HUGETLB", "kernel modules"
//	Need string // what it needs: "Linux 6.0 or newer", "CONFIG_MODULES=y", "a NIC with header split"
//	Err  error  // the cause (an errno, a lower error), may be nil
//
// It unwraps (Unwrap() []error) to ErrNotSupported and to Err.
type NotSupportedError = errs.NotSupportedError

// OpError is the error type of zc operations. It matches *net.OpError's fields so callers can
// treat both alike, and unwraps to Err.
type OpError struct {
	Op   string   // "dial", "listen", "accept", "send", "read", "write", "close", "new", ...
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

// ConfigError names the Config field that was refused, with the value and the reason.
type ConfigError struct {
	Field  string
	Value  any
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("Config.%s = %v: %s", e.Field, e.Value, e.Reason)
}

// Unwrap makes a ConfigError match ErrInvalid.
func (e *ConfigError) Unwrap() error { return ErrInvalid }

// PanicError is the error a connection closes with when one of its handler methods panicked:
// the engine recovers, counts it (Stats.Faults.HandlerPanics) and closes only that connection.
type PanicError struct {
	Method string // "OnData", "OnEOF", "OnWritable", "accept", ...
	Value  any    // what the handler panicked with
	Stack  []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("handler %s panicked: %v", e.Method, e.Value)
}

func newPanicError(method string, v any) *PanicError {
	return &PanicError{Method: method, Value: v, Stack: debug.Stack()}
}

// LimitError says that a configured size cannot be reached because of a process limit
// (RLIMIT_MEMLOCK): the engine runs with less (Have bytes instead of Want) and waits where it
// would have grown. It unwraps to the cause (a *memreg.MemlockError, which names the fix).
type LimitError struct {
	What  string // "send pool"
	Queue int    // the queue, or -1 for every queue together (at New)
	Have  int    // bytes available (the pool's size, or the limit)
	Want  int    // bytes configured
	Err   error
}

func (e *LimitError) Error() string {
	q := "every queue"
	if e.Queue >= 0 {
		q = fmt.Sprintf("queue %d", e.Queue)
	}
	return fmt.Sprintf("zc: %s of %s capped at %d of %d bytes (senders wait for buffers): %v", e.What, q, e.Have, e.Want, e.Err)
}

func (e *LimitError) Unwrap() error { return e.Err }

// CloseTimeoutError is how a graceful close that gave up after Config.CloseTimeout ends (the
// error OnClose gets, wrapped in an *OpError with Op "close"; Write, Send and SendData return
// it afterwards). It unwraps to ErrCloseTimeout, so it matches ErrClosed as well.
type CloseTimeoutError struct {
	// Timeout is the Config.CloseTimeout that the peer stayed silent for (or, in
	// Engine.Close, that passed since the engine's close began), or the Config.CloseStall
	// that a peer answering the kernel's probes took no byte for. When CloseContext's
	// context ended first, that cut the close short instead (CloseContext's error says so)
	// and Timeout is still the configured CloseTimeout.
	Timeout time.Duration
	// Unsent is the bytes accepted (Write, Send, SendData, SendFile) that the peer had not
	// acknowledged when the connection was reset: those not yet handed to the kernel
	// (ConnStats.BytesDropped counts them too) and those the kernel held unacknowledged
	// (SIOCOUTQ), which the reset discards. For a silent peer it is exact. When
	// Engine.Close's bound or CloseContext reset a peer that was still reading, a few of
	// the unacknowledged bytes may have reached it (their acknowledgement in flight). A
	// send the kernel still held at OnClose (twice CloseTimeout passed and its cancel had
	// not ended it) is not in it: what that send does not take is counted in
	// ConnStats.BytesDropped when it completes, and its buffers go back only then.
	Unsent int
}

func (e *CloseTimeoutError) Error() string {
	return fmt.Sprintf("close gave up after %v without progress (the peer did not take the queued bytes): connection reset with %d bytes unsent", e.Timeout, e.Unsent)
}

// Unwrap makes a CloseTimeoutError match ErrCloseTimeout (and ErrClosed).
func (e *CloseTimeoutError) Unwrap() error { return ErrCloseTimeout }

// timeoutError is os.ErrDeadlineExceeded's behaviour for zc's own waits.
var errTimeout error = os.ErrDeadlineExceeded

// errWriteClosed: sends after CloseWrite (a closed family error: errors.Is(err, ErrClosed),
// as SendFile's).
var errWriteClosed = fmt.Errorf("write side closed (CloseWrite): %w", ErrClosed)

// errCloseTimedOut: a closing connection's closeErr between CloseTimeout passing and its
// finish, where it becomes a *CloseTimeoutError (core.go closeTimedOut).
var errCloseTimedOut = errors.New("close timed out")

// errCanceled: a wait ended by its caller's context (WriteContext turns it into ctx.Err()).
var errCanceled = errors.New("canceled")
