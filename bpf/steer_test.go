package bpf

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// steerFixture is a reuseport group of n listeners on 127.0.0.1 with
// steering attached and an acceptor goroutine per listener.
type steerFixture struct {
	t       *testing.T
	fds     []int
	port    int
	s       *Steering
	ch      <-chan accepted
	pending map[int]accepted
	conns   []net.Conn
}

func newSteerFixture(t *testing.T, n int, opts *Options) *steerFixture {
	t.Helper()
	requireRoot(t)
	fds, port, err := reuseportListeners(n, loopback, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := &steerFixture{t: t, fds: fds, port: port, pending: map[int]accepted{}}
	t.Cleanup(func() {
		for _, c := range f.conns {
			c.Close()
		}
		for _, a := range f.pending {
			a.conn.Close()
		}
		for _, fd := range f.fds {
			unix.Close(fd)
		}
	})
	s, err := NewSteering(fds, opts)
	if err != nil {
		t.Fatalf("NewSteering: %v", err)
	}
	f.s = s
	t.Cleanup(func() { s.Close() })
	ch, stop := acceptAll(t, fds)
	t.Cleanup(stop)
	f.ch = ch
	return f
}

func (f *steerFixture) server() netip.AddrPort { return netip.AddrPortFrom(loopback, uint16(f.port)) }

// dial connects from src (port chosen now); before connecting it calls
// prepare with the flow key and the socket. It returns the queue that
// accepted, or -1 if none did within timeout.
func (f *steerFixture) dial(src netip.Addr, timeout time.Duration, prepare func(k FlowKey, fd int)) (int, FlowKey) {
	f.t.Helper()
	fd, port, err := boundClient(src)
	if err != nil {
		f.t.Fatal(err)
	}
	k := FlowKey{Remote: netip.AddrPortFrom(src, uint16(port)), Local: f.server()}
	if prepare != nil {
		prepare(k, fd)
	}
	if timeout < time.Second {
		// An unanswered SYN: don't wait for connect's retries.
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Usec: int64(timeout / time.Microsecond)})
	}
	c, err := connectFD(fd, f.server())
	if err != nil {
		return -1, k
	}
	f.conns = append(f.conns, c)
	a, ok := waitAccepted(f.ch, f.pending, port, timeout)
	if !ok {
		return -1, k
	}
	f.conns = append(f.conns, a.conn)
	return a.queue, k
}

func TestReuseportFlowTable(t *testing.T) {
	f := newSteerFixture(t, 4, nil)
	for i := 0; i < 16; i++ {
		want := (i * 3) % 4
		got, k := f.dial(loopback, 2*time.Second, func(k FlowKey, _ int) {
			if err := f.s.SetFlow(k, want); err != nil {
				t.Fatal(err)
			}
		})
		if got != want {
			t.Fatalf("flow %v: accepted on queue %d, flow table says %d", k, got, want)
		}
		q, learned, err := f.s.Lookup(k)
		if err != nil || q != want || learned {
			t.Fatalf("Lookup(%v) = %d, %v, %v; want %d from the flow table", k, q, learned, err, want)
		}
	}
	// A peer-wide entry (remote port 0) covers every port of 127.0.0.2.
	peer := netip.MustParseAddr("127.0.0.2")
	if err := f.s.SetFlow(FlowKey{Remote: netip.AddrPortFrom(peer, 0), Local: f.server()}, 2); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 8; i++ {
		if got, k := f.dial(peer, 2*time.Second, nil); got != 2 {
			t.Fatalf("flow %v: accepted on queue %d, peer entry says 2", k, got)
		}
	}
	// An exact entry beats the peer-wide one.
	if got, _ := f.dial(peer, 2*time.Second, func(k FlowKey, _ int) {
		if err := f.s.SetFlow(k, 1); err != nil {
			t.Fatal(err)
		}
	}); got != 1 {
		t.Fatalf("exact entry: accepted on queue %d, want 1", got)
	}
	// Delete: the flow falls back to the hash (any queue), and a second
	// delete reports ErrNotFound.
	k := FlowKey{Remote: netip.AddrPortFrom(peer, 0), Local: f.server()}
	if err := f.s.DeleteFlow(k); err != nil {
		t.Fatal(err)
	}
	if err := f.s.DeleteFlow(k); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second DeleteFlow: %v, want ErrNotFound", err)
	}
	st, err := f.s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.ReuseportFlow != 25 {
		t.Errorf("ReuseportFlow = %d, want 25", st.ReuseportFlow)
	}
	var steered uint64
	for _, q := range st.Queues {
		steered += q.Steered
	}
	if steered != 25 || st.NoListener != 0 || st.BadPacket != 0 {
		t.Errorf("stats: %+v", st)
	}
}

