package bpf

import (
	"errors"
	"fmt"

	"github.com/zcnet/zcnet/internal/bpferr"
	"github.com/zcnet/zcnet/internal/errs"
)

// Sentinel errors (their text has no "bpf:" prefix: *OpError adds it).
// Every error this package returns is an *OpError; test it
// with errors.Is against these (never with ==). The underlying errno or
// cilium/ebpf error stays reachable through Unwrap as well.
var (
	// ErrPermission: the process lacks the privileges BPF needs. Loading
	// the programs needs CAP_BPF (or CAP_SYS_ADMIN: this kernel has
	// unprivileged BPF disabled); attaching XDP/tc needs CAP_NET_ADMIN,
	// and sockops needs write access to the cgroup.
	// The error's text names the capabilities the process lacks.
	ErrPermission = bpferr.ErrPermission

	// ErrNotSupported: the kernel lacks a BPF feature (program or map
	// type, attach type, helper). The programs need Linux 6.6 or newer
	// (tcx links, sk_reuseport with bpf_sk_select_reuseport, cpumap
	// programs).
	// It is the one sentinel every zcnet package shares.
	ErrNotSupported = errs.ErrNotSupported
	errOldKernel    = errs.NotSupported("BPF programs", "Linux 6.6 or newer with CONFIG_BPF_SYSCALL", nil)

	// ErrInvalid: a bad argument (queue out of range, unusable socket,
	// unknown interface, malformed key). Nothing was changed.
	ErrInvalid = bpferr.ErrInvalid

	// ErrClosed: the handle was closed. It matches os.ErrClosed too.
	ErrClosed = bpferr.ErrClosed

	// ErrNotFound: no such flow entry.
	ErrNotFound = bpferr.ErrNotFound
)

// OpError describes a failed operation: Op names it ("load", "attach xdp",
// "set flow", ...), Err holds the cause, which matches one of the sentinels
// above when one applies, and the original errno otherwise.
type OpError struct {
	Op  string
	Err error
}

func (e *OpError) Error() string { return "bpf: " + e.Op + ": " + e.Err.Error() }
func (e *OpError) Unwrap() error { return e.Err }

// opErr wraps err for operation op, classifying the kernel's answer into a
// sentinel when it is conclusive (bpferr.Classify: the one place bpf and capture share).
func opErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var oe *OpError
	if errors.As(err, &oe) {
		return err
	}
	return &OpError{Op: op, Err: bpferr.Classify(err, errOldKernel, needCaps, hintCaps)}
}

// What loading the programs needs: CAP_BPF for programs and maps, CAP_NET_ADMIN for XDP, tc,
// sockops and cgroup programs (CAP_SYS_ADMIN stands in for both); without CAP_PERFMON the
// verifier refuses some pointer arithmetic, so it is named as a hint.
var (
	needCaps = []bpferr.Cap{bpferr.CapBPF, bpferr.CapNetAdmin}
	hintCaps = []bpferr.Cap{bpferr.CapPerfmon}
)

// invalid returns an *OpError matching ErrInvalid.
func invalid(op, format string, args ...any) error {
	return &OpError{Op: op, Err: fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))}
}
