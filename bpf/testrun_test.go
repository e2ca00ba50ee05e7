package bpf

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// frame builds an Ethernet + IPv4/IPv6 + TCP frame from src to dst.
func frame(src, dst netip.AddrPort, fragment bool) []byte {
	var b []byte
	eth := make([]byte, 14)
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	tcp[12] = 5 << 4
	if src.Addr().Is4() {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
		ip := make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, 6
		binary.BigEndian.PutUint16(ip[2:], 40)
		if fragment {
			binary.BigEndian.PutUint16(ip[6:], 0x2000) // more fragments
		}
		s, d := src.Addr().As4(), dst.Addr().As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		b = append(append(append(b, eth...), ip...), tcp...)
	} else {
		binary.BigEndian.PutUint16(eth[12:], 0x86dd)
		ip := make([]byte, 40)
		ip[0], ip[6], ip[7] = 0x60, 6, 64
		binary.BigEndian.PutUint16(ip[4:], 20)
		s, d := src.Addr().As16(), dst.Addr().As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		b = append(append(append(b, eth...), ip...), tcp...)
	}
	return append(b, make([]byte, 64)...)
}

// The XDP and tc programs' parsing and lookups, without a network
// (BPF_PROG_TEST_RUN).
func TestXDPAndTCTestRun(t *testing.T) {
	requireRoot(t)
	s, err := NewSteering(nil, &Options{Queues: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const xdpPass, xdpRedirect, tcxNext = 2, 4, 0xffffffff
	run := func(p *ebpf.Program, data []byte) uint32 {
		t.Helper()
		ret, err := p.Run(&ebpf.RunOptions{Data: data})
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}
	for _, fam := range []struct{ remote, local string }{
		{"10.0.0.2:5555", "10.0.0.1:80"},
		{"[2001:db8::2]:5555", "[2001:db8::1]:80"},
	} {
		remote, local := netip.MustParseAddrPort(fam.remote), netip.MustParseAddrPort(fam.local)
		in, out := frame(remote, local, false), frame(local, remote, false)
		k := FlowKey{Remote: remote, Local: local}
		if r := run(s.objs.ZcXdp, in); r != xdpPass {
			t.Errorf("%v unknown flow: xdp %d, want pass", k, r)
		}
		if err := s.SetFlow(k, 2); err != nil {
			t.Fatal(err)
		}
		if r := run(s.objs.ZcXdp, in); r != xdpPass {
			t.Errorf("%v queue without CPU: xdp %d, want pass", k, r)
		}
		if err := s.SetQueueCPU(2, 0); err != nil {
			t.Fatal(err)
		}
		if r := run(s.objs.ZcXdp, in); r != xdpRedirect {
			t.Errorf("%v: xdp %d, want redirect", k, r)
		}
		// The reply direction is not this flow's ingress.
		if r := run(s.objs.ZcXdp, out); r != xdpPass {
			t.Errorf("%v reversed: xdp %d, want pass", k, r)
		}
		if r := run(s.objs.ZcXdp, in[:30]); r != xdpPass {
			t.Errorf("%v truncated: xdp %d, want pass", k, r)
		}
		before, _ := s.Stats()
		if r := run(s.objs.ZcTcEgress, out); r != tcxNext {
			t.Errorf("%v: tc %d, want next", k, r)
		}
		after, _ := s.Stats()
		if after.Queues[2].TCMapped != before.Queues[2].TCMapped+1 {
			t.Errorf("%v: tc did not map the egress packet", k)
		}
		s.SetQueueCPU(2, -1)
		s.DeleteFlow(k)
	}
	// IPv4 fragments carry no ports: never redirected.
	remote, local := netip.MustParseAddrPort("10.0.0.3:1"), netip.MustParseAddrPort("10.0.0.1:80")
	s.SetFlow(FlowKey{Remote: remote, Local: local}, 1)
	s.SetQueueCPU(1, 0)
	if r := run(s.objs.ZcXdp, frame(remote, local, true)); r != xdpPass {
		t.Errorf("fragment: xdp %d, want pass", r)
	}
	if r := run(s.objs.ZcXdp, frame(remote, local, false)); r != xdpRedirect {
		t.Errorf("same flow unfragmented: xdp %d, want redirect", r)
	}
}

// TestProgramCost logs the in-kernel cost per packet of the XDP, tc and
// fault programs (BPF_PROG_TEST_RUN with repeat). Informational only.
func TestProgramCost(t *testing.T) {
	requireRoot(t)
	if testing.Short() {
		t.Skip("short")
	}
	s, err := NewSteering(nil, &Options{Queues: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var fo faultObjects
	if err := loadFaultObjects(&fo, nil); err != nil {
		t.Fatal(err)
	}
	defer fo.Close()
	remote, local := netip.MustParseAddrPort("10.0.0.2:5555"), netip.MustParseAddrPort("10.0.0.1:80")
	in, out := frame(remote, local, false), frame(local, remote, false)
	s.SetFlow(FlowKey{Remote: remote, Local: local}, 2)
	c := faultFaultConfig{Threshold: 1 << 30, Port: 80, Proto: 6}
	fo.FaultSettings.Update(uint32(0), &c, ebpf.UpdateAny)
	for _, b := range []struct {
		name string
		p    *ebpf.Program
		data []byte
	}{
		{"zc_xdp (flow hit, no CPU: pass)", s.objs.ZcXdp, in},
		{"zc_xdp (miss)", s.objs.ZcXdp, out},
		{"zc_tc_egress (flow hit)", s.objs.ZcTcEgress, out},
		{"zc_fault (match, 25%)", fo.ZcFault, in},
	} {
		_, d, err := b.p.Benchmark(b.data, 200000, nil)
		if err != nil {
			t.Fatalf("%s: %v", b.name, err)
		}
		t.Logf("%-32s %v per packet", b.name, d)
	}
}
