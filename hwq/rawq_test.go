package hwq

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
)

// sharedSteering attaches one raw-queue program to the server end, closed at the end.
func (e *rawEnv) sharedSteering(t *testing.T, o *bpf.RawSteeringOptions) *bpf.RawSteering {
	t.Helper()
	var s *bpf.RawSteering
	e.In(t, e.Srv, func() error {
		var err error
		s, err = bpf.NewRawSteering(e.SrvIdx, o)
		return err
	})
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("steering close: %v", err)
		}
	})
	return s
}

// allQueues opens a raw queue on every queue of the server end, sharing s, each with its
// own region.
func (e *rawEnv) allQueues(t *testing.T, n int, s *bpf.RawSteering) []*RawQueue {
	t.Helper()
	var qs []*RawQueue
	for i := range n {
		qs = append(qs, e.openRaw(t, i, newRegion(t, 1024), &RawQueueOptions{Steering: s, RingSize: 512}))
	}
	return qs
}

// tcpPair opens a TCP connection from the client namespace to the server namespace and
// returns a function that echoes n bytes through it and checks them.
func (e *rawEnv) tcpCheck(t *testing.T) func(n int) {
	t.Helper()
	var ln net.Listener
	e.In(t, e.Srv, func() error {
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(e.SrvAddr, 0).String())
		return err
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 65536)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	var c net.Conn
	e.In(t, e.Cli, func() error {
		var err error
		c, err = net.Dial("tcp4", ln.Addr().String())
		return err
	})
	t.Cleanup(func() { c.Close() })
	return func(n int) {
		t.Helper()
		out := payload("tcp", n, n)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		errc := make(chan error, 1)
		go func() { _, err := c.Write(out); errc <- err }()
		in := make([]byte, n)
		if _, err := ioReadFull(c, in); err != nil {
			t.Fatalf("TCP echo: %v", err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("TCP write: %v", err)
		}
		if !bytes.Equal(in, out) {
			t.Fatal("TCP echo: bytes differ")
		}
	}
}

func ioReadFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// waitMember reads the member's datagrams until want arrived (or a 10 s safety net).
func waitMember(m *groupMember, want int) [][]byte {
	var got [][]byte
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < want && time.Now().Before(deadline) {
		d := m.drain()
		if len(d) == 0 {
			time.Sleep(time.Millisecond)
		}
		got = append(got, d...)
	}
	return got
}

// checkStream checks that got holds exactly datagrams 0..n-1 of stream tag, each once.
func checkStream(t *testing.T, what string, got [][]byte, tag string, n, size int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("%s: %d datagrams, want %d", what, len(got), n)
	}
	seen := make([]bool, n)
	for _, p := range got {
		var i int
		if _, err := fmt.Sscanf(string(p[len(tag)+1:len(tag)+9]), "%08d", &i); err != nil || i < 0 || i >= n {
			t.Fatalf("%s: unexpected datagram %q", what, p[:min(len(p), 24)])
		}
		if seen[i] {
			t.Fatalf("%s: datagram %d twice", what, i)
		}
		seen[i] = true
		if !bytes.Equal(p, payload(tag, i, size)) {
			t.Fatalf("%s: datagram %d differs", what, i)
		}
	}
}