func TestReuseportHashAndLearned(t *testing.T) {
	f := newSteerFixture(t, 4, nil)
	const n = 200
	var per [4]int
	keys := map[FlowKey]int{}
	for i := 0; i < n; i++ {
		q, k := f.dial(loopback, 2*time.Second, nil)
		if q < 0 {
			t.Fatalf("connection %d not accepted", i)
		}
		per[q]++
		keys[k] = q
	}
	t.Logf("hash spread over 4 queues: %v", per)
	for q, c := range per {
		// Uniform would be 50 each; even ports must not starve half the queues.
		if c < n/4/3 {
			t.Errorf("queue %d got %d of %d connections: %v", q, c, n, per)
		}
	}
	learned, err := f.s.Learned()
	if err != nil {
		t.Fatal(err)
	}
	for k, q := range keys {
		if lq, ok := learned[k]; !ok || lq != q {
			t.Fatalf("learned[%v] = %d, %v; accepted on %d", k, lq, ok, q)
		}
		got, isLearned, err := f.s.Lookup(k)
		if err != nil || got != q || !isLearned {
			t.Fatalf("Lookup(%v) = %d, %v, %v; want learned %d", k, got, isLearned, err, q)
		}
	}
	// The accepted side names the same flow, and Forget drops it.
	for _, c := range f.conns[:4] {
		rc, _ := c.(*net.TCPConn).SyscallConn()
		var k FlowKey
		var kerr error
		rc.Control(func(fd uintptr) { k, kerr = FlowKeyFromFD(int(fd)) })
		if kerr != nil {
			t.Fatal(kerr)
		}
		if k.Local.Port() == uint16(f.port) { // server side
			if _, ok := keys[k]; !ok {
				t.Errorf("FlowKeyFromFD = %v, not a known flow", k)
			}
			if err := f.s.Forget(k); err != nil {
				t.Fatal(err)
			}
			if _, _, err := f.s.Lookup(k); !errors.Is(err, ErrNotFound) {
				t.Errorf("Lookup after Forget: %v", err)
			}
		}
	}
	if _, err := FlowKeyFromFD(-1); !errors.Is(err, ErrInvalid) {
		t.Errorf("FlowKeyFromFD(-1): %v", err)
	}
	st, _ := f.s.Stats()
	if st.ReuseportHash != n {
		t.Errorf("ReuseportHash = %d, want %d", st.ReuseportHash, n)
	}
}

func TestReuseportDSCPPolicy(t *testing.T) {
	f := newSteerFixture(t, 4, &Options{Policy: PolicyDSCP})
	const ef = 46 // DSCP Expedited Forwarding
	if err := f.s.SetDSCPQueue(ef, 3); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		got, _ := f.dial(loopback, 2*time.Second, func(_ FlowKey, fd int) {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TOS, ef<<2); err != nil {
				t.Fatal(err)
			}
		})
		if got != 3 {
			t.Fatalf("EF connection accepted on queue %d, want 3", got)
		}
	}
	// Removing the class: back to the hash.
	if err := f.s.SetDSCPQueue(ef, -1); err != nil {
		t.Fatal(err)
	}
	st, _ := f.s.Stats()
	if st.ReuseportDSCP != 10 {
		t.Errorf("ReuseportDSCP = %d, want 10", st.ReuseportDSCP)
	}
}

