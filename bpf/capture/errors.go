package capture

import (
	"errors"
	"fmt"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/bpferr"
	"github.com/zcnet/zcnet/internal/errs"
)

// Sentinel errors. They are the bpf package's, so errors.Is works with
// either name. Every error this package returns is an *OpError.
var (
	// ErrPermission: the process lacks CAP_BPF (loading the programs and
	// the ring buffer), CAP_NET_ADMIN (attaching tcx programs) or
	// CAP_PERFMON (fexit on an XDP program, reading kernel memory); the
	// text names what is missing.
	ErrPermission = bpf.ErrPermission
	// ErrNotSupported: the kernel lacks a feature capture needs (tcx links
	// and bpf_ktime_get_tai_ns: Linux 6.6; fexit on XDP programs: BTF).
	ErrNotSupported = errs.ErrNotSupported
	// ErrInvalid: a bad argument (snap length, ring size, interface,
	// malformed selector). Nothing was changed.
	ErrInvalid = bpf.ErrInvalid
	// ErrNotFound: the selected flow or listener does not exist (a flow the
	// Steering does not know, no TCP listener on that address, a selector
	// that was never added).
	ErrNotFound = bpf.ErrNotFound
	// ErrClosed: the capture was closed. It matches os.ErrClosed too.
	ErrClosed = bpf.ErrClosed

	errOldKernel = errs.NotSupported("packet capture", "Linux 6.6 or newer (tcx links, BPF ring buffer, bpf_ktime_get_tai_ns)", nil)
)

// OpError describes a failed operation: Op names it ("new", "attach tc
// ingress to ifindex 3", "add", ...), Err holds the cause, which matches
// one of the sentinels above when one applies, and the original errno
// otherwise.
type OpError struct {
	Op  string
	Err error
}

func (e *OpError) Error() string { return "capture: " + e.Op + ": " + e.Err.Error() }
func (e *OpError) Unwrap() error { return e.Err }

// opErr wraps err for operation op, classifying the kernel's answer into a
// sentinel when it is conclusive (bpferr.Classify, shared with package bpf).
func opErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var oe *OpError
	if errors.As(err, &oe) {
		return err
	}
	return &OpError{Op: op, Err: bpferr.Classify(err, errOldKernel, needCaps, nil)}
}

// Capture needs CAP_BPF (programs, ring buffer), CAP_NET_ADMIN (tcx) and CAP_PERFMON (fexit
// on an XDP program, reading kernel memory).
var needCaps = []bpferr.Cap{bpferr.CapBPF, bpferr.CapNetAdmin, bpferr.CapPerfmon}

func missingCaps() string { return bpferr.MissingCaps(needCaps, nil) }

// invalid returns an *OpError matching ErrInvalid.
func invalid(op, format string, args ...any) error {
	return &OpError{Op: op, Err: fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))}
}
