package hwq

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/memreg"
)

// waitSeen waits until the steering program has run on at least n frames (a safety net of
// 10 s, not an assertion).
func waitSeen(t *testing.T, s *bpf.RawSteering, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.Seen >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRawRuleKinds: each kind of rule (VXLAN VNI, DSCP over IPv4 and IPv6, IPv6 flow label,
// UDP and TCP 5-tuples, destination MAC, IPv6 multicast group) sends the raw queues exactly
// the frames it matches, byte for byte, and passes the near misses to the kernel stack.
func TestRawRuleKinds(t *testing.T) {
	const queues, copies = 2, 20
	e := newRawEnv(t, queues)
	s := e.sharedSteering(t, nil)
	qs := e.allQueues(t, queues, s)
	pk := newPacketSock(t, e.Cli, e.CliIf)
	src4, dst4 := e.CliAddr, e.SrvAddr
	src6, dst6 := netip.MustParseAddr("fd19::2"), netip.MustParseAddr("fd19::1")
	inner := frameSpec{dstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, srcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2},
		src: netip.MustParseAddr("192.168.50.1"), dst: netip.MustParseAddr("192.168.50.2"), sport: 1, dport: 2, payload: []byte("inner")}.build()
	v4 := func(f frameSpec) frameSpec {
		f.dstMAC, f.srcMAC = e.srvMAC, e.cliMAC
		if !f.dst.IsValid() {
			f.src, f.dst = src4, dst4
		}
		if f.payload == nil {
			f.payload = []byte("zcnet raw queue rule test")
		}
		return f
	}
	v6 := func(f frameSpec) frameSpec {
		f.dstMAC, f.srcMAC = e.srvMAC, e.cliMAC
		if !f.dst.IsValid() {
			f.src, f.dst = src6, dst6
		}
		if f.payload == nil {
			f.payload = []byte("zcnet raw queue rule test v6")
		}
		return f
	}
	grp6 := netip.MustParseAddr("ff15::7:1")
	cases := []struct {
		name        string
		rule        bpf.RawRule
		match, miss []frameSpec
	}{
		{"vxlan-vni", bpf.RawRule{VNI: 4242, MatchVNI: true},
			[]frameSpec{v4(frameSpec{sport: 40000, dport: 4789, payload: vxlan(4242, inner)}),
				v6(frameSpec{sport: 40001, dport: 4789, payload: vxlan(4242, inner)})},
			[]frameSpec{v4(frameSpec{sport: 40000, dport: 4789, payload: vxlan(4243, inner)}),
				v4(frameSpec{sport: 40000, dport: 4790, payload: vxlan(4242, inner)}),
				v4(frameSpec{sport: 40000, dport: 4789, payload: append([]byte{0, 0, 0, 0, 0, 0x10, 0x92, 0}, inner...)})}},
		{"dscp", bpf.RawRule{DSCP: 46, MatchDSCP: true},
			[]frameSpec{v4(frameSpec{sport: 1000, dport: 2000, tos: 46 << 2}), v4(frameSpec{sport: 1000, dport: 2000, tos: 46<<2 | 1}),
				v6(frameSpec{sport: 1000, dport: 2000, tos: 46 << 2})},
			[]frameSpec{v4(frameSpec{sport: 1000, dport: 2000, tos: 0}), v4(frameSpec{sport: 1000, dport: 2000, tos: 45 << 2}),
				v6(frameSpec{sport: 1000, dport: 2000, tos: 47 << 2})}},
		{"flow-label", bpf.RawRule{FlowLabel: 0x12345, MatchFlowLabel: true},
			[]frameSpec{v6(frameSpec{sport: 3000, dport: 3001, flow: 0x12345}), v6(frameSpec{proto: unix.IPPROTO_TCP, sport: 3000, dport: 3001, flow: 0x12345})},
			[]frameSpec{v6(frameSpec{sport: 3000, dport: 3001, flow: 0x12346}), v6(frameSpec{sport: 3000, dport: 3001})}},
		{"udp-5-tuple", bpf.RawRule{Src: src4, Dst: dst4, Proto: unix.IPPROTO_UDP, SrcPort: 7000, DstPort: 8000},
			[]frameSpec{v4(frameSpec{sport: 7000, dport: 8000})},
			[]frameSpec{v4(frameSpec{sport: 7001, dport: 8000}), v4(frameSpec{sport: 7000, dport: 8001}),
				v4(frameSpec{proto: unix.IPPROTO_TCP, sport: 7000, dport: 8000}),
				v4(frameSpec{src: netip.MustParseAddr("10.219.7.3"), dst: dst4, sport: 7000, dport: 8000})}},
		{"tcp-5-tuple-v6", bpf.RawRule{Src: src6, Dst: dst6, Proto: unix.IPPROTO_TCP, SrcPort: 7000, DstPort: 8000},
			[]frameSpec{v6(frameSpec{proto: unix.IPPROTO_TCP, sport: 7000, dport: 8000})},
			[]frameSpec{v6(frameSpec{sport: 7000, dport: 8000}), v6(frameSpec{proto: unix.IPPROTO_TCP, sport: 7000, dport: 8002})}},
		{"dst-mac", bpf.RawRule{DstMAC: net.HardwareAddr{0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}},
			[]frameSpec{func() frameSpec {
				f := v4(frameSpec{sport: 1, dport: 5000, dst: netip.MustParseAddr("239.1.2.3"), src: src4})
				f.dstMAC = net.HardwareAddr{0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}
				return f
			}()},
			[]frameSpec{func() frameSpec {
				f := v4(frameSpec{sport: 1, dport: 5000, dst: netip.MustParseAddr("239.1.2.4"), src: src4})
				f.dstMAC = net.HardwareAddr{0x01, 0x00, 0x5e, 0x01, 0x02, 0x04}
				return f
			}()}},
		{"ipv6-group", bpf.RawRule{Dst: grp6},
			[]frameSpec{func() frameSpec {
				f := v6(frameSpec{sport: 9, dport: 5000, dst: grp6, src: src6})
				f.dstMAC = net.HardwareAddr{0x33, 0x33, 0, 7, 0, 1}
				return f
			}()},
			[]frameSpec{func() frameSpec {
				f := v6(frameSpec{sport: 9, dport: 5000, dst: netip.MustParseAddr("ff15::7:2"), src: src6})
				f.dstMAC = net.HardwareAddr{0x33, 0x33, 0, 7, 0, 2}
				return f
			}()}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, err := s.AddRule(c.rule)
			if err != nil {
				t.Fatal(err)
			}
			defer s.DeleteRule(id)
			before, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]int{}
			sent := 0
			for k := range copies {
				for _, f := range c.match {
					f.payload = append(append([]byte(nil), f.payload...), byte(k))
					b := f.build()
					want[string(b)]++
					pk.send(t, b)
					sent++
				}
				for _, f := range c.miss {
					f.payload = append(append([]byte(nil), f.payload...), byte(k))
					pk.send(t, f.build())
					sent++
				}
			}
			n := copies * len(c.match)
			waitSeen(t, s, before.Seen+uint64(sent))
			got := collect(t, qs, n, func(_ int, f []byte) {
				if want[string(f)] == 0 {
					t.Fatalf("raw queue got a frame the rule does not match (or twice): %x", f[:min(len(f), 80)])
				}
				want[string(f)]--
			})
			if extra := collect(t, qs, 0, nil); got != n || extra != 0 {
				t.Fatalf("raw queues got %d frames (+%d), want %d", got, extra, n)
			}
			st, err := s.RuleStats(id)
			if err != nil {
				t.Fatal(err)
			}
			after, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if st.Packets != uint64(n) || after.Redirect-before.Redirect != uint64(n) {
				t.Fatalf("rule stats %+v, redirects %d, want %d", st, after.Redirect-before.Redirect, n)
			}
			if pass := after.Pass - before.Pass; pass < uint64(sent-n) {
				t.Fatalf("%d frames passed to the kernel, want at least the %d misses", pass, sent-n)
			}
		})
	}
}

