package hwq

import (
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/eintr"
)

// Layouts of include/uapi/linux/ethtool.h for the SIOCETHTOOL ioctl. Padding is spelled
// out; uapi_test.go checks every size and offset against the C header.

// ethtoolFlowExt is struct ethtool_flow_ext (20 bytes, big-endian fields).
type ethtoolFlowExt struct {
	Padding   [2]byte
	HDest     [6]byte
	VlanEtype [2]byte
	VlanTCI   [2]byte
	Data      [8]byte
}

// flowUnionSize is sizeof(union ethtool_flow_union).
const flowUnionSize = 52

// ethtoolRxFlowSpec is struct ethtool_rx_flow_spec. H and M hold union ethtool_flow_union
// (the match values and their masks; a set mask bit means "compare this bit").
type ethtoolRxFlowSpec struct {
	FlowType   uint32
	H          [flowUnionSize]byte
	HExt       ethtoolFlowExt
	M          [flowUnionSize]byte
	MExt       ethtoolFlowExt
	_          [4]byte
	RingCookie uint64
	Location   uint32
	_          [4]byte
}

// ethtoolRxnfc is struct ethtool_rxnfc without its flexible rule_locs[] tail, which
// starts at rxnfcRuleLocsOff (inside this struct's trailing padding).
type ethtoolRxnfc struct {
	Cmd      uint32
	FlowType uint32
	Data     uint64
	FS       ethtoolRxFlowSpec
	RuleCnt  uint32 // union { rule_cnt; rss_context; }
	_        [4]byte
}

const rxnfcRuleLocsOff = 188 // offsetof(struct ethtool_rxnfc, rule_locs)

// ethtoolRxfh is struct ethtool_rxfh without its rss_config[] tail (indirection table of
// indir_size u32, then key_size key bytes).
type ethtoolRxfh struct {
	Cmd        uint32
	RSSContext uint32
	IndirSize  uint32
	KeySize    uint32
	HFunc      uint8
	InputXfrm  uint8 // rsvd8[0] before Linux 6.8
	Rsvd8      [2]uint8
	Rsvd32     uint32
}

const rxfhConfigOff = 24 // offsetof(struct ethtool_rxfh, rss_config)

// ifreqData is struct ifreq with ifr_data set (40 bytes on 64-bit Linux).
type ifreqData struct {
	Name [unix.IFNAMSIZ]byte
	Data unsafe.Pointer
	_    [16]byte
}

// ethtoolIoctl is the one wrapper for SIOCETHTOOL: data points at the command struct
// (and its tail), which the kernel reads and writes during the call. It retries EINTR.
func (c *Client) ethtoolIoctl(ifname string, data unsafe.Pointer) error {
	if ifname == "" || len(ifname) >= unix.IFNAMSIZ {
		return &ValueError{Name: "interface name", Value: ifname, Reason: "want 1..15 bytes"}
	}
	var ifr ifreqData
	copy(ifr.Name[:], ifname)
	ifr.Data = data
	return c.ioctl(func(fd int) error {
		e := eintr.Errno(func() unix.Errno {
			_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), siocEthtool, uintptr(unsafe.Pointer(&ifr)))
			return e
		})
		runtime.KeepAlive(&ifr)
		runtime.KeepAlive(data)
		if e != 0 {
			return os.NewSyscallError("ioctl SIOCETHTOOL", e)
		}
		return nil
	})
}

// rxnfcBuf allocates an ethtool_rxnfc followed by room for n rule locations, 8-byte
// aligned (the struct has a u64 member).
func rxnfcBuf(n int) ([]uint64, *ethtoolRxnfc) {
	words := (rxnfcRuleLocsOff + 4*n + 7) / 8
	words = max(words, int(unsafe.Sizeof(ethtoolRxnfc{}))/8)
	buf := make([]uint64, words)
	return buf, (*ethtoolRxnfc)(unsafe.Pointer(&buf[0]))
}

// ruleLocs returns the rule_locs[] tail of a buffer from rxnfcBuf.
func ruleLocs(buf []uint64, n int) []uint32 {
	p := unsafe.Add(unsafe.Pointer(&buf[0]), rxnfcRuleLocsOff)
	return unsafe.Slice((*uint32)(p), n)
}

// ifindex resolves an interface name in the Client's namespace (SIOCGIFINDEX).
func (c *Client) ifindex(ifname string) (int, error) {
	if ifname == "" || len(ifname) >= unix.IFNAMSIZ {
		return 0, &ValueError{Name: "interface name", Value: ifname, Reason: "want 1..15 bytes"}
	}
	var idx int
	err := c.ioctl(func(fd int) error {
		ifr, err := unix.NewIfreq(ifname)
		if err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
			return os.NewSyscallError("ioctl SIOCGIFINDEX", err)
		}
		idx = int(ifr.Uint32())
		return nil
	})
	return idx, err
}

// Ifindex returns the interface index of ifname in the Client's namespace.
func (c *Client) Ifindex(ifname string) (int, error) {
	idx, err := c.ifindex(ifname)
	return idx, opErr("ifindex", ifname, err)
}

// Driver returns the driver name (ETHTOOL_GDRVINFO) of ifname in the calling thread's
// network namespace without a Client (one ioctl on a socket of its own), "" when the device
// has no driver information (loopback).
func Driver(ifname string) (string, error) {
	if ifname == "" || len(ifname) >= unix.IFNAMSIZ {
		return "", opErr("drvinfo", ifname, &ValueError{Name: "interface name", Value: ifname, Reason: "want 1..15 bytes"})
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", opErr("drvinfo", ifname, os.NewSyscallError("socket", err))
	}
	defer unix.Close(fd)
	info, err := unix.IoctlGetEthtoolDrvinfo(fd, ifname)
	if notSupportedErrno(err) {
		return "", nil
	}
	if err != nil {
		return "", opErr("drvinfo", ifname, os.NewSyscallError("ioctl ETHTOOL_GDRVINFO", err))
	}
	return unix.ByteSliceToString(info.Driver[:]), nil
}

// Driver returns the device's driver name (ETHTOOL_GDRVINFO), "" when the device has no
// driver information (loopback).
func (c *Client) Driver(ifname string) (string, error) {
	var name string
	err := c.ioctl(func(fd int) error {
		info, err := unix.IoctlGetEthtoolDrvinfo(fd, ifname)
		if err != nil {
			return os.NewSyscallError("ioctl ETHTOOL_GDRVINFO", err)
		}
		name = unix.ByteSliceToString(info.Driver[:])
		return nil
	})
	if notSupportedErrno(err) {
		return "", nil
	}
	return name, opErr("drvinfo", ifname, err)
}
