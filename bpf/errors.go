package bpf

import (
	"errors"
	"fmt"
	"github.com/zcnet/zcnet/internal/errs"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
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
	ErrPermission = errors.New("permission denied (needs CAP_BPF and CAP_NET_ADMIN, or root)")

	// ErrNotSupported: the kernel lacks a BPF feature (program or map
	// type, attach type, helper). The programs need Linux 6.6 or newer
	// (tcx links, sk_reuseport with bpf_sk_select_reuseport, cpumap
	// programs).
	// It is the one sentinel every zcnet package shares.
	ErrNotSupported = errs.ErrNotSupported
	errOldKernel    = errs.NotSupported("BPF programs", "Linux 6.6 or newer with CONFIG_BPF_SYSCALL", nil)

	// ErrInvalid: a bad argument (queue out of range, unusable socket,
	// unknown interface, malformed key). Nothing was changed.
	ErrInvalid = errors.New("invalid argument")

	// ErrClosed: the handle was closed. It matches os.ErrClosed too.
	ErrClosed = fmt.Errorf("handle closed (%w)", os.ErrClosed)

	// ErrNotFound: no such flow entry.
	ErrNotFound = errors.New("not found")
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
		err = fmt.Errorf("%w: %s: %w", ErrPermission, missingCaps(), err)
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, unix.EOPNOTSUPP),
		errors.Is(err, unix.ENOSYS):
		err = fmt.Errorf("%w: %w", errOldKernel, err)
	case errors.Is(err, ebpf.ErrKeyNotExist):
		err = fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return &OpError{Op: op, Err: err}
}

// invalid returns an *OpError matching ErrInvalid.
func invalid(op, format string, args ...any) error {
	return &OpError{Op: op, Err: fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))}
}

// Capability numbers (linux/capability.h).
const (
	capNetAdmin = 12
	capSysAdmin = 21
	capPerfmon  = 38
	capBPF      = 39
)

// missingCaps names the capabilities this thread lacks for BPF networking:
// CAP_BPF to load programs and maps, CAP_NET_ADMIN for XDP, tc, sockops and
// cgroup programs (CAP_SYS_ADMIN stands in for both).
func missingCaps() string {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return "capabilities unknown"
	}
	has := func(c uint) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	if has(capSysAdmin) {
		return "CAP_SYS_ADMIN is present: denied by an LSM, a cgroup/file permission or a sysctl"
	}
	var missing []string
	if !has(capBPF) {
		missing = append(missing, "CAP_BPF")
	}
	if !has(capNetAdmin) {
		missing = append(missing, "CAP_NET_ADMIN")
	}
	if len(missing) == 0 {
		return "CAP_BPF and CAP_NET_ADMIN are present: denied by an LSM, a cgroup/file permission or a sysctl"
	}
	if !has(capPerfmon) {
		// Without it the verifier refuses some pointer arithmetic; name it
		// only as a hint.
		return "missing " + strings.Join(missing, " and ") + " (CAP_PERFMON also absent)"
	}
	return "missing " + strings.Join(missing, " and ")
}
