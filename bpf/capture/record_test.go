package capture

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"
)

// rawRecord builds a ring record as the programs write it.
func rawRecord(h captureCapRecord, data []byte, extra int) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, h)
	b.Write(data)
	b.Write(make([]byte, extra))
	return b.Bytes()
}

func TestParseRecord(t *testing.T) {
	data := []byte("0123456789abcdef")
	h := captureCapRecord{Tstamp: 1e18, Hwtstamp: 7, Ifindex: 3, Len: 100, Caplen: 16, Queue: 2, Drops: 5, Cpu: 1,
		Hook: rawHookIngress, Flags: flagTruncated}
	p, err := parseRecord(rawRecord(h, data, 112))
	if err != nil {
		t.Fatal(err)
	}
	if p.TAI != 1e18 || p.HWTimestamp != 7 || p.Ifindex != 3 || p.Length != 100 || !bytes.Equal(p.Data, data) ||
		p.Queue != 1 || p.Drops != 5 || p.CPU != 1 || p.Hook != HookIngress || !p.Truncated() {
		t.Errorf("parsed %+v", p)
	}
	h.Queue = 0
	if p, _ := parseRecord(rawRecord(h, data, 0)); p.Queue != -1 {
		t.Errorf("queue_mapping 0 gave queue %d, want -1 (none)", p.Queue)
	}
	for name, bad := range map[string]func(*captureCapRecord){
		"caplen 0":           func(r *captureCapRecord) { r.Caplen = 0 },
		"caplen > len":       func(r *captureCapRecord) { r.Len = 10 },
		"caplen > record":    func(r *captureCapRecord) { r.Caplen = 17; r.Len = 200 },
		"caplen > max snap":  func(r *captureCapRecord) { r.Caplen = MaxSnap + 1; r.Len = 1 << 20 },
		"unknown hook":       func(r *captureCapRecord) { r.Hook = 9 },
		"flag disagrees":     func(r *captureCapRecord) { r.Flags = 0 },
		"timestamp overflow": func(r *captureCapRecord) { r.Tstamp = 1 << 63 },
	} {
		r := h
		bad(&r)
		if _, err := parseRecord(rawRecord(r, data, 0)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := parseRecord(make([]byte, recordHeaderSize-1)); err == nil {
		t.Error("short record accepted")
	}
}

// FuzzParseRecord: any bytes from the ring decode to a consistent packet
// or an error, never a panic.
func FuzzParseRecord(f *testing.F) {
	f.Add(rawRecord(captureCapRecord{Tstamp: 1, Len: 60, Caplen: 60, Hook: rawHookEgress}, make([]byte, 60), 68))
	f.Add(rawRecord(captureCapRecord{Tstamp: 1, Len: 9000, Caplen: 128, Hook: rawHookXDP, Flags: flagTruncated}, make([]byte, 128), 0))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parseRecord(b)
		if err != nil {
			return
		}
		if len(p.Data) < 1 || len(p.Data) > MaxSnap || len(p.Data) > p.Length || p.TAI < 0 ||
			len(p.Data)+recordHeaderSize > len(b) || p.Queue < -1 {
			t.Fatalf("inconsistent packet from %d bytes: %+v", len(b), p)
		}
	})
}

// testPackets is a synthetic capture of two interfaces.
func testPackets() []Packet {
	frame := func(n int, fill byte) []byte { return bytes.Repeat([]byte{fill}, n) }
	base := int64(1_700_000_000_123_456_789)
	return []Packet{
		{TAI: base, Ifindex: 7, Hook: HookIngress, Length: 60, Data: frame(60, 1), Queue: 3},
		{TAI: base + 1, Ifindex: 9, Hook: HookEgress, Length: 1514, Data: frame(128, 2), Queue: 0},
		{TAI: base + 1000, Ifindex: 7, Hook: HookXDP, Length: 66, Data: frame(66, 3), Queue: 1, Verdict: 2, Drops: 4, CPU: 1},
	}
}

