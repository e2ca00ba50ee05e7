package capture

import (
	"encoding/binary"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"golang.org/x/sys/unix"
)

// pcapWriter encodes packets as pcapng with gopacket's pcapgo.NgWriter
// (maintained, and it writes every block and option needed here: section
// header, interface descriptions with if_tsresol 9, enhanced packet blocks
// with comments, flags, drop count, queue and verdict, interface
// statistics). One interface description per interface, in the order
// given; timestamps are nanoseconds since the Unix epoch (UTC).
type pcapWriter struct {
	w      *pcapgo.NgWriter
	idb    map[int]int // ifindex -> interface id in the file
	taiOff int64       // CLOCK_TAI - CLOCK_REALTIME in ns (a whole number of seconds)
	snap   int         // the snap length written in the interface descriptions
}

// pcapSection is what the section header and the interface descriptions say.
type pcapSection struct {
	Comment    string // the section's comment (what was captured)
	Snap       int
	Interfaces []Interface
	Hooks      Hook
}

func osDescription() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return runtime.GOOS
	}
	return unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:])
}

func newPcapWriter(out io.Writer, s pcapSection, taiOff int64) (*pcapWriter, error) {
	if len(s.Interfaces) == 0 {
		return nil, fmt.Errorf("%w: no interface", ErrInvalid)
	}
	osd := osDescription()
	opts := pcapgo.NgWriterOptions{SectionInfo: pcapgo.NgSectionInfo{
		Hardware:    runtime.GOARCH,
		OS:          osd,
		Application: "zcnet capture (github.com/zcnet/zcnet/bpf/capture)",
		Comment:     s.Comment,
	}}
	idb := func(i Interface) pcapgo.NgInterface {
		return pcapgo.NgInterface{
			Name:                i.Name,
			Description:         fmt.Sprintf("ifindex %d, %s; timestamps: %s", i.Index, hooksText(s.Hooks), i.Timestamps()),
			OS:                  osd,
			LinkType:            layers.LinkTypeEthernet,
			TimestampResolution: 9, // nanoseconds (NgWriter writes if_tsresol 9)
			SnapLength:          uint32(s.Snap),
		}
	}
	w, err := pcapgo.NewNgWriterInterface(out, idb(s.Interfaces[0]), opts)
	if err != nil {
		return nil, err
	}
	p := &pcapWriter{w: w, idb: map[int]int{s.Interfaces[0].Index: 0}, taiOff: taiOff, snap: s.Snap}
	for _, i := range s.Interfaces[1:] {
		id, err := w.AddInterface(idb(i))
		if err != nil {
			return nil, err
		}
		p.idb[i.Index] = id
	}
	return p, nil
}

func hooksText(h Hook) string {
	s := ""
	for _, one := range []Hook{HookXDP, HookIngress, HookEgress} {
		if h&one != 0 {
			if s != "" {
				s += " + "
			}
			s += one.String()
		}
	}
	return "captured at " + s
}

// utc converts a CLOCK_TAI nanosecond time to UTC.
func (p *pcapWriter) utc(tai int64) time.Time { return time.Unix(0, tai-p.taiOff) }

// packet writes one enhanced packet block.
func (p *pcapWriter) packet(pk *Packet) error {
	id, ok := p.idb[pk.Ifindex]
	if !ok {
		return fmt.Errorf("packet from ifindex %d, which the capture is not attached to", pk.Ifindex)
	}
	ci := gopacket.CaptureInfo{
		Timestamp:      p.utc(pk.TAI),
		CaptureLength:  len(pk.Data),
		Length:         pk.Length,
		InterfaceIndex: id,
	}
	var o pcapgo.NgPacketOptions
	flags := pcapgo.NgEpbFlags{Direction: pcapgo.NgEpbFlagDirectionInbound}
	if pk.Hook == HookEgress {
		flags.Direction = pcapgo.NgEpbFlagDirectionOutbound
	}
	o.Flags = &flags
	if pk.Queue >= 0 && pk.Hook != HookEgress {
		// epb_queue is the queue a packet was received on; an egress
		// packet's requested TX queue is only in Packet.Queue.
		q := uint32(pk.Queue)
		o.Queue = &q
	}
	if pk.Drops > 0 {
		d := uint64(pk.Drops)
		o.DropCount = &d
		o.Comments = append(o.Comments, fmt.Sprintf("%d packet(s) of the selected flows lost on this interface before this one (CPU %d): capture ring full", pk.Drops, pk.CPU))
	}
	if pk.Hook == HookXDP {
		var v [8]byte
		binary.LittleEndian.PutUint64(v[:], uint64(pk.Verdict))
		o.Verdicts = []pcapgo.NgEpbVerdict{{Type: pcapgo.NgEpbVerdictTypeLinuxeBPFXDP, Data: v[:]}}
	}
	return p.w.WritePacketWithOptions(ci, pk.Data, o)
}

// stats writes an interface statistics block.
func (p *pcapWriter) stats(ifindex int, start, end time.Time, matched, dropped uint64) error {
	id, ok := p.idb[ifindex]
	if !ok {
		return nil
	}
	return p.w.WriteInterfaceStats(id, pcapgo.NgInterfaceStatistics{
		LastUpdate:      end,
		StartTime:       start,
		EndTime:         end,
		PacketsReceived: matched,
		PacketsDropped:  dropped,
	})
}

func (p *pcapWriter) flush() error { return p.w.Flush() }
