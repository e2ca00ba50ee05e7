// Package testutil holds the feature-probe helpers zcnet's tests share.
//
// The rule (cilium/ebpf's testutils.SkipIfNotSupported is the model): a test skips only
// when the feature is truly absent, and fails when the kernel is new enough to have it but
// the call still fails.
package testutil

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/eintr"
	"github.com/zcnet/zcnet/internal/errs"
)

// KernelVersion returns the running kernel's major, minor and patch numbers.
func KernelVersion() (major, minor, patch int) {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return 0, 0, 0
	}
	return parseVersion(unix.ByteSliceToString(u.Release[:]))
}

func parseVersion(rel string) (major, minor, patch int) {
	// "6.18.0-1-cloud-amd64", "7.3.4+deb13-cloud-amd64"
	f := strings.FieldsFunc(rel, func(r rune) bool { return r < '0' || r > '9' })
	n := [3]int{}
	for i := 0; i < len(f) && i < 3; i++ {
		n[i], _ = strconv.Atoi(f[i])
	}
	return n[0], n[1], n[2]
}

// KernelAtLeast reports whether the running kernel is at least the version "X.Y".
func KernelAtLeast(version string) bool {
	wmaj, wmin, _ := parseVersion(version)
	maj, min, _ := KernelVersion()
	return maj > wmaj || (maj == wmaj && min >= wmin)
}

// SkipIfNotSupported skips the test when err says the feature is absent (it matches
// ErrNotSupported) and the kernel is older than minKernel ("X.Y"; "" means any kernel may
// lack it). On a kernel at least minKernel the same error fails the test: the feature should
// be there. Any other non-nil error fails the test. It returns only when err is nil.
func SkipIfNotSupported(tb testing.TB, err error, minKernel string) {
	tb.Helper()
	if err == nil {
		return
	}
	if !errors.Is(err, errs.ErrNotSupported) {
		tb.Fatalf("unexpected error (not a refusal): %v", err)
		return
	}
	if minKernel != "" && KernelAtLeast(minKernel) {
		tb.Fatalf("kernel %s is at least %s, which should support this: %v", release(), minKernel, err)
		return
	}
	tb.Skipf("not supported here (kernel %s): %v", release(), err)
}

// RequireFeature is SkipIfNotSupported for a capability probed as a yes/no answer (an
// opcode in the probe, a feature bit, a setup flag): it returns when ok, skips when the
// kernel is older than minKernel ("X.Y"), and fails on a kernel at least minKernel.
func RequireFeature(tb testing.TB, ok bool, feature, minKernel string) {
	tb.Helper()
	if ok {
		return
	}
	SkipIfNotSupported(tb, fmt.Errorf("%s (Linux %s+): %w", feature, minKernel, errs.ErrNotSupported), minKernel)
}

// RequireIPv6Loopback skips the test only when the host truly has no ::1: the kernel has
// no IPv6 (no /proc/net/if_inet6) or lo carries no ::1 (IPv6 disabled on it). A test that
// then fails to use ::1 has found an error of its own code, not a missing feature.
func RequireIPv6Loopback(tb testing.TB) {
	tb.Helper()
	ok, err := hasIPv6Loopback("/proc/net/if_inet6")
	if err != nil {
		tb.Fatalf("looking for ::1: %v", err)
	}
	if !ok {
		tb.Skip("this host has no IPv6 loopback address (::1 on lo)")
	}
}

// hasIPv6Loopback reads an if_inet6 table ("address ifindex plen scope flags name" per
// line, the address as 32 hex digits). A missing file means a kernel without IPv6.
func hasIPv6Loopback(path string) (bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 6 && f[0] == "00000000000000000000000000000001" && f[5] == "lo" {
			return true, nil
		}
	}
	return false, nil
}

// RequireRoot skips the test unless the process runs as root. CI runs as root, so tests
// that need root run there.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root")
	}
}

func release() string {
	maj, min, patch := KernelVersion()
	return fmt.Sprintf("%d.%d.%d", maj, min, patch)
}

// WriteAll writes all of p to the blocking descriptor fd: write(2) on a socket returns a
// short count when a signal (the Go runtime's preemption signal, under load) interrupts it
// after some bytes were copied, and EINTR before any.
func WriteAll(fd int, p []byte) error {
	for len(p) > 0 {
		n, err := eintr.Retry1(func() (int, error) { return unix.Write(fd, p) })
		if err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}
