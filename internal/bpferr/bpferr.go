// Package bpferr holds what package bpf and its capture package share to turn the kernel's
// and cilium/ebpf's answers into zcnet's sentinels: the sentinels themselves (bpf re-exports
// them, capture aliases them), the classification, the capability report, and interface
// names.
package bpferr

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
)

var (
	ErrPermission = errors.New("permission denied (needs CAP_BPF and CAP_NET_ADMIN, or root)")
	ErrInvalid    = errors.New("invalid argument")
	ErrClosed     = fmt.Errorf("handle closed (%w)", errs.ErrClosed)
	ErrNotFound   = errors.New("not found")
)

// Classify wraps err with the sentinel the kernel's answer conclusively means: a permission
// refusal names the capabilities this thread lacks among need (and hint, named only as a
// hint), a missing feature wraps oldKernel (an errs.NotSupported). An error that already
// matches a sentinel, or that means nothing conclusive, is returned as is.
func Classify(err, oldKernel error, need, hint []Cap) error {
	switch {
	case err == nil:
	case errors.Is(err, ErrPermission), errors.Is(err, errs.ErrNotSupported),
		errors.Is(err, ErrInvalid), errors.Is(err, ErrClosed), errors.Is(err, ErrNotFound):
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		err = fmt.Errorf("%w: %s: %w", ErrPermission, MissingCaps(need, hint), err)
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, unix.EOPNOTSUPP),
		errors.Is(err, unix.ENOSYS):
		err = fmt.Errorf("%w: %w", oldKernel, err)
	case errors.Is(err, ebpf.ErrKeyNotExist):
		err = fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}

// Cap is a capability number (linux/capability.h).
type Cap uint

const (
	CapNetAdmin Cap = unix.CAP_NET_ADMIN
	CapSysAdmin Cap = unix.CAP_SYS_ADMIN
	CapPerfmon  Cap = unix.CAP_PERFMON
	CapBPF      Cap = unix.CAP_BPF
)

func (c Cap) String() string {
	switch c {
	case CapNetAdmin:
		return "CAP_NET_ADMIN"
	case CapSysAdmin:
		return "CAP_SYS_ADMIN"
	case CapPerfmon:
		return "CAP_PERFMON"
	case CapBPF:
		return "CAP_BPF"
	}
	return fmt.Sprintf("capability %d", uint(c))
}

// MissingCaps names the capabilities of need this thread lacks (CAP_SYS_ADMIN stands in for
// all), and those of hint when something of need is missing too.
func MissingCaps(need, hint []Cap) string {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return "capabilities unknown"
	}
	has := func(c Cap) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	if has(CapSysAdmin) {
		return "CAP_SYS_ADMIN is present: denied by an LSM, a cgroup/file permission or a sysctl"
	}
	absent := func(cs []Cap) (out []string) {
		for _, c := range cs {
			if !has(c) {
				out = append(out, c.String())
			}
		}
		return out
	}
	missing := absent(need)
	if len(missing) == 0 {
		return andList(names(need)) + " present: denied by an LSM, a cgroup/file permission or a sysctl"
	}
	s := "missing " + andList(missing)
	if h := absent(hint); len(h) > 0 {
		s += " (" + andList(h) + " also absent)"
	}
	return s
}

func names(cs []Cap) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.String()
	}
	return out
}

// andList joins "a", "a and b", "a, b and c".
func andList(s []string) string {
	if len(s) <= 1 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// IfName returns the name of the interface with this index in the calling thread's network
// namespace; an error matching ErrInvalid if there is none.
func IfName(ifindex int) (string, error) {
	if ifindex <= 0 {
		return "", fmt.Errorf("%w: bad interface index %d", ErrInvalid, ifindex)
	}
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return "", err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	ifr.SetUint32(uint32(ifindex))
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFNAME, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return "", fmt.Errorf("%w: no interface with index %d in this network namespace", ErrInvalid, ifindex)
		}
		return "", os.NewSyscallError("ioctl SIOCGIFNAME", err)
	}
	return ifr.Name(), nil
}