// TestRawMulticastBypass: a raw queue on each of the server's queues takes exactly one
// IPv4 multicast group's frames (count and every byte), while the kernel stack gets the
// other group (a joined UDP socket) and a TCP connection keeps working; a socket joined to
// the bypassed group gets nothing while the rule is in force, and everything once it is
// removed; rules added and removed meanwhile for other groups change nothing.
func TestRawMulticastBypass(t *testing.T) {
	const queues, n, size = 2, 400, 200
	e := newRawEnv(t, queues)
	s := e.sharedSteering(t, nil)
	qs := e.allQueues(t, queues, s)
	g1 := netip.MustParseAddr("239.7.7.1")
	g2 := netip.MustParseAddr("239.7.7.2")
	const port = 5001
	m1 := joinGroup(t, e.Srv, e.SrvIf, g1, port)
	m2 := joinGroup(t, e.Srv, e.SrvIf, g2, port)
	echo := e.tcpCheck(t)
	snd := newUDPSender(t, e.Cli, e.CliIf, false)

	rule, err := s.AddRule(bpf.RawRule{Dst: g1})
	if err != nil {
		t.Fatal(err)
	}
	// Rules for other groups come and go while traffic flows.
	stop := make(chan struct{})
	var churn sync.WaitGroup
	var churned atomic.Int64
	churn.Add(1)
	go func() {
		defer churn.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id, err := s.AddRule(bpf.RawRule{Dst: netip.AddrFrom4([4]byte{239, 9, 9, byte(i)}), Proto: unix.IPPROTO_UDP})
			if err != nil {
				t.Errorf("churn add: %v", err)
				return
			}
			if err := s.DeleteRule(id); err != nil {
				t.Errorf("churn delete: %v", err)
				return
			}
			churned.Add(1)
		}
	}()
	for round, bypass := range []bool{true, false, true} {
		tag1, tag2 := fmt.Sprintf("g1r%d", round), fmt.Sprintf("g2r%d", round)
		for i := range n {
			snd.send(t, netip.AddrPortFrom(g1, port), payload(tag1, i, size))
			snd.send(t, netip.AddrPortFrom(g2, port), payload(tag2, i, size))
			if i%100 == 0 {
				echo(4096)
			}
		}
		var raw [][]byte
		want := 0
		if bypass {
			want = n
		}
		got := collect(t, qs, want, func(_ int, f []byte) {
			src, dst, pl, ok := udpOf(f)
			if !ok || dst != netip.AddrPortFrom(g1, port) || src.Addr() != e.CliAddr {
				t.Fatalf("raw queue got a frame that is not group 1's: %x", f[:min(len(f), 64)])
			}
			if !bytes.Equal(f[0:6], []byte{0x01, 0x00, 0x5e, 7, 7, 1}) || !bytes.Equal(f[6:12], e.cliMAC) {
				t.Fatalf("frame's MACs: %x", f[:12])
			}
			raw = append(raw, append([]byte(nil), pl...))
		})
		got2 := waitMember(m2, n)
		checkStream(t, fmt.Sprintf("round %d: kernel socket of group 2", round), got2, tag2, n, size)
		if bypass {
			checkStream(t, fmt.Sprintf("round %d: raw queues", round), raw, tag1, n, size)
			if d := m1.drain(); len(d) != 0 {
				t.Fatalf("round %d: the kernel socket of the bypassed group got %d datagrams", round, len(d))
			}
		} else {
			if got != 0 {
				t.Fatalf("round %d: raw queues got %d frames with the rule removed", round, got)
			}
			checkStream(t, fmt.Sprintf("round %d: kernel socket of group 1 (rule removed)", round), waitMember(m1, n), tag1, n, size)
		}
		echo(65536)
		switch round {
		case 0:
			st, err := s.RuleStats(rule)
			if err != nil {
				t.Fatal(err)
			}
			if st.Packets != n || st.NoSocket != 0 {
				t.Fatalf("rule stats %+v, want %d packets", st, n)
			}
			if err := s.DeleteRule(rule); err != nil {
				t.Fatal(err)
			}
		case 1:
			if rule, err = s.AddRule(bpf.RawRule{Dst: g1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	churn.Wait()
	if churned.Load() == 0 {
		t.Fatal("no rule churn happened during the traffic")
	}
	var rx uint64
	for _, q := range qs {
		st, err := q.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.RxDropped != 0 || st.RxRingFull != 0 || st.RxInvalid != 0 {
			t.Fatalf("queue %d lost frames: %+v", q.Queue(), st)
		}
		rx += st.RxFrames
	}
	if rx != 2*n {
		t.Fatalf("raw queues received %d frames, want %d", rx, 2*n)
	}
	t.Logf("mode %+v; %d rule add/remove pairs during traffic", qs[0].Mode(), churned.Load())
}
