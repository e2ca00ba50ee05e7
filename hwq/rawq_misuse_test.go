package hwq

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/memreg"
)

// TestRawForeignSteering: a RawSteering of another interface, or of an interface with the
// same index in another namespace, is refused with ErrInvalid (its program would never see
// the queue's frames: they vanished, 100 of 100, before the check named the namespace).
func TestRawForeignSteering(t *testing.T) {
	e1 := newRawEnv(t, 1)
	e2 := newRawEnv(t, 1)
	s2 := e2.sharedSteering(t, nil)
	t.Logf("ifindex %d in one namespace, %d in the other", e1.SrvIdx, e2.SrvIdx)
	r := newRegion(t, 64)
	open := func(what string, ifname string, s *bpf.RawSteering) {
		t.Helper()
		q, err := OpenRawQueue(ifname, 0, r, &RawQueueOptions{NetNS: e1.Srv.Fd(), Steering: s})
		if err == nil {
			q.Close()
			t.Fatalf("%s: opened", what)
		}
		if !errors.Is(err, ErrInvalid) || !errors.Is(err, bpf.ErrInvalid) {
			t.Fatalf("%s: %v, want ErrInvalid", what, err)
		}
		if r.Free() != r.Count() {
			t.Fatalf("%s: the refused open left %d buffers lent", what, r.Count()-r.Free())
		}
	}
	open("steering of another namespace's interface", e1.SrvIf, s2)
	// Another interface of the same namespace: loopback's program, the veth's queue.
	var lo *bpf.RawSteering
	e1.In(t, e1.Srv, func() error {
		var err error
		lo, err = bpf.NewRawSteering(1, nil)
		return err
	})
	defer lo.Close()
	open("steering of loopback for the veth", e1.SrvIf, lo)
	// The interface's own steering is taken.
	s1 := e1.sharedSteering(t, nil)
	e1.openRaw(t, 0, r, &RawQueueOptions{Steering: s1})
}

// TestRawTxReserve: the fill ring never takes the region's TxReserve, so with a region
// smaller than the fill ring (64 buffers, 2,048 entries) Get finds a buffer while nothing
// is in flight; the reserve is settable, and one that leaves the fill ring nothing is
// refused. Before the reserve the fill ring took all 64 and Get returned ErrExhausted.
func TestRawTxReserve(t *testing.T) {
	e := newRawEnv(t, 1)
	r := newRegion(t, 64)
	q := e.openRaw(t, 0, r, nil)
	if got := r.Free(); got != 16 {
		t.Fatalf("%d buffers free after open, want the default reserve of 16 (a quarter)", got)
	}
	var held []memreg.Buf
	for range 16 {
		b, err := q.Get()
		if err != nil {
			t.Fatalf("Get %d with nothing in flight: %v", len(held), err)
		}
		held = append(held, b)
	}
	if _, err := q.Get(); !errors.Is(err, memreg.ErrExhausted) {
		t.Fatalf("Get past the reserve: %v, want ErrExhausted", err)
	}
	for _, b := range held {
		b.Release()
	}
	// Sent frames come back to Get: send the reserve's buffers, then Get them again.
	frames := make([]Frame, 0, 16)
	for range 16 {
		b, err := q.Get()
		if err != nil {
			t.Fatal(err)
		}
		f := b.Bytes()
		copy(f, e.cliMAC)
		copy(f[6:], e.srvMAC)
		f[12], f[13] = 0x88, 0xb5
		frames = append(frames, Frame{Buf: b, Len: 60})
	}
	if n, err := q.Send(frames); err != nil || n != len(frames) {
		t.Fatalf("Send: %d, %v", n, err)
	}
	for range 1000 {
		if n, err := q.Flush(); err != nil || n == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if b, err := q.Get(); err != nil {
		t.Fatalf("Get after the sends completed: %v", err)
	} else {
		b.Release()
	}
	q.Close()

	r2 := newRegion(t, 64)
	e.openRaw(t, 0, r2, &RawQueueOptions{TxReserve: 40})
	if got := r2.Free(); got != 40 {
		t.Fatalf("TxReserve 40: %d free", got)
	}
	r3 := newRegion(t, 64)
	_, err := OpenRawQueue(e.SrvIf, 0, r3, &RawQueueOptions{NetNS: e.Srv.Fd(), TxReserve: 64})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("TxReserve of the whole region: %v, want ErrInvalid", err)
	}
}

