package capture

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/hwq"
	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/memreg"
)

// TestRawQueueCapture: frames a raw queue receives, written with RawWriter, read back from
// the pcapng file (gopacket's reader, and tshark where installed) byte for byte.
func TestRawQueueCapture(t *testing.T) {
	requireRoot(t)
	v := newVethPair(t, 1)
	r, err := memreg.New(memreg.Options{BufSize: 2048, Count: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	q, err := hwq.OpenRawQueue(v.SrvIf, 0, r, &hwq.RawQueueOptions{NetNS: v.Srv.Fd(), RingSize: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := q.Steering().AddRule(bpf.RawRule{Dst: v.SrvAddr, Proto: unix.IPPROTO_UDP, DstPort: 6200}); err != nil {
		t.Fatal(err)
	}
	var ifi Interface
	v.In(t, v.Srv, func() error {
		var err error
		ifi, err = ProbeInterface(v.SrvIdx)
		return err
	})
	path := filepath.Join(t.TempDir(), "raw.pcapng")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := NewRawWriter(f, RawWriterOptions{Interfaces: []Interface{ifi}, Comment: "test"})
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	if err := netns.Do(v.Cli.Fd(), func() error {
		c, err := net.Dial("udp4", (&net.UDPAddr{IP: v.SrvAddr.AsSlice(), Port: 6200}).String())
		if err != nil {
			return err
		}
		defer c.Close()
		for i := range n {
			if _, err := c.Write(bytes.Repeat([]byte{byte(i)}, 10+i*20)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var want [][]byte
	frames := make([]hwq.Frame, 16)
	q.SetReadDeadline(time.Now().Add(10 * time.Second))
	for len(want) < n {
		k, err := q.Receive(frames)
		if err != nil {
			t.Fatal(err)
		}
		for _, fr := range frames[:k] {
			want = append(want, append([]byte(nil), fr.Bytes()...))
			if err := w.Write(q, fr, time.Now()); err != nil {
				t.Fatal(err)
			}
			fr.Buf.Release()
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	rd, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	var got [][]byte
	for {
		data, ci, err := rd.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ci.Length != len(data) {
			t.Fatalf("packet %d truncated: %d of %d", len(got), len(data), ci.Length)
		}
		got = append(got, data)
	}
	if len(got) != n {
		t.Fatalf("file holds %d frames, want %d", len(got), n)
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d differs in the file", i)
		}
	}
	if _, err := exec.LookPath("tshark"); err == nil {
		out := tshark(t, "-r", path, "-T", "fields", "-e", "udp.dstport")
		if c := strings.Count(out, "6200"); c != n {
			t.Fatalf("tshark reads %d UDP frames to port 6200, want %d", c, n)
		}
	}
}

// TestRawWriterClosedFile: a RawWriter on a file that was closed fails at New (the header
// is written through) or at the first Write (the file is checked at every Write), not only
// at Close: it had accepted 100 Writes and counted 100 frames. No raw queue is needed: a
// frame is a region buffer, and a RawQueue's zero value names ifindex 0, queue 0.
func TestRawWriterClosedFile(t *testing.T) {
	r, err := memreg.New(memreg.Options{BufSize: 2048, Count: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := r.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	fr := hwq.Frame{Buf: b, Len: 60}
	ifi := Interface{Index: 0, Name: "test", PHC: -1}
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "a.pcapng"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := NewRawWriter(f, RawWriterOptions{Interfaces: []Interface{ifi}}); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("NewRawWriter on a closed file: %v, want os.ErrClosed", err)
	}
	f2, err := os.Create(filepath.Join(dir, "b.pcapng"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewRawWriter(f2, RawWriterOptions{Interfaces: []Interface{ifi}})
	if err != nil {
		t.Fatal(err)
	}
	q := new(hwq.RawQueue)
	if err := w.Write(q, fr, time.Now()); err != nil {
		t.Fatal(err)
	}
	f2.Close()
	for i := range 100 {
		if err := w.Write(q, fr, time.Now()); !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Write %d on the closed file: %v, want os.ErrClosed", i, err)
		}
	}
	if w.Frames() != 1 {
		t.Fatalf("%d frames counted, want the 1 written before the file closed", w.Frames())
	}
	if err := w.Close(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Close: %v", err)
	}
}
