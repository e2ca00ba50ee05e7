package hwq

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/errs"
)

// ErrNotSupported means this kernel, driver or NIC cannot do what was asked. Match it with
// errors.Is; errors.As with *NotSupportedError gives the feature and what it needs.
// It is the one sentinel every zcnet package shares.
var ErrNotSupported = errs.ErrNotSupported

// NotSupportedError is a refusal with its reason: What was asked, what it Needs, and the
// cause. It matches ErrNotSupported. (The same type as zc.NotSupportedError.)
type NotSupportedError = errs.NotSupportedError

// OpError is the error of every failed operation of this package. Op names the operation
// ("channels get", "ntuple insert", "bind"), Iface the interface it was applied to (empty
// when none), and Err is the cause: a netlink error (*netlink.OpError wrapping the errno and
// the kernel's extended-ack message), an *os.SyscallError for ioctls, a refusal matching
// ErrNotSupported, or a *ValueError for an argument rejected before any system call.
type OpError struct {
	Op    string
	Iface string
	Err   error
}

func (e *OpError) Error() string {
	var b strings.Builder
	b.WriteString("hwq: ")
	b.WriteString(e.Op)
	if e.Iface != "" {
		b.WriteString(" ")
		b.WriteString(e.Iface)
	}
	b.WriteString(": ")
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("unknown error")
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

// ErrInvalid means an argument was rejected (a *ValueError): nothing was changed. It is
// the same sentinel as bpf.ErrInvalid, so a raw queue's refusals and its steering
// program's match one value.
var ErrInvalid = bpf.ErrInvalid

// ValueError reports an argument rejected before any system call, or found unusable by
// one. It matches ErrInvalid.
type ValueError struct {
	Name   string
	Value  any
	Reason string
}

// Is makes a *ValueError match ErrInvalid.
func (e *ValueError) Is(target error) bool { return target == ErrInvalid }

func (e *ValueError) Error() string {
	return fmt.Sprintf("invalid %s %v: %s", e.Name, e.Value, e.Reason)
}

func opErr(op, iface string, err error) error {
	if err == nil {
		return nil
	}
	return &OpError{Op: op, Iface: iface, Err: err}
}

// notSupportedErrno reports whether err is the kernel's way of saying "this device or
// kernel cannot": EOPNOTSUPP (ENOTSUP is the same number on Linux).
func notSupportedErrno(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP)
}

// refuse turns EOPNOTSUPP into a *errs.NotSupportedError naming the feature and what it
// needs; other errors pass unchanged.
func refuse(err error, what, need string) error {
	if err == nil || !notSupportedErrno(err) {
		return err
	}
	return errs.NotSupported(what, need, err)
}

// What the refusals name. Kept in one place so tests and docs agree.
const (
	featChannels    = "ethtool channels (ethtool -l/-L)"
	needChannels    = "a multi-queue driver with get_channels/set_channels"
	featRings       = "ethtool ring parameters (ethtool -g/-G)"
	needRings       = "a NIC driver with get_ringparam"
	featHeaderSplit = "header split (ethtool -G tcp-data-split on)"
	needHeaderSplit = "a NIC driver with TCP header/data split (bnxt, mlx5, gve, fbnic, ...)"
	featHDSThresh   = "header split threshold (ethtool -G hds-thresh)"
	needHDSThresh   = "Linux 6.14+ and a NIC driver that reports hds-thresh-max"
	featNtuple      = "ntuple filters"
	needNtuple      = "a NIC driver with ethtool -N support"
	featRSS         = "RSS indirection table (ethtool -x/-X)"
	needRSS         = "a multi-queue NIC driver with RSS"
	featRSSContext  = "additional RSS contexts (ethtool -X context new)"
	needRSSContext  = "a NIC driver with RSS context support"
	featTSInfo      = "timestamping information (ethtool -T)"
	needTSInfo      = "ethtool netlink (Linux 5.11+)"
	featFeatures    = "ethtool features (ethtool -k/-K)"
	needFeatures    = "ethtool netlink (Linux 5.6+)"
	featNetdev      = "netdev netlink family"
	needNetdev      = "Linux 6.3+ (queue-get and napi-get: 6.9+)"
	featEthtoolNL   = "ethtool netlink family"
	needEthtoolNL   = "Linux 5.6+ with CONFIG_ETHTOOL_NETLINK=y"
)

func notSupported(what, need string) error { return errs.NotSupported(what, need, nil) }
