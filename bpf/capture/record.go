package capture

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// Hook is a point in the kernel where packets are captured.
type Hook uint32

const (
	// HookIngress: tcx ingress, attached first. Sees what the stack is
	// about to receive: after XDP (and its cpumap redirect) and after GRO,
	// so coalesced segments show as one larger packet.
	HookIngress Hook = 1 << iota
	// HookEgress: tcx egress, attached last (after zcnet's steering
	// program chose the TX queue). Sees what the stack sends, GSO packets
	// still unsplit (64 KiB, more with BIG TCP).
	HookEgress
	// HookXDP: fexit of the XDP program attached to the interface (zcnet's
	// zc_xdp or any other): frames as the driver delivered them, before
	// GRO, with their RX queue and the XDP verdict. Only the linear part
	// of a multi-buffer frame is recorded. Needs an XDP program attached.
	HookXDP
)

func (h Hook) String() string {
	switch h {
	case HookIngress:
		return "tc ingress"
	case HookEgress:
		return "tc egress"
	case HookXDP:
		return "xdp"
	}
	return fmt.Sprintf("hooks %#x", uint32(h))
}

// Hook numbers in cap_record.hook (capture.h CAP_HOOK_*).
const (
	rawHookIngress = 1
	rawHookEgress  = 2
	rawHookXDP     = 3
)

// recordHeaderSize is sizeof(struct cap_record).
const recordHeaderSize = int(unsafe.Sizeof(captureCapRecord{}))

// flagTruncated is CAP_F_TRUNCATED.
const flagTruncated = 1

// Packet is one captured packet.
type Packet struct {
	// TAI is the kernel's CLOCK_TAI time in nanoseconds when the hook ran
	// (bpf_ktime_get_tai_ns; a software timestamp).
	TAI int64
	// HWTimestamp is the NIC's hardware RX timestamp in nanoseconds of its
	// clock, when the driver recorded one (hardware RX timestamping
	// enabled on the NIC); 0 otherwise. Never set on veth or lo.
	HWTimestamp int64
	Ifindex     int
	Hook        Hook
	// Length is the packet's length at the hook; Data holds its first
	// len(Data) bytes (the snap length), from the Ethernet header on.
	Length int
	Data   []byte
	// Queue is the RX queue (ingress, XDP) or the TX queue requested by a
	// tc program such as zcnet's steering (egress), -1 if none recorded.
	Queue int
	// Drops is the number of packets of this interface that were lost on
	// this CPU because the ring was full since the previous packet.
	Drops int
	CPU   int
	// Verdict is the XDP program's action (XDP_PASS = 2, ...), for HookXDP.
	Verdict uint8

	seq uint64 // ring order, to keep it among equal timestamps
	buf []byte // the record Data points into, reused once written
}

// Truncated reports whether fewer bytes than the packet had were captured.
func (p *Packet) Truncated() bool { return len(p.Data) < p.Length }

// parseRecord decodes one ring-buffer record (struct cap_record followed
// by caplen bytes). data aliases b; copy it to keep it.
func parseRecord(b []byte) (Packet, error) {
	if len(b) < recordHeaderSize {
		return Packet{}, fmt.Errorf("record of %d bytes is shorter than its %d-byte header", len(b), recordHeaderSize)
	}
	le := binary.LittleEndian // the objects are built for little-endian hosts only (bpfel)
	var r captureCapRecord
	r.Tstamp = le.Uint64(b[0:])
	r.Hwtstamp = le.Uint64(b[8:])
	r.Ifindex = le.Uint32(b[16:])
	r.Len = le.Uint32(b[20:])
	r.Caplen = le.Uint32(b[24:])
	r.Queue = le.Uint32(b[28:])
	r.Drops = le.Uint32(b[32:])
	r.Cpu = le.Uint32(b[36:])
	r.Hook = b[40]
	r.Verdict = b[41]
	r.Flags = le.Uint16(b[42:])
	p := Packet{
		TAI:         int64(r.Tstamp),
		HWTimestamp: int64(r.Hwtstamp),
		Ifindex:     int(r.Ifindex),
		Length:      int(r.Len),
		Queue:       int(r.Queue) - 1,
		Drops:       int(r.Drops),
		CPU:         int(r.Cpu),
		Verdict:     r.Verdict,
	}
	switch r.Hook {
	case rawHookIngress:
		p.Hook = HookIngress
	case rawHookEgress:
		p.Hook = HookEgress
	case rawHookXDP:
		p.Hook = HookXDP
	default:
		return Packet{}, fmt.Errorf("unknown hook %d", r.Hook)
	}
	switch {
	case r.Caplen == 0 || r.Caplen > MaxSnap:
		return Packet{}, fmt.Errorf("captured length %d outside 1..%d", r.Caplen, MaxSnap)
	case r.Caplen > r.Len:
		return Packet{}, fmt.Errorf("captured length %d exceeds the packet's %d", r.Caplen, r.Len)
	case int(r.Caplen) > len(b)-recordHeaderSize:
		return Packet{}, fmt.Errorf("captured length %d but the record holds %d bytes", r.Caplen, len(b)-recordHeaderSize)
	case (r.Flags&flagTruncated != 0) != (r.Caplen < r.Len):
		return Packet{}, fmt.Errorf("truncation flag %#x disagrees with lengths %d/%d", r.Flags, r.Caplen, r.Len)
	case r.Tstamp > 1<<63-1:
		return Packet{}, fmt.Errorf("timestamp %d out of range", r.Tstamp)
	}
	p.Data = b[recordHeaderSize : recordHeaderSize+int(r.Caplen)]
	return p, nil
}
