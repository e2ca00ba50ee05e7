package capture

import (
	"encoding/binary"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// tcpFrame builds an Ethernet + IPv4 + TCP frame of n bytes from src to dst.
func tcpFrame(src, dst netip.AddrPort, n int) []byte {
	b := make([]byte, n)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(n-14))
	ip[8] = 64
	ip[9] = ipProtoTCP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	tcp[12] = 5 << 4
	return b
}

// TestProgramCost measures the tc programs per packet with
// BPF_PROG_TEST_RUN (the kernel times the repetitions): a packet of
// another flow, and a selected packet recorded with snap 128 and 1514.
// Run with -v to see the numbers; it checks only that the programs ran.
func TestProgramCost(t *testing.T) {
	requireRoot(t)
	var objs struct {
		captureMaps
		ZcCapEgress  *ebpf.Program `ebpf:"zc_cap_egress"`
		ZcCapIngress *ebpf.Program `ebpf:"zc_cap_ingress"`
	}
	spec, err := loadCapture()
	if err != nil {
		t.Fatal(err)
	}
	spec.Maps[captureMapCapRing].MaxEntries = 256 << 20
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatal(err)
	}
	defer objs.captureMaps.Close()
	defer objs.ZcCapEgress.Close()
	defer objs.ZcCapIngress.Close()
	ncpu, _ := ebpf.PossibleCPU()
	// BPF_PROG_TEST_RUN runs tc programs on lo of this namespace.
	if err := objs.CapStats.Update(uint32(1), make([]captureCapIfstats, ncpu), ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	srv := netip.MustParseAddrPort("10.0.0.1:9000")
	peer := netip.MustParseAddrPort("10.0.0.2:40000")
	e, _ := Listener(srv).entry()
	if err := objs.CapFlows.Update(&e.key, uint32(1), ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	const n = 20000
	other := netip.MustParseAddrPort("10.0.0.1:9001")
	for _, c := range []struct {
		name     string
		snap     uint32
		kinds    uint32
		prog     *ebpf.Program
		src, dst netip.AddrPort
		selected bool
	}{
		{"egress, other flow (listener entries)", 128, kindLocal, objs.ZcCapEgress, other, peer, false},
		{"egress, other flow (entries of all four kinds)", 128, kindLocal | kindExact | kindPeer | kindPort, objs.ZcCapEgress, other, peer, false},
		{"ingress, selected, snap 128", 128, kindLocal, objs.ZcCapIngress, peer, srv, true},
		{"ingress, selected, snap 1514", 1514, kindLocal, objs.ZcCapIngress, peer, srv, true},
		{"egress, selected, snap 1514", 1514, kindLocal, objs.ZcCapEgress, srv, peer, true},
	} {
		cfg := captureCapConfig{Snap: c.snap, Kinds: c.kinds, Wakeup: 1 << 30}
		if err := objs.CapSettings.Update(uint32(0), &cfg, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		var before []captureCapIfstats
		objs.CapStats.Lookup(uint32(1), &before)
		_, d, err := c.prog.Benchmark(tcpFrame(c.src, c.dst, 1514), n, nil)
		if err != nil {
			t.Fatal(err)
		}
		var after []captureCapIfstats
		objs.CapStats.Lookup(uint32(1), &after)
		var matched, captured uint64
		for i := range after {
			matched += after[i].Matched - before[i].Matched
			captured += after[i].Captured - before[i].Captured
		}
		t.Logf("%-48s %4d ns/packet (matched %d, captured %d)", c.name, d.Nanoseconds(), matched, captured)
		want := uint64(0)
		if c.selected {
			want = n
		}
		if matched != want || captured != want {
			t.Errorf("%s: matched %d, captured %d, want %d", c.name, matched, captured, want)
		}
	}
}

// BenchmarkReader: the user-space side per packet (parse a ring record,
// copy it, reorder, encode an enhanced packet block).
func BenchmarkReader(b *testing.B) {
	for _, size := range []int{66, 1514} {
		b.Run(map[int]string{66: "66B", 1514: "1514B"}[size], func(b *testing.B) {
			c := &Capture{}
			w, err := newPcapWriter(io.Discard, pcapSection{Snap: MaxSnap, Interfaces: []Interface{{Index: 1, Name: "x"}}, Hooks: HookIngress}, 0)
			if err != nil {
				b.Fatal(err)
			}
			c.out = w
			c.window = int64(DefaultReorderWindow)
			rec := rawRecord(captureCapRecord{Len: uint32(size), Caplen: uint32(size), Hook: rawHookIngress, Ifindex: 1, Queue: 1}, make([]byte, size), 0)
			ts := time.Now().UnixNano()
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				// As the reader does: the ring record is read into a buffer the
				// packet keeps until it is written.
				r := append(c.buffer(len(rec)), rec...)
				binary.LittleEndian.PutUint64(r, uint64(ts+int64(i)*1000))
				c.take(r)
			}
			c.emitUpTo(1<<63 - 1)
			if c.written.Load() != uint64(b.N) {
				b.Fatalf("wrote %d of %d", c.written.Load(), b.N)
			}
		})
	}
}
