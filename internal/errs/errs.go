// Package errs holds the error sentinels every zcnet package shares, so that one errors.Is
// answers for all of them: errors.Is(err, zc.ErrNotSupported) holds for a refusal from
// tcpglue, bpf, memreg, kmod or internal/uring as well, because each package re-exports the
// same value.
package errs

import (
	"errors"
	"net"
	"os"
)

// ErrClosed: the object (engine, connection, region, queue, handle) was closed. It is the one
// "closed" error of every zcnet package: it matches net.ErrClosed (what zc and Go's net
// return) and os.ErrClosed (what Go's os returns), so either test answers for all.
var ErrClosed error = closedError{}

type closedError struct{}

func (closedError) Error() string { return "use of closed object" }

// Is makes ErrClosed match net.ErrClosed and os.ErrClosed.
func (closedError) Is(target error) bool { return target == net.ErrClosed || target == os.ErrClosed }

// ErrNotSupported: this kernel, machine or process cannot do what was asked. The error that
// wraps it says what was asked, what it needs (a kernel version, a config option, a device,
// a capability) and, where there is one, the fix. Only nil and ErrNotSupported are
// conclusive answers of a feature probe; any other error means the probe itself failed.
var ErrNotSupported = errors.New("not supported")

// NotSupportedError is a refusal with its reason. It matches ErrNotSupported and its cause.
type NotSupportedError struct {
	What string // what was asked: "SEND_ZC", "MAP_HUGETLB", "kernel modules"
	Need string // what it needs: "Linux 6.0 or newer", "CONFIG_MODULES=y", "a NIC with header split"
	Err  error  // the cause (an errno, a lower error), may be nil
}

func (e *NotSupportedError) Error() string {
	s := e.What + ": not supported"
	if e.Need != "" {
		s += " (needs " + e.Need + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns ErrNotSupported and the cause.
func (e *NotSupportedError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrNotSupported}
	}
	return []error{ErrNotSupported, e.Err}
}

// NotSupported returns a *NotSupportedError.
func NotSupported(what, need string, cause error) error {
	return &NotSupportedError{What: what, Need: need, Err: cause}
}
