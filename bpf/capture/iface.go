package capture

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/hwq"
	"github.com/zcnet/zcnet/internal/bpferr"
)

// Interface describes an interface a capture is attached to, and what it
// can do for timestamps.
type Interface struct {
	Index int
	Name  string
	// HWTimestamping: the NIC can timestamp received packets in hardware
	// (ethtool's timestamping info has SOF_TIMESTAMPING_RX_HARDWARE and
	// RAW_HARDWARE). veth and lo cannot.
	HWTimestamping bool
	// HWTxTimestamping: likewise for sent packets.
	HWTxTimestamping bool
	// PHC is the index of the NIC's PTP hardware clock (/dev/ptpN), -1 if
	// it has none.
	PHC int
	// TimestampInfoErr is why the timestamping info could not be read
	// (hwq's ethtool tsinfo query failed); nil when it was read.
	TimestampInfoErr error
}

// Timestamps says where a capture's timestamps on this interface come
// from; it is written into the pcapng interface description.
func (i Interface) Timestamps() string {
	s := "software: CLOCK_TAI read by the capture program at the hook (bpf_ktime_get_tai_ns), converted to UTC"
	switch {
	case i.TimestampInfoErr != nil:
		return s + "; NIC hardware timestamping unknown (" + i.TimestampInfoErr.Error() + ")"
	case i.HWTimestamping:
		return s + fmt.Sprintf("; the NIC can timestamp in hardware (PTP clock %d): with hardware RX timestamping enabled (SIOCSHWTSTAMP) each packet's hardware stamp is kept in Packet.HWTimestamp", i.PHC)
	}
	return s + "; no hardware timestamping on this interface"
}

// ProbeInterface reports an interface's name and timestamping abilities
// (hwq's ethtool tsinfo query, as ethtool -T), by index in the calling
// thread's network namespace.
func ProbeInterface(ifindex int) (Interface, error) {
	op := fmt.Sprintf("probe ifindex %d", ifindex)
	name, err := ifName(ifindex)
	if err != nil {
		return Interface{}, opErr(op, err)
	}
	i := Interface{Index: ifindex, Name: name, PHC: -1}
	hc, err := hwq.Open(hwq.Options{})
	if err != nil {
		i.TimestampInfoErr = err
		return i, nil
	}
	defer hc.Close()
	ts, err := hc.TSInfo(name)
	if err != nil {
		i.TimestampInfoErr = err
		return i, nil
	}
	const raw = hwq.TimestampingRawHardware
	i.HWTimestamping = ts.Timestamping&(hwq.TimestampingRXHardware|raw) == hwq.TimestampingRXHardware|raw
	i.HWTxTimestamping = ts.Timestamping&(hwq.TimestampingTXHardware|raw) == hwq.TimestampingTXHardware|raw
	i.PHC = ts.PHCIndex
	return i, nil
}

// ifName is bpferr.IfName (shared by bpf and capture).
var ifName = bpferr.IfName

// xdpProgID returns the ID of the XDP program attached to the interface
// (netlink RTM_GETLINK, IFLA_XDP), 0 if none.
func xdpProgID(ifindex int) (uint32, error) {
	b, err := syscall.NetlinkRIB(syscall.RTM_GETLINK, syscall.AF_UNSPEC)
	if err != nil {
		return 0, os.NewSyscallError("netlink RTM_GETLINK", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return 0, err
	}
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != syscall.RTM_NEWLINK || len(m.Data) < syscall.SizeofIfInfomsg {
			continue
		}
		// struct ifinfomsg: family, pad, type (u16), index (s32) at offset 4.
		if int(int32(nativeUint32(m.Data[4:]))) != ifindex {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if a.Attr.Type&^unix.NLA_F_NESTED != unix.IFLA_XDP {
				continue
			}
			return xdpAttrProgID(a.Value), nil
		}
		return 0, nil
	}
	return 0, fmt.Errorf("%w: no interface with index %d in this network namespace", ErrInvalid, ifindex)
}

// xdpAttrProgID reads IFLA_XDP's nested attributes: IFLA_XDP_PROG_ID when
// one program is attached, else the generic (skb) or driver mode one.
func xdpAttrProgID(b []byte) uint32 {
	const (
		iflaXDPProgID    = 4
		iflaXDPDrvProgID = 5
		iflaXDPSkbProgID = 6
	)
	ids := map[uint16]uint32{}
	for len(b) >= unix.SizeofRtAttr {
		l := int(nativeUint16(b[0:]))
		t := nativeUint16(b[2:]) &^ unix.NLA_F_NESTED
		if l < unix.SizeofRtAttr || l > len(b) {
			break
		}
		if l >= unix.SizeofRtAttr+4 {
			ids[t] = nativeUint32(b[unix.SizeofRtAttr:])
		}
		adv := (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
		if adv > len(b) {
			break
		}
		b = b[adv:]
	}
	for _, t := range []uint16{iflaXDPProgID, iflaXDPSkbProgID, iflaXDPDrvProgID} {
		if id := ids[t]; id != 0 {
			return id
		}
	}
	return 0
}
