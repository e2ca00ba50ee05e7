package bpf

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Sentinel errors. Every error this package returns is an *OpError; test it
// with errors.Is against these (never with ==). The underlying errno or
// cilium/ebpf error stays reachable through Unwrap as well.
var (
	// ErrPermission: the process lacks the privileges BPF needs. Loading
	// the programs needs CAP_BPF (or CAP_SYS_ADMIN: this kernel has
	// unprivileged BPF disabled); attaching XDP/tc needs CAP_NET_ADMIN,
	// and sockops needs write access to the cgroup.
	ErrPermission = errors.New("bpf: permission denied (needs CAP_BPF and CAP_NET_ADMIN, or root)")

	// ErrNotSupported: the kernel lacks a BPF feature (program or map
	// type, attach type, helper). The programs need Linux 6.6 or newer
	// (tcx links, sk_reuseport with bpf_sk_select_reuseport, cpumap
	// programs).
	ErrNotSupported = errors.New("bpf: not supported by this kernel (needs Linux 6.6 or newer with CONFIG_BPF_SYSCALL)")

	// ErrInvalid: a bad argument (queue out of range, unusable socket,
	// unknown interface, malformed key). Nothing was changed.
	ErrInvalid = errors.New("bpf: invalid argument")

	// ErrClosed: the handle was closed. It matches os.ErrClosed too.
	ErrClosed = fmt.Errorf("bpf: %w", os.ErrClosed)

	// ErrNotFound: no such flow entry.
	ErrNotFound = errors.New("bpf: not found")
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
// sentinel when it is conclusive.
func opErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var oe *OpError
	if errors.As(err, &oe) {
		return err
	}
	switch {
	case errors.Is(err, ErrPermission), errors.Is(err, ErrNotSupported),
		errors.Is(err, ErrInvalid), errors.Is(err, ErrClosed), errors.Is(err, ErrNotFound):
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		err = fmt.Errorf("%w: %w", ErrPermission, err)
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, unix.EOPNOTSUPP),
		errors.Is(err, unix.ENOSYS):
		err = fmt.Errorf("%w: %w", ErrNotSupported, err)
	case errors.Is(err, ebpf.ErrKeyNotExist):
		err = fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return &OpError{Op: op, Err: err}
}

// invalid returns an *OpError matching ErrInvalid.
func invalid(op, format string, args ...any) error {
	return &OpError{Op: op, Err: fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))}
}
