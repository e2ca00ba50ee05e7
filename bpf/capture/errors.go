package capture

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
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

// missingCaps names the capabilities this thread lacks for capture.
func missingCaps() string {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return "capabilities unknown"
	}
	has := func(c uint) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	if has(capSysAdmin) {
		return "CAP_SYS_ADMIN is present: denied by an LSM, a file permission or a sysctl"
	}
	var missing []string
	for _, c := range []struct {
		n    uint
		name string
	}{{capBPF, "CAP_BPF"}, {capNetAdmin, "CAP_NET_ADMIN"}, {capPerfmon, "CAP_PERFMON"}} {
		if !has(c.n) {
			missing = append(missing, c.name)
		}
	}
	if len(missing) == 0 {
		return "CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON are present: denied by an LSM, a file permission or a sysctl"
	}
	return "missing " + strings.Join(missing, ", ")
}