// TestPcapngEncoding writes synthetic packets and reads them back with
// gopacket's reader and with tshark.
func TestPcapngEncoding(t *testing.T) {
	var buf bytes.Buffer
	ifaces := []Interface{{Index: 7, Name: "veth7", PHC: -1}, {Index: 9, Name: "eth9", HWTimestamping: true, PHC: 0}}
	w, err := newPcapWriter(&buf, pcapSection{Comment: "test capture", Snap: 128, Interfaces: ifaces, Hooks: HookIngress | HookEgress | HookXDP}, 37e9)
	if err != nil {
		t.Fatal(err)
	}
	pkts := testPackets()
	for i := range pkts {
		if err := w.packet(&pkts[i]); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Unix(1_700_000_000, 0)
	if err := w.stats(7, start, start.Add(time.Second), 10, 4); err != nil {
		t.Fatal(err)
	}
	if err := w.packet(&Packet{Ifindex: 8, Hook: HookIngress, Length: 1, Data: []byte{0}}); err == nil {
		t.Error("packet of an interface without a description accepted")
	}
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "syn.pcapng")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	r, got := readPcapng(t, path)
	if r.SectionInfo().Comment != "test capture" || !strings.Contains(r.SectionInfo().Application, "zcnet") {
		t.Errorf("section: %+v", r.SectionInfo())
	}
	if r.NInterfaces() != 2 {
		t.Fatalf("%d interfaces", r.NInterfaces())
	}
	for i, want := range []string{"veth7", "eth9"} {
		ifc, _ := r.Interface(i)
		if ifc.Name != want || ifc.TimestampResolution != 9 || ifc.SnapLength != 128 || ifc.LinkType != 1 {
			t.Errorf("interface %d: %+v", i, ifc)
		}
	}
	if ifc, _ := r.Interface(0); !strings.Contains(ifc.Description, "no hardware timestamping") {
		t.Errorf("veth7 description: %q", ifc.Description)
	}
	if ifc, _ := r.Interface(1); !strings.Contains(ifc.Description, "can timestamp in hardware") {
		t.Errorf("eth9 description: %q", ifc.Description)
	}
	if len(got) != len(pkts) {
		t.Fatalf("%d packets read, %d written", len(got), len(pkts))
	}
	for i, p := range pkts {
		g := got[i]
		if g.ts.UnixNano() != p.TAI-37e9 || g.length != p.Length || !bytes.Equal(g.data, p.Data) {
			t.Errorf("packet %d: ts %d len %d data %d bytes", i, g.ts.UnixNano(), g.length, len(g.data))
		}
		dir := pcapgo.NgEpbFlagDirectionInbound
		if p.Hook == HookEgress {
			dir = pcapgo.NgEpbFlagDirectionOutbound
		}
		if g.opts.Flags == nil || g.opts.Flags.Direction != dir {
			t.Errorf("packet %d: flags %+v", i, g.opts.Flags)
		}
	}
	if got[0].opts.Queue == nil || *got[0].opts.Queue != 3 || got[1].opts.Queue != nil {
		t.Errorf("queues: %v %v", got[0].opts.Queue, got[1].opts.Queue)
	}
	if got[2].opts.DropCount == nil || *got[2].opts.DropCount != 4 || len(got[2].opts.Comments) != 1 || len(got[2].opts.Verdicts) != 1 {
		t.Errorf("packet after a loss: %+v", got[2].opts)
	}
	if ifc, _ := r.Interface(0); ifc.Statistics.PacketsDropped != 4 || ifc.Statistics.PacketsReceived != 10 {
		t.Errorf("statistics: %+v", ifc.Statistics)
	}

	out := tshark(t, "-r", path, "-T", "fields", "-E", "separator=|", "-e", "frame.time_epoch", "-e", "frame.len",
		"-e", "frame.cap_len", "-e", "frame.interface_name", "-e", "frame.drop_count", "-e", "frame.interface_queue",
		"-e", "frame.comment", "-e", "frame.verdict.ebpf_xdp")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{
		"1699999963.123456789|60|60|veth7||3||",
		"1699999963.123456790|1514|128|eth9||||",
		"1699999963.123457789|66|66|veth7|4|1|4 packet(s) of the selected flows lost on this interface before this one (CPU 1): capture ring full|2",
	}
	if len(lines) != len(want) {
		t.Fatalf("tshark:\n%s", out)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("tshark line %d:\n got %q\nwant %q", i, lines[i], want[i])
		}
	}
}

// FuzzPcapngEncoding: packets of any shape encode to pcapng that an
// independent decoder (gopacket's reader) reads back the same.
func FuzzPcapngEncoding(f *testing.F) {
	f.Add(int64(1e18), 60, []byte("abc"), uint8(1), 3, 0, uint8(2))
	f.Add(int64(0), 1, []byte{0}, uint8(2), -1, 7, uint8(0))
	f.Fuzz(func(t *testing.T, tai int64, length int, data []byte, hook uint8, queue, drops int, verdict uint8) {
		if len(data) == 0 || len(data) > MaxSnap || length < len(data) || length > 1<<30 || tai < 0 || queue < -1 || drops < 0 || drops > 1<<31 {
			return
		}
		p := Packet{TAI: tai, Ifindex: 1, Hook: Hook(1) << (hook % 3), Length: length, Data: data, Queue: queue, Drops: drops, Verdict: verdict}
		var buf bytes.Buffer
		w, err := newPcapWriter(&buf, pcapSection{Snap: MaxSnap, Interfaces: []Interface{{Index: 1, Name: "x"}}, Hooks: p.Hook}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.packet(&p); err != nil {
			t.Fatal(err)
		}
		if err := w.flush(); err != nil {
			t.Fatal(err)
		}
		r, err := pcapgo.NewNgReader(&buf, pcapgo.NgReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got, ci, opts, err := r.ReadPacketDataWithOptions()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) || ci.Length != length || ci.Timestamp.UnixNano() != tai {
			t.Fatalf("read back len %d/%d ts %d, wrote %d/%d ts %d", len(got), ci.Length, ci.Timestamp.UnixNano(), len(data), length, tai)
		}
		if (drops > 0) != (opts.DropCount != nil) || (opts.DropCount != nil && *opts.DropCount != uint64(drops)) {
			t.Fatalf("drop count %v, wrote %d", opts.DropCount, drops)
		}
		if _, _, err := r.ReadPacketData(); !errors.Is(err, io.EOF) {
			t.Fatalf("after the packet: %v", err)
		}
	})
}
