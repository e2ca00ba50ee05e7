package hwq

import (
	"net/netip"
	"testing"

	"github.com/zcnet/zcnet/bpf"
)

// TestRawDropsCounted: frames the raw queue cannot take are counted, never lost silently —
// with the application not reading, the RX ring fills (RxRingFull); with the application
// holding every buffer, the fill ring runs dry (RxDropped, FillRingEmpty, FillShort). In
// both cases frames received + frames counted as dropped = frames redirected.
func TestRawDropsCounted(t *testing.T) {
	const n = 300
	for _, c := range []struct {
		name           string
		bufs, ring, fq int
	}{
		{"rx-ring-full", 1024, 64, 512},
		{"fill-ring-empty", 32, 64, 64},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newRawEnv(t, 1)
			// Receive only: the whole region may go to the fill ring.
			q := e.openRaw(t, 0, newRegion(t, c.bufs), &RawQueueOptions{RingSize: c.ring, FillSize: c.fq, TxReserve: -1})
			s := q.Steering()
			if _, err := s.AddRule(bpf.RawRule{DstPort: 6000}); err != nil {
				t.Fatal(err)
			}
			pk := newPacketSock(t, e.Cli, e.CliIf)
			for i := range n {
				pk.send(t, frameSpec{dstMAC: e.srvMAC, srcMAC: e.cliMAC, src: e.CliAddr, dst: e.SrvAddr,
					sport: 6001, dport: 6000, payload: payload("drop", i, 100)}.build())
			}
			waitSeen(t, s, n)
			// Hold everything received: nothing goes back to the fill ring.
			var held []Frame
			frames := make([]Frame, 64)
			for {
				k, err := q.TryReceive(frames)
				if err != nil {
					t.Fatal(err)
				}
				if k == 0 {
					break
				}
				held = append(held, frames[:k]...)
			}
			st, err := q.Stats()
			if err != nil {
				t.Fatal(err)
			}
			ss, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("received %d, stats %+v", len(held), st)
			if ss.Redirect != n {
				t.Fatalf("program redirected %d frames, want %d", ss.Redirect, n)
			}
			if got := uint64(len(held)) + st.RxRingFull + st.RxDropped; got != n {
				t.Fatalf("received %d + ring full %d + dropped %d = %d, want %d", len(held), st.RxRingFull, st.RxDropped, got, n)
			}
			switch c.name {
			case "rx-ring-full":
				if st.RxRingFull == 0 || len(held) != c.ring {
					t.Fatalf("want the RX ring (%d) full and the rest counted: %+v", c.ring, st)
				}
			case "fill-ring-empty":
				if st.RxDropped == 0 || st.FillRingEmpty == 0 || st.FillShort == 0 || len(held) != c.bufs {
					t.Fatalf("want the fill ring dry after %d frames and the rest counted: %+v", c.bufs, st)
				}
			}
			for i, f := range held {
				_, dst, pl, ok := udpOf(f.Bytes())
				if !ok || dst != netip.AddrPortFrom(e.SrvAddr, 6000) || len(pl) != 100 {
					t.Fatalf("frame %d: not the test's", i)
				}
				f.Buf.Release()
			}
		})
	}
}