// TestRawClosedCalls: after Close every call fails with os.ErrClosed; Get handed out a
// buffer and nil before.
func TestRawClosedCalls(t *testing.T) {
	e := newRawEnv(t, 1)
	r := newRegion(t, 64)
	q := e.openRaw(t, 0, r, nil)
	q.Close()
	if b, err := q.Get(); !errors.Is(err, os.ErrClosed) {
		b.Release()
		t.Fatalf("Get after Close: %v, want os.ErrClosed", err)
	}
	for name, call := range map[string]func() error{
		"TryReceive":      func() error { _, err := q.TryReceive(make([]Frame, 1)); return err },
		"Receive":         func() error { _, err := q.Receive(make([]Frame, 1)); return err },
		"Send":            func() error { _, err := q.Send(nil); return err },
		"Flush":           func() error { _, err := q.Flush(); return err },
		"Stats":           func() error { _, err := q.Stats(); return err },
		"SetReadDeadline": func() error { return q.SetReadDeadline(time.Time{}) },
		"SyscallConn":     func() error { _, err := q.SyscallConn(); return err },
	} {
		if err := call(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("%s after Close: %v, want os.ErrClosed", name, err)
		}
	}
	if r.Free() != r.Count() {
		t.Fatalf("%d buffers still lent after Close", r.Count()-r.Free())
	}
}

// TestRawNoDeviceSticks: once the interface is deleted, every later call says ErrNoDevice:
// a polling TryReceive finds out within its device-check period and never returns (0, nil)
// again, and a second Receive without a deadline returns instead of waiting forever (the
// socket's error, which the kernel reports once, was forgotten after the first).
func TestRawNoDeviceSticks(t *testing.T) {
	e := newRawEnv(t, 1)
	q := e.openRaw(t, 0, newRegion(t, 64), nil)
	if err := e.Srv.IP("link", "del", e.SrvIf); err != nil {
		t.Fatal(err)
	}
	frames := make([]Frame, 8)
	var err error
	for i := 0; i <= deviceCheckPolls && err == nil; i++ {
		_, err = q.TryReceive(frames)
	}
	if !errors.Is(err, ErrNoDevice) {
		t.Fatalf("TryReceive over %d polls after the interface went away: %v, want ErrNoDevice", deviceCheckPolls+1, err)
	}
	for range 3 {
		if n, err := q.TryReceive(frames); n != 0 || !errors.Is(err, ErrNoDevice) {
			t.Fatalf("a later TryReceive: %d, %v, want ErrNoDevice", n, err)
		}
	}
	for i := range 2 {
		errc := make(chan error, 1)
		go func() {
			_, err := q.Receive(frames)
			errc <- err
		}()
		select {
		case err := <-errc:
			if !errors.Is(err, ErrNoDevice) {
				t.Fatalf("Receive %d: %v, want ErrNoDevice", i, err)
			}
		case <-time.After(10 * time.Second): // a safety net, not a timing
			q.Close()
			t.Fatalf("Receive %d with no deadline still waiting after the interface went away", i)
		}
	}
	if b, err := q.Get(); !errors.Is(err, ErrNoDevice) {
		b.Release()
		t.Fatalf("Get: %v, want ErrNoDevice", err)
	}
	if _, err := q.Send(nil); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Send: %v, want ErrNoDevice", err)
	}
	if _, err := q.Flush(); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Flush: %v, want ErrNoDevice", err)
	}
	if err := q.Close(); err != nil {
		t.Fatalf("Close after the interface went away: %v", err)
	}
}

// TestRawNoDeviceReceiveFirst: a Receive waiting when the interface goes away learns it,
// and so does every call after it (the first Receive consumed the socket's one report).
func TestRawNoDeviceReceiveFirst(t *testing.T) {
	e := newRawEnv(t, 1)
	q := e.openRaw(t, 0, newRegion(t, 64), nil)
	errc := make(chan error, 1)
	go func() {
		_, err := q.Receive(make([]Frame, 8))
		errc <- err
	}()
	if err := e.Srv.IP("link", "del", e.SrvIf); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrNoDevice) {
			t.Fatalf("Receive: %v, want ErrNoDevice", err)
		}
	case <-time.After(10 * time.Second):
		q.Close()
		t.Fatal("Receive still waiting after the interface went away")
	}
	if n, err := q.TryReceive(make([]Frame, 8)); n != 0 || !errors.Is(err, ErrNoDevice) {
		t.Fatalf("TryReceive after Receive's report: %d, %v, want ErrNoDevice", n, err)
	}
}

// TestRawSteeringBadSocket: SetSocket with a descriptor that is not a bound AF_XDP socket
// gives the documented ErrInvalid (it was a plain *bpf.OpError with the errno).
func TestRawSteeringBadSocket(t *testing.T) {
	e := newRawEnv(t, 1)
	s := e.sharedSteering(t, nil)
	udp, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(udp)
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for what, fd := range map[string]int{"negative": -1, "not open": 1 << 20, "UDP socket": udp,
		"file": int(f.Fd())} {
		if err := s.SetSocket(0, fd); !errors.Is(err, bpf.ErrInvalid) {
			t.Errorf("SetSocket(%s): %v, want ErrInvalid", what, err)
		}
	}
}

