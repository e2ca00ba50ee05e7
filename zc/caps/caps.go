// Package caps reports what this kernel and process can do for zcnet, decided by probing
// (the report zcprobe prints): io_uring and its features, zero-copy send and receive, BPF
// steering, the zcshim module, and a per-NIC section (hwq). A nil error in the report means
// available; otherwise the error says why not, matching zc.ErrNotSupported (the sentinel
// every zcnet package shares) when the kernel lacks the feature. zc.New probes again at every
// call on its own: this report is for people and for tests that decide what to expect.
package caps

import (
	"errors"
	"fmt"
	"strings"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/hwq"
	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/kmod/shim"
	"github.com/zcnet/zcnet/tcpglue"
)

// Report says what this kernel and process can do for zcnet. A nil error means available;
// otherwise the error says why not (matching ErrNotSupported when the kernel lacks the
// feature).
type Report struct {
	IOUring        error  // io_uring can be set up
	IOUringFeature uint32 // IORING_FEAT_* word
	SendZC         error  // IORING_OP_SEND_ZC
	RecvBundle     error  // multishot recv bundles (6.10+)
	// RecvLimit: a multishot receive takes a limit on its total bytes (6.17+), so an io_uring
	// connection never receives more than its remaining credit (MaxRecvHeld). Without it a
	// connection far from its credit receives with an unlimited multishot receive and can
	// overshoot by what arrives before the credit pause lands (up to the socket's queue).
	RecvLimit    error
	DeferTaskrun error // SINGLE_ISSUER|DEFER_TASKRUN rings
	MappedRecv   error // TCP_ZEROCOPY_RECEIVE
	BPFSteering  error // the sk_reuseport/sockops/XDP/tc programs load
	Shim         error // the zcshim module's /dev/zcshim is usable

	// NICs is the per-NIC report of the caller's network namespace (hwq.ProbeAll): queues,
	// header split, ntuple, RSS, zcrx, devmem, AF_XDP zero-copy, hardware timestamps and
	// the "special NIC" flag, each with its reason. NICsErr says why it is missing.
	NICs    []hwq.NIC
	NICsErr error
}

// Probe probes the machine once per call (io_uring's part is cached per process).
func Probe() Report {
	var c Report
	u := uring.DetectCapabilities()
	c.IOUring = u.Err
	c.IOUringFeature = u.Features
	if u.Err == nil {
		c.SendZC = u.NeedOp(uring.OpSendZC, "SEND_ZC", "6.0")
		if !u.Has(uring.FeatRecvsendBundle) {
			c.RecvBundle = fmt.Errorf("io_uring recv bundles (Linux 6.10+): %w", errs.ErrNotSupported)
		}
		if !u.RecvMultishotLimit {
			c.RecvLimit = fmt.Errorf("a total limit on multishot io_uring recv (Linux 6.17+): %w", errs.ErrNotSupported)
		}
		if !u.SetupOK(uring.SetupSingleIssuer | uring.SetupDeferTaskrun) {
			c.DeferTaskrun = fmt.Errorf("IORING_SETUP_DEFER_TASKRUN (Linux 6.1+): %w", errs.ErrNotSupported)
		}
	} else {
		c.SendZC, c.RecvBundle, c.RecvLimit, c.DeferTaskrun = u.Err, u.Err, u.Err, u.Err
	}
	c.MappedRecv = tcpglue.ProbeZeroCopyReceive()
	c.BPFSteering = bpf.Probe()
	c.Shim = shimProbe()
	c.NICs, c.NICsErr = hwq.ProbeAll()
	return c
}

// String is a human-readable report, one line per capability.
func (c Report) String() string {
	var b strings.Builder
	line := func(name string, err error) {
		if err == nil {
			fmt.Fprintf(&b, "%-14s yes\n", name)
		} else {
			fmt.Fprintf(&b, "%-14s no: %v\n", name, err)
		}
	}
	line("io_uring", c.IOUring)
	if c.IOUring == nil {
		fmt.Fprintf(&b, "%-14s %#x\n", "  features", c.IOUringFeature)
	}
	line("send_zc", c.SendZC)
	line("recv bundles", c.RecvBundle)
	line("recv limit", c.RecvLimit)
	line("defer taskrun", c.DeferTaskrun)
	line("mapped recv", c.MappedRecv)
	line("bpf steering", c.BPFSteering)
	line("zcshim", c.Shim)
	if c.NICsErr != nil {
		line("nics", c.NICsErr)
	}
	for _, n := range c.NICs {
		fmt.Fprintf(&b, "nic %s", n)
	}
	return b.String()
}

// shimProbe is the zcshim module's probe, its "cannot" errors matching ErrNotSupported (as
// zc's backend choice sees them).
func shimProbe() error {
	err := shim.Probe()
	if err != nil && errors.Is(err, shim.ErrABIMismatch) && !errors.Is(err, errs.ErrNotSupported) {
		return fmt.Errorf("%w: %w", errs.ErrNotSupported, err)
	}
	return err
}