// TestRawSendCustomFrames: frames the application builds in the region's buffers, 60 bytes
// to the MTU, leave the raw queue and arrive byte-exact at an AF_PACKET socket in the other
// namespace; every buffer comes back to the region after its completion.
func TestRawSendCustomFrames(t *testing.T) {
	e := newRawEnv(t, 2)
	r := newRegion(t, 256)
	q := e.openRaw(t, 1, r, &RawQueueOptions{RingSize: 64})
	pk := newPacketSock(t, e.Cli, e.CliIf)
	const etherType = 0x88b5 // IEEE 802 local experimental
	var sizes []int
	for sz := 60; sz <= q.MTU()+14; sz += 37 {
		sizes = append(sizes, sz)
	}
	sizes = append(sizes, 61, 64, 128, 1499, 1500, q.MTU()+13, q.MTU()+14)
	var want [][]byte
	for round := range 8 { // more frames than the TX ring: wraps and completions
		for _, sz := range sizes {
			b, err := q.Get()
			for err != nil {
				if !errors.Is(err, memreg.ErrExhausted) {
					t.Fatal(err)
				}
				if _, ferr := q.Flush(); ferr != nil {
					t.Fatal(ferr)
				}
				b, err = q.Get()
			}
			f := b.Bytes()[:sz]
			copy(f[0:], e.cliMAC)
			copy(f[6:], e.srvMAC)
			f[12], f[13] = etherType>>8, etherType&0xff
			for i := 14; i < sz; i++ {
				f[i] = byte(i*3 + sz + round)
			}
			binary.BigEndian.PutUint32(f[14:], uint32(round<<16|sz))
			want = append(want, append([]byte(nil), f...))
			fr := []Frame{{Buf: b, Len: sz}}
			for {
				n, err := q.Send(fr)
				if err != nil {
					t.Fatal(err)
				}
				if n == 1 {
					break
				}
				q.Flush()
			}
		}
	}
	got := pk.recv(len(want), func(f []byte) bool {
		return len(f) >= 14 && binary.BigEndian.Uint16(f[12:]) == etherType
	})
	if len(got) != len(want) {
		t.Fatalf("AF_PACKET got %d frames, want %d", len(got), len(want))
	}
	idx := map[string]int{}
	for _, w := range want {
		idx[string(w)]++
	}
	for _, g := range got {
		if idx[string(g)] == 0 {
			t.Fatalf("frame of %d bytes arrived altered or twice: %x", len(g), g[:min(len(g), 32)])
		}
		idx[string(g)]--
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if n, err := q.Flush(); err != nil || n == 0 {
			break
		}
	}
	st, err := q.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.TxCompleted != uint64(len(want)) || st.TxFrames != uint64(len(want)) || st.TxInvalid != 0 {
		t.Fatalf("stats %+v, want %d frames sent and completed", st, len(want))
	}
	if r.Held() != 0 {
		t.Fatalf("%d buffers still held", r.Held())
	}
	// A frame over MTU+14 is refused before the kernel sees it.
	b, err := q.Get()
	if err != nil {
		t.Fatal(err)
	}
	_, err = q.Send([]Frame{{Buf: b, Len: q.MTU() + 15}})
	var ve *ValueError
	if !errors.As(err, &ve) {
		t.Fatalf("oversized frame: %v, want a *ValueError", err)
	}
	b.Release()
}