// TestRawVethMode: on veth the default is generic XDP, and Mode says why (native XDP would
// turn off the peer's TSO/GSO); the peer's TSO stays on, and kernel TCP through the pair
// beside the raw queue delivers every byte. Asking for native mode gets it, and the peer's
// TSO goes off while the program is attached: the cost the default avoids. Nothing here
// is timed.
func TestRawVethMode(t *testing.T) {
	e := newRawEnv(t, 1)
	cli, err := Open(Options{NetNS: e.Cli.Fd()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	peerTSO := func() bool {
		t.Helper()
		f, err := cli.Features(e.CliIf)
		if err != nil {
			t.Fatal(err)
		}
		return f.Active["tx-tcp-segmentation"]
	}
	if !peerTSO() {
		t.Fatal("the peer's TSO is off before any program")
	}
	q := e.openRaw(t, 0, newRegion(t, 256), nil)
	m := q.Mode()
	var ce *bpf.NativeXDPCostError
	if m.XDP != bpf.RawXDPGeneric || !errors.As(m.XDPReason, &ce) || ce.Driver != "veth" {
		t.Fatalf("default mode on veth: %+v, want generic XDP with a *bpf.NativeXDPCostError", m)
	}
	if q.Steering().Mode() != bpf.RawXDPGeneric || !errors.As(q.Steering().Fallback(), &ce) {
		t.Fatalf("steering: %v, %v", q.Steering().Mode(), q.Steering().Fallback())
	}
	if !peerTSO() {
		t.Fatal("the peer's TSO went off with the default (generic) program")
	}
	if _, err := q.Steering().AddRule(bpf.RawRule{DstPort: 6500, Proto: unix.IPPROTO_UDP}); err != nil {
		t.Fatal(err)
	}
	check := e.tcpCheck(t)
	check(4 << 20)
	q.Close()

	qn := e.openRaw(t, 0, newRegion(t, 256), &RawQueueOptions{XDP: bpf.XDPDriver})
	if m := qn.Mode(); m.XDP != bpf.RawXDPNative || m.XDPReason != nil {
		t.Fatalf("XDPDriver on veth: %+v, want native with no reason", m)
	}
	if peerTSO() {
		t.Fatal("the peer's TSO stayed on under a native program: the cost the default avoids is gone, revisit it")
	}
	check(1 << 20)
	qn.Close()
	if !peerTSO() {
		t.Fatal("the peer's TSO did not come back after the native program went")
	}
}

// TestRawJoin: a rule with Join makes the interface a member of its group (IGMP for IPv4,
// MLD for IPv6: /proc/net/igmp, igmp6 of the namespace), the group's frames still go to
// the raw queue, and DeleteRule and Close leave the group. A Join without a multicast
// destination is ErrInvalid.
func TestRawJoin(t *testing.T) {
	e := newRawEnv(t, 1)
	member := func(proc, group string) bool {
		t.Helper()
		var b []byte
		e.In(t, e.Srv, func() error {
			var err error
			b, err = os.ReadFile("/proc/thread-self/net/" + proc)
			return err
		})
		// igmp: "<idx>\t<dev>: ..." then "\t\t\t\t<GROUP> ..." lines for that device.
		dev := false
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			if proc == "igmp6" {
				if len(f) > 2 && f[1] == e.SrvIf && f[2] == group {
					return true
				}
				continue
			}
			if !strings.HasPrefix(l, "\t") {
				dev = len(f) > 1 && strings.TrimSuffix(f[1], ":") == e.SrvIf
			} else if dev && f[0] == group {
				return true
			}
		}
		return false
	}
	const g4, g6 = "030201EF", "ff150000000000000000000000310001" // 239.1.2.3, ff15::31:1
	s := e.sharedSteering(t, nil)
	q := e.openRaw(t, 0, newRegion(t, 256), &RawQueueOptions{Steering: s})
	if _, err := s.AddRule(bpf.RawRule{DstPort: 1, Join: true}); !errors.Is(err, bpf.ErrInvalid) {
		t.Fatalf("Join without a group: %v, want ErrInvalid", err)
	}
	if member("igmp", g4) || member("igmp6", g6) {
		t.Fatal("a member before any rule")
	}
	id4, err := s.AddRule(bpf.RawRule{Dst: netip.MustParseAddr("239.1.2.3"), Join: true})
	if err != nil {
		t.Fatal(err)
	}
	id6, err := s.AddRule(bpf.RawRule{Dst: netip.MustParseAddr("ff15::31:1"), Join: true})
	if err != nil {
		t.Fatal(err)
	}
	if !member("igmp", g4) || !member("igmp6", g6) || !s.Joined(id4) || !s.Joined(id6) {
		t.Fatal("the rules did not join their groups")
	}
	snd := newUDPSender(t, e.Cli, e.CliIf, false)
	for i := range 10 {
		snd.send(t, netip.MustParseAddrPort("239.1.2.3:7000"), payload("join", i, 64))
	}
	if got := collect(t, []*RawQueue{q}, 10, func(int, []byte) {}); got != 10 {
		t.Fatalf("%d of 10 frames of the joined group at the raw queue", got)
	}
	if err := s.DeleteRule(id4); err != nil {
		t.Fatal(err)
	}
	if member("igmp", g4) || !member("igmp6", g6) {
		t.Fatal("DeleteRule did not leave its group alone")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if member("igmp6", g6) {
		t.Fatal("Close did not leave the group")
	}
}
