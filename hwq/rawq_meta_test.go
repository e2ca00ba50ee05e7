package hwq

import (
	"errors"
	"testing"

	"github.com/zcnet/zcnet/bpf"
)

// TestRawMetadata: with Metadata the device-bound program asks veth for the RX hash and
// timestamp (XDP RX metadata kfuncs) and puts them before each redirected frame; the hash
// is the kernel's flow hash (non-zero, equal for the frames of one flow).
func TestRawMetadata(t *testing.T) {
	e := newRawEnv(t, 1)
	q := e.openRaw(t, 0, newRegion(t, 256), &RawQueueOptions{Metadata: true})
	s := q.Steering()
	on, why := s.Metadata()
	if !on {
		t.Fatalf("metadata not available on veth: %v", why)
	}
	if _, err := s.AddRule(bpf.RawRule{DstPort: 6100}); err != nil {
		t.Fatal(err)
	}
	pk := newPacketSock(t, e.Cli, e.CliIf)
	const n = 20
	for i := range n {
		pk.send(t, frameSpec{dstMAC: e.srvMAC, srcMAC: e.cliMAC, src: e.CliAddr, dst: e.SrvAddr,
			sport: 6101, dport: 6100, payload: payload("meta", i, 64)}.build())
	}
	var hashes []uint32
	var tsCount int
	got := 0
	frames := make([]Frame, 64)
	for got < n {
		k, err := q.Receive(frames)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range frames[:k] {
			m, ok := f.Meta()
			if !ok {
				t.Fatalf("frame %d has no metadata (offset %d)", got, f.Off)
			}
			if !m.HasHash {
				t.Fatalf("frame %d: no RX hash in %+v", got, m)
			}
			hashes = append(hashes, m.Hash)
			if m.HasTimestamp {
				tsCount++
			}
			f.Buf.Release()
			got++
		}
	}
	for _, h := range hashes {
		if h == 0 || h != hashes[0] {
			t.Fatalf("RX hashes of one flow: %x", hashes)
		}
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.MetaHash != n {
		t.Fatalf("program counted %d hashes, want %d", st.MetaHash, n)
	}
	t.Logf("hash %#x on all %d frames; %d frames carried a timestamp (veth has no hardware clock: its value is the skb's hardware stamp, 0)", hashes[0], n, tsCount)
}

// TestRawMetadataNotSupported: where the device-bound program cannot run (loopback has no
// native XDP), a queue asking for metadata runs without it, and says why with an error
// matching ErrNotSupported, counted.
func TestRawMetadataNotSupported(t *testing.T) {
	e := newRawEnv(t, 1)
	_, before := bpf.RawFallbacks()
	q, err := OpenRawQueue("lo", 0, newRegion(t, 64), &RawQueueOptions{NetNS: e.Srv.Fd(), Metadata: true})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	on, why := q.Steering().Metadata()
	_, after := bpf.RawFallbacks()
	if on || !errors.Is(why, ErrNotSupported) || after != before+1 {
		t.Fatalf("metadata on lo: %v, %v (fallbacks %d -> %d); want off, ErrNotSupported, counted", on, why, before, after)
	}
}