func TestReuseportCPUPolicy(t *testing.T) {
	ncpu := runtime.NumCPU()
	f := newSteerFixture(t, 4, &Options{Policy: PolicyCPU})
	for c := 0; c < ncpu && c < MaxCPUs; c++ {
		if err := f.s.SetCPUQueue(c, (c+1)%4); err != nil {
			t.Fatal(err)
		}
	}
	// On loopback the SYN is processed on the sending CPU: pin the client.
	for c := 0; c < ncpu && c < 4; c++ {
		got := -2
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var old, set unix.CPUSet
			unix.SchedGetaffinity(0, &old)
			set.Set(c)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				return
			}
			defer unix.SchedSetaffinity(0, &old)
			fd, port, err := boundClient(loopback)
			if err != nil {
				return
			}
			if err := unix.Connect(fd, sockaddr(f.server())); err != nil {
				unix.Close(fd)
				return
			}
			defer unix.Close(fd)
			a, ok := waitAccepted(f.ch, f.pending, port, 2*time.Second)
			if ok {
				got = a.queue
				a.conn.Close()
			}
		}()
		<-done
		if got != (c+1)%4 {
			t.Fatalf("SYN from CPU %d accepted on queue %d, want %d", c, got, (c+1)%4)
		}
	}
	st, _ := f.s.Stats()
	if st.ReuseportCPU == 0 {
		t.Errorf("ReuseportCPU = 0")
	}
	// PolicyHash asked for explicitly: the CPU map stays, but only the hash places.
	if err := f.s.SetPolicy(PolicyHash); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 8; i++ {
		if q, _ := f.dial(loopback, 2*time.Second, nil); q < 0 {
			t.Fatal("not accepted under PolicyHash")
		}
	}
	st2, _ := f.s.Stats()
	if st2.ReuseportCPU != st.ReuseportCPU || st2.ReuseportHash != st.ReuseportHash+8 {
		t.Errorf("PolicyHash: cpu %d -> %d, hash %d -> %d (want cpu unchanged, hash +8)",
			st.ReuseportCPU, st2.ReuseportCPU, st.ReuseportHash, st2.ReuseportHash)
	}
}

func TestPolicyString(t *testing.T) {
	for p, want := range map[Policy]string{PolicyAuto: "auto", PolicyHash: "hash", PolicyDSCP: "dscp",
		PolicyCPU: "cpu", PolicyDSCP | PolicyCPU: "dscp+cpu", 8: "Policy(0x8)"} {
		if got := p.String(); got != want {
			t.Errorf("Policy(%d).String() = %q, want %q", uint32(p), got, want)
		}
	}
	for p, ok := range map[Policy]bool{PolicyAuto: true, PolicyHash: true, PolicyCPU | PolicyDSCP: true,
		PolicyHash | PolicyCPU: false, 8: false, PolicyHash | 8: false} {
		if err := p.check(); (err == nil) != ok || err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("Policy(%v).check() = %v", p, err)
		}
	}
}

