package hwq

import (
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/memreg"
)

func mustValueError(t *testing.T, what string, err error) {
	t.Helper()
	var ve *ValueError
	if !errors.As(err, &ve) {
		t.Fatalf("%s: %v, want a *ValueError", what, err)
	}
	var oe *OpError
	if !errors.As(err, &oe) {
		t.Fatalf("%s: %v, want an *OpError", what, err)
	}
}

// TestRawQueueBadInput: every bad argument gets a typed error and leaves nothing behind
// (TestMain counts sockets, programs, regions and fds).
func TestRawQueueBadInput(t *testing.T) {
	e := newRawEnv(t, 2)
	open := func(ifname string, queue int, r *memreg.Region, o RawQueueOptions) error {
		o.NetNS = e.Srv.Fd()
		q, err := OpenRawQueue(ifname, queue, r, &o)
		if err == nil {
			q.Close()
			t.Fatalf("OpenRawQueue(%s, %d) succeeded", ifname, queue)
		}
		return err
	}
	r := newRegion(t, 64)
	mustValueError(t, "queue the device lacks", open(e.SrvIf, 2, r, RawQueueOptions{}))
	mustValueError(t, "negative queue", open(e.SrvIf, -1, r, RawQueueOptions{}))
	mustValueError(t, "nil region", open(e.SrvIf, 0, nil, RawQueueOptions{}))
	mustValueError(t, "ring size 100", open(e.SrvIf, 0, r, RawQueueOptions{RingSize: 100}))
	for _, bs := range []int{1024, 3000, 2 * os.Getpagesize()} {
		rb, err := memreg.New(memreg.Options{BufSize: bs, Count: 16})
		if err != nil {
			t.Fatal(err)
		}
		mustValueError(t, "frame size", open(e.SrvIf, 0, rb, RawQueueOptions{}))
		rb.Close()
	}
	held, err := r.Get()
	if err != nil {
		t.Fatal(err)
	}
	mustValueError(t, "region with a held buffer", open(e.SrvIf, 0, r, RawQueueOptions{}))
	held.Release()
	if err := open("zcnet-none", 0, r, RawQueueOptions{}); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("unknown interface: %v, want ErrNoDevice", err)
	}
	// veth has no zero-copy AF_XDP: demanding it is refused, and nothing stays attached.
	before := CopyModeFallbacks()
	err = open(e.SrvIf, 0, r, RawQueueOptions{RequireZeroCopy: true})
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("RequireZeroCopy on veth: %v, want ErrNotSupported", err)
	}
	if CopyModeFallbacks() != before {
		t.Fatal("a refused zero-copy bind counted a fallback")
	}
	// The region is whole again, and a queue opens on it now.
	q := e.openRaw(t, 0, r, nil)
	m := q.Mode()
	if m.ZeroCopy || !errors.Is(m.CopyReason, ErrNotSupported) || CopyModeFallbacks() != before+1 {
		t.Fatalf("mode %+v, fallbacks %d -> %d: want copy mode with its reason, counted", m, before, CopyModeFallbacks())
	}
	// Conflicts: a second socket on the same queue, a second program on the interface.
	r2 := newRegion(t, 64)
	if err := open(e.SrvIf, 0, r2, RawQueueOptions{Steering: q.Steering()}); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("second raw queue on queue 0: %v, want EBUSY", err)
	}
	if err := open(e.SrvIf, 1, r2, RawQueueOptions{}); !errors.Is(err, bpf.ErrInvalid) {
		t.Fatalf("second XDP program on the interface: %v, want bpf.ErrInvalid", err)
	}
	if r2.Free() != r2.Count() {
		t.Fatalf("failed opens left %d of %d buffers lent", r2.Count()-r2.Free(), r2.Count())
	}
	// After Close every method says closed.
	q.Close()
	if _, err := q.TryReceive(make([]Frame, 1)); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("TryReceive after Close: %v", err)
	}
	if _, err := q.Send(nil); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Send after Close: %v", err)
	}
	if err := q.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	var nilq *RawQueue
	if err := nilq.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRawRuleErrors: unusable and conflicting rules are refused with typed errors.