// TestRawReceiveSizes: frames of every size from 60 bytes to MTU+14 reach the raw queue
// byte for byte.
func TestRawReceiveSizes(t *testing.T) {
	e := newRawEnv(t, 1)
	q := e.openRaw(t, 0, newRegion(t, 512), &RawQueueOptions{RingSize: 256})
	if _, err := q.Steering().AddRule(bpf.RawRule{Proto: unix.IPPROTO_UDP, DstPort: 6300}); err != nil {
		t.Fatal(err)
	}
	pk := newPacketSock(t, e.Cli, e.CliIf)
	want := map[string]int{}
	n := 0
	for size := 60; size <= q.MTU()+14; size++ {
		if size > 80 && size < q.MTU()-20 && size%61 != 0 {
			continue // every size near both ends, a spread in between
		}
		f := frameSpec{dstMAC: e.srvMAC, srcMAC: e.cliMAC, src: e.CliAddr, dst: e.SrvAddr, sport: 6301, dport: 6300,
			payload: payload("size", size, size-42)}.build()
		if len(f) != size {
			t.Fatalf("built %d bytes, want %d", len(f), size)
		}
		want[string(f)]++
		pk.send(t, f)
		n++
	}
	got := collect(t, []*RawQueue{q}, n, func(_ int, f []byte) {
		if want[string(f)] == 0 {
			t.Fatalf("frame of %d bytes arrived altered or twice", len(f))
		}
		want[string(f)]--
	})
	if got != n {
		t.Fatalf("%d of %d frames arrived", got, n)
	}
}