func TestDrain(t *testing.T) {
	f := newSteerFixture(t, 4, nil)
	// An established connection on queue 1, kept across the drain.
	var keep net.Conn
	q, _ := f.dial(loopback, 2*time.Second, func(k FlowKey, _ int) {
		if err := f.s.SetFlow(k, 1); err != nil {
			t.Fatal(err)
		}
	})
	if q != 1 {
		t.Fatalf("setup connection on queue %d", q)
	}
	client, server := f.conns[len(f.conns)-2], f.conns[len(f.conns)-1]
	keep = server

	if err := f.s.Drain(1, true); err != nil {
		t.Fatal(err)
	}
	// A flow-table entry pointing at the drained queue is passed over...
	if got, _ := f.dial(loopback, 2*time.Second, func(k FlowKey, _ int) {
		f.s.SetFlow(k, 1)
	}); got == 1 || got < 0 {
		t.Fatalf("new connection for drained queue 1 landed on %d", got)
	}
	// ...and the hash never picks it.
	for i := 0; i < 60; i++ {
		got, _ := f.dial(loopback, 2*time.Second, nil)
		if got == 1 || got < 0 {
			t.Fatalf("connection %d landed on %d while queue 1 is drained", i, got)
		}
	}
	// The existing connection on queue 1 still works both ways.
	msg := []byte("still served while draining")
	if _, err := client.Write(msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	keep.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(keep, buf); err != nil || string(buf) != string(msg) {
		t.Fatalf("read on drained queue's connection: %q, %v", buf, err)
	}
	if _, err := keep.Write(buf); err != nil {
		t.Fatal(err)
	}
	client.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(client, buf); err != nil {
		t.Fatal(err)
	}

	// Every queue drained: SYNs are dropped.
	for q := 0; q < 4; q++ {
		f.s.Drain(q, true)
	}
	if got, _ := f.dial(loopback, 300*time.Millisecond, nil); got >= 0 {
		t.Fatalf("connection accepted on %d with every queue drained", got)
	}
	// Undrain: queue 1 is picked again.
	for q := 0; q < 4; q++ {
		f.s.Drain(q, false)
	}
	seen1 := false
	for i := 0; i < 60 && !seen1; i++ {
		got, _ := f.dial(loopback, 2*time.Second, nil)
		seen1 = got == 1
	}
	if !seen1 {
		t.Fatal("queue 1 never picked after undrain")
	}
	st, _ := f.s.Stats()
	if st.AllDrainedDrops == 0 || st.DrainSkips == 0 {
		t.Errorf("drain counters: AllDrainedDrops=%d DrainSkips=%d", st.AllDrainedDrops, st.DrainSkips)
	}
}

// After Close the group keeps working with the kernel's own hashing, and
// the handle reports ErrClosed.
func TestCloseFallsBackToKernelHash(t *testing.T) {
	f := newSteerFixture(t, 2, nil)
	if err := f.s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if err := f.s.Drain(0, true); !errors.Is(err, ErrClosed) {
		t.Fatalf("Drain after Close: %v", err)
	}
	if _, err := f.s.Stats(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Stats after Close: %v", err)
	}
	for i := 0; i < 5; i++ {
		if got, _ := f.dial(loopback, 2*time.Second, nil); got < 0 {
			t.Fatal("connection not accepted after Close")
		}
	}
	var nilS *Steering
	if err := nilS.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("nil Close: %v", err)
	}
}

func TestRemoveListener(t *testing.T) {
	f := newSteerFixture(t, 3, nil)
	if err := f.s.RemoveListener(1); err != nil {
		t.Fatal(err)
	}
	for _, q := range []int{1, 7, -1} {
		if err := f.s.RemoveListener(q); !errors.Is(err, ErrInvalid) {
			t.Errorf("RemoveListener(%d): %v, want ErrInvalid", q, err)
		}
	}
	if err := f.s.Drain(1, false); !errors.Is(err, ErrInvalid) {
		t.Errorf("undrain a removed queue: %v", err)
	}
	for i := 0; i < 40; i++ {
		got, _ := f.dial(loopback, 2*time.Second, nil)
		if got < 0 || got == 1 {
			t.Fatalf("connection %d landed on %d after queue 1's listener was removed", i, got)
		}
	}
	if err := f.s.RemoveListener(0); err != nil {
		t.Fatal(err)
	}
	if err := f.s.RemoveListener(2); !errors.Is(err, ErrInvalid) {
		t.Errorf("removing the last listener: %v", err)
	}
	for i := 0; i < 10; i++ {
		if got, _ := f.dial(loopback, 2*time.Second, nil); got != 2 {
			t.Fatalf("connection on %d, only queue 2 is left", got)
		}
	}
	st, _ := f.s.Stats()
	if st.NoListener != 0 {
		t.Errorf("NoListener = %d: removed queues were still picked", st.NoListener)
	}
}