func TestRawRuleErrors(t *testing.T) {
	e := newRawEnv(t, 1)
	s := e.sharedSteering(t, nil)
	g := netip.MustParseAddr("239.1.1.1")
	id, err := s.AddRule(bpf.RawRule{Dst: g})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.AddRule(bpf.RawRule{Dst: g})
	var ce *bpf.RuleConflictError
	if !errors.As(err, &ce) || ce.Rule != id || !errors.Is(err, bpf.ErrInvalid) {
		t.Fatalf("identical rule: %v, want a *RuleConflictError naming rule %d", err, id)
	}
	for name, r := range map[string]bpf.RawRule{
		"empty":                {},
		"VNI with TCP":         {VNI: 1, MatchVNI: true, Proto: unix.IPPROTO_TCP},
		"VNI on another port":  {VNI: 1, MatchVNI: true, DstPort: 4790},
		"VNI over 24 bits":     {VNI: 1 << 24, MatchVNI: true},
		"DSCP 64":              {DSCP: 64, MatchDSCP: true},
		"flow label over 20b":  {FlowLabel: 1 << 20, MatchFlowLabel: true},
		"flow label with IPv4": {FlowLabel: 1, MatchFlowLabel: true, Dst: g},
		"IPv4 and IPv6":        {Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("ff15::1")},
		"short MAC":            {DstMAC: []byte{1, 2, 3}},
		"ports with ICMP":      {Proto: unix.IPPROTO_ICMP, DstPort: 1},
	} {
		if _, err := s.AddRule(r); !errors.Is(err, bpf.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if err := s.DeleteRule(id + 1); !errors.Is(err, bpf.ErrNotFound) {
		t.Fatalf("delete a rule not in force: %v", err)
	}
	var ids []int
	for i := 1; len(ids) < bpf.MaxRawRules-1; i++ {
		id, err := s.AddRule(bpf.RawRule{DstPort: uint16(i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, err := s.AddRule(bpf.RawRule{DstPort: 9999}); !errors.Is(err, bpf.ErrInvalid) {
		t.Fatalf("rule %d: %v, want ErrInvalid (full)", bpf.MaxRawRules+1, err)
	}
	if err := s.DeleteRule(ids[3]); err != nil {
		t.Fatal(err)
	}
	if got, err := s.AddRule(bpf.RawRule{DstPort: 9999}); err != nil || got != ids[3] {
		t.Fatalf("rule after a delete: id %d, %v; want the freed slot %d", got, err, ids[3])
	}
}

// TestRawGenericFallback: on a device without native XDP (loopback) the program is attached in
// generic mode, visibly; demanding native mode is refused with ErrNotSupported.
func TestRawGenericFallback(t *testing.T) {
	e := newRawEnv(t, 1)
	r := newRegion(t, 64)
	// Loopback has no native XDP (no ndo_bpf); dummy devices would do too where the module
	// exists.
	_, err := OpenRawQueue("lo", 0, r, &RawQueueOptions{NetNS: e.Srv.Fd(), XDP: bpf.XDPDriver})
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("native XDP demanded on lo: %v, want ErrNotSupported", err)
	}
	before, _ := bpf.RawFallbacks()
	q, err := OpenRawQueue("lo", 0, r, &RawQueueOptions{NetNS: e.Srv.Fd()})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	m := q.Mode()
	after, _ := bpf.RawFallbacks()
	if m.XDP != bpf.RawXDPGeneric || !errors.Is(m.XDPReason, ErrNotSupported) || after != before+1 {
		t.Fatalf("mode %+v, fallbacks %d -> %d: want generic with its reason, counted", m, before, after)
	}
}

// TestRawInterfaceVanishes: deleting the interface under a raw queue wakes a blocked
// Receive with ErrNoDevice, and Close still tears everything down.
func TestRawInterfaceVanishes(t *testing.T) {
	e := newRawEnv(t, 1)
	q := e.openRaw(t, 0, newRegion(t, 64), nil)
	errc := make(chan error, 1)
	go func() {
		_, err := q.Receive(make([]Frame, 8))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // let Receive park (the test passes either way)
	if err := e.Srv.IP("link", "del", e.SrvIf); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrNoDevice) {
			t.Fatalf("Receive after the interface went away: %v, want ErrNoDevice", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Receive still blocked after the interface went away")
	}
	if _, err := q.Send(nil); err != nil && !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Send: %v", err)
	}
	if err := q.Close(); err != nil {
		t.Fatalf("Close after the interface went away: %v", err)
	}
}

// TestRawCloseWakesReceive: Close from another goroutine ends a blocked Receive with
// os.ErrClosed; a read deadline ends it with os.ErrDeadlineExceeded.
func TestRawCloseWakesReceive(t *testing.T) {
	e := newRawEnv(t, 1)
	q := e.openRaw(t, 0, newRegion(t, 64), nil)
	q.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
	if _, err := q.Receive(make([]Frame, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Receive past its deadline: %v", err)
	}
	q.SetReadDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() {
		_, err := q.Receive(make([]Frame, 8))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Receive ended by Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Receive still blocked after Close")
	}
}

// TestRawExternalPoller: an event loop of its own (here epoll) waits on the socket from
// SyscallConn and takes the frames with TryReceive when it is readable.
func TestRawExternalPoller(t *testing.T) {
	e := newRawEnv(t, 1)
	q := e.openRaw(t, 0, newRegion(t, 64), nil)
	if _, err := q.Steering().AddRule(bpf.RawRule{DstPort: 6400}); err != nil {
		t.Fatal(err)
	}
	rc, err := q.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ep)
	var cerr error
	rc.Control(func(fd uintptr) {
		cerr = unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, int(fd), &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
	})
	if cerr != nil {
		t.Fatal(cerr)
	}
	events := make([]unix.EpollEvent, 1)
	if n, _ := unix.EpollWait(ep, events, 0); n != 0 {
		t.Fatal("readable before any frame")
	}
	pk := newPacketSock(t, e.Cli, e.CliIf)
	pk.send(t, frameSpec{dstMAC: e.srvMAC, srcMAC: e.cliMAC, src: e.CliAddr, dst: e.SrvAddr, sport: 1, dport: 6400, payload: []byte("polled")}.build())
	n, err := unix.EpollWait(ep, events, 10000)
	if err != nil || n != 1 {
		t.Fatalf("epoll_wait: %d %v", n, err)
	}
	frames := make([]Frame, 4)
	k, err := q.TryReceive(frames)
	if err != nil || k != 1 {
		t.Fatalf("TryReceive after readiness: %d %v", k, err)
	}
	if _, _, pl, ok := udpOf(frames[0].Bytes()); !ok || string(pl) != "polled" {
		t.Fatal("not the frame sent")
	}
	frames[0].Buf.Release()
	q.Close()
	if _, err := q.SyscallConn(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("SyscallConn after Close: %v", err)
	}
}
