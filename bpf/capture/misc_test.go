package capture

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/netconn"
)

// TestBadInput: every bad argument gets a typed error and leaves nothing
// behind.
func TestBadInput(t *testing.T) {
	v := newVethPair(t, 1)
	e := zcEngine(t)
	srv := echoListener(t, v, e)
	flow := Flow(bpfFlowKey(netip.AddrPortFrom(v.CliAddr, 40000), srv))
	good := Options{Interfaces: []int{v.SrvIdx}, Snap: 128}
	with := func(f func(o *Options)) Options {
		o := good
		o.Interfaces = append([]int(nil), good.Interfaces...)
		f(&o)
		return o
	}
	before := bpfFDs()
	for _, c := range []struct {
		name string
		w    io.Writer
		opts Options
		sel  []Selector
		want error
	}{
		{"nil writer", nil, good, nil, ErrInvalid},
		{"snap 0", io.Discard, with(func(o *Options) { o.Snap = 0 }), nil, ErrInvalid},
		{"snap negative", io.Discard, with(func(o *Options) { o.Snap = -1 }), nil, ErrInvalid},
		{"snap huge", io.Discard, with(func(o *Options) { o.Snap = MaxSnap + 1 }), nil, ErrInvalid},
		{"snap 1 GiB", io.Discard, with(func(o *Options) { o.Snap = 1 << 30 }), nil, ErrInvalid},
		{"no interface", io.Discard, with(func(o *Options) { o.Interfaces = nil }), nil, ErrInvalid},
		{"ifindex 0", io.Discard, with(func(o *Options) { o.Interfaces = []int{0} }), nil, ErrInvalid},
		{"unknown ifindex", io.Discard, with(func(o *Options) { o.Interfaces = []int{99999} }), nil, ErrInvalid},
		{"interface twice", io.Discard, with(func(o *Options) { o.Interfaces = []int{v.SrvIdx, v.SrvIdx} }), nil, ErrInvalid},
		{"ring not a power of two", io.Discard, with(func(o *Options) { o.RingSize = 3 << 20 }), nil, ErrInvalid},
		{"ring too small for snap", io.Discard, with(func(o *Options) { o.Snap = MaxSnap; o.RingSize = 64 << 10 }), nil, ErrInvalid},
		{"ring too large", io.Discard, with(func(o *Options) { o.RingSize = 2 * MaxRingSize }), nil, ErrInvalid},
		{"unknown hook", io.Discard, with(func(o *Options) { o.Hooks = 1 << 7 }), nil, ErrInvalid},
		{"empty selector", io.Discard, good, []Selector{{}}, ErrInvalid},
		{"flow without addresses", io.Discard, good, []Selector{Flow(bpf.FlowKey{})}, ErrInvalid},
		{"flow of mixed families", io.Discard, good, []Selector{Flow(bpfFlowKey(netip.MustParseAddrPort("[2001:db8::1]:5"), srv))}, ErrInvalid},
		{"flow with local port 0", io.Discard, good, []Selector{Flow(bpfFlowKey(netip.AddrPortFrom(v.CliAddr, 5), netip.AddrPortFrom(v.SrvAddr, 0)))}, ErrInvalid},
		{"listener port 0", io.Discard, good, []Selector{Listener(netip.AddrPortFrom(v.SrvAddr, 0))}, ErrInvalid},
		{"unknown listener", io.Discard, good, []Selector{Listener(netip.AddrPortFrom(v.SrvAddr, 1))}, ErrNotFound},
		{"listener in another namespace", io.Discard, good, []Selector{Listener(netip.AddrPortFrom(v.CliAddr, srv.Port()))}, ErrNotFound},
		{"steered flow without steering", io.Discard, good, []Selector{Steered(nil, bpfFlowKey(netip.AddrPortFrom(v.CliAddr, 5), srv))}, ErrInvalid},
	} {
		var err error
		v.In(t, v.Srv, func() error {
			var cp *Capture
			cp, err = New(c.w, c.opts, c.sel...)
			if err == nil {
				cp.Close()
			}
			return nil
		})
		var oe *OpError
		if !errors.Is(err, c.want) || !errors.As(err, &oe) {
			t.Errorf("%s: %v (%T), want an *OpError matching %v", c.name, err, err, c.want)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
	if after := bpfFDs(); after != before {
		t.Errorf("%d BPF fds before the failed calls, %d after", before, after)
	}

	// Methods of a live capture, then after Close.
	c, _ := startCapture(t, v, good, flow)
	if err := c.Remove(Listener(srv)); !errors.Is(err, ErrNotFound) {
		t.Errorf("remove of a selector never added: %v", err)
	}
	if err := c.Add(Listener(netip.AddrPortFrom(v.SrvAddr, 1))); !errors.Is(err, ErrNotFound) {
		t.Errorf("add of a listener that does not exist (checked from another namespace's thread): %v", err)
	}
	if err := c.Add(Selector{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("add of an empty selector: %v", err)
	}
	if err := c.Add(flow); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // added twice: removed twice
		if err := c.Remove(flow); err != nil {
			t.Fatalf("remove %d: %v", i, err)
		}
	}
	if err := c.Remove(flow); !errors.Is(err, ErrNotFound) {
		t.Errorf("third remove: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"close":  c.Close(),
		"add":    c.Add(flow),
		"remove": c.Remove(flow),
	} {
		if !errors.Is(err, ErrClosed) || !errors.Is(err, os.ErrClosed) {
			t.Errorf("%s after close: %v", name, err)
		}
	}
	if _, err := c.Stats(); err != nil {
		t.Errorf("stats after close: %v", err)
	}
	var nilc *Capture
	if err := nilc.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("nil close: %v", err)
	}

	// A writer that fails: Close reports it, and everything is freed.
	v.In(t, v.Srv, func() (err error) {
		c, err = New(failWriter{}, good, flow)
		return err
	})
	time.Sleep(3 * pollInterval) // the reader flushes when the ring is empty
	if err := c.Close(); err == nil || !strings.Contains(err.Error(), "write pcapng") || !errors.Is(err, errDiskFull) {
		t.Errorf("close after the writer failed: %v", err)
	}
	if after := bpfFDs(); after != before {
		t.Errorf("%d BPF fds before, %d after the failed writer", before, after)
	}
}

var errDiskFull = errors.New("disk full")

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errDiskFull }

// TestSelectors: a Flow selector records only its flow while another
// flow of the same listener runs; a Steered selector needs the flow in the
// Steering's table.
func TestSelectors(t *testing.T) {
	v := newVethPair(t, 1)
	e := zcEngine(t)
	srv := echoListener(t, v, e)

	var st *bpf.Steering
	v.In(t, v.Srv, func() (err error) {
		st, err = bpf.NewSteering(nil, &bpf.Options{Queues: 1})
		return err
	})
	defer st.Close()
	unknown := bpfFlowKey(netip.AddrPortFrom(v.CliAddr, 5), srv)
	var err error
	v.In(t, v.Srv, func() error {
		var c *Capture
		c, err = New(io.Discard, Options{Interfaces: []int{v.SrvIdx}, Snap: 128}, Steered(st, unknown))
		if err == nil {
			c.Close()
		}
		return nil
	})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("steered selector of an unknown flow: %v", err)
	}
	t.Logf("unknown steered flow: %v", err)
	// A peer-wide flow-table entry for the client: a Steered selector of it
	// captures all of the client's flows to srv.
	peer := bpfFlowKey(netip.AddrPortFrom(v.CliAddr, 0), srv)
	if err := st.SetFlow(peer, 0); err != nil {
		t.Fatal(err)
	}
	c, path := startCapture(t, v, Options{Interfaces: []int{v.SrvIdx}, Snap: MaxSnap}, Steered(st, peer))
	if _, err := echoExchange(t, v, e, srv, randomBytes(64<<10)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if s, _ := c.Stats(); s.Written == 0 {
		t.Errorf("steered peer-wide selector captured nothing: %+v", s)
	}
	if sent, echoed := followTCP(t, path, 0); len(sent) != 64<<10 || len(echoed) != 64<<10 {
		t.Errorf("steered capture: %d/%d bytes reassembled", len(sent), len(echoed))
	}

	// Two flows to the same listener; capture one by its 4-tuple, added
	// once it is connected.
	a := newLongFlow(t, v, e, srv)
	b := newLongFlow(t, v, e, srv)
	c, path = startCapture(t, v, Options{Interfaces: []int{v.SrvIdx}, Snap: MaxSnap}, Flow(bpfFlowKey(a.local, srv)))
	payloadA, payloadB := randomBytes(200<<10), randomBytes(300<<10)
	errc := make(chan error, 2)
	go func() { errc <- a.exchange(payloadA) }()
	go func() { errc <- b.exchange(payloadB) }()
	for i := 0; i < 2; i++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	ports := tshark(t, "-r", path, "-T", "fields", "-e", "tcp.srcport", "-e", "tcp.dstport")
	want := strconv.Itoa(int(a.local.Port()))
	for _, line := range strings.Split(strings.TrimSpace(ports), "\n") {
		if !strings.Contains(line, want) {
			t.Errorf("packet of another flow: ports %q, selected %s", line, want)
		}
	}
	if sent, echoed := followTCP(t, path, 0); !equalBytes(sent, payloadA) || !equalBytes(echoed, payloadA) {
		t.Errorf("flow selector: %d/%d bytes reassembled, want %d", len(sent), len(echoed), len(payloadA))
	}
}

func equalBytes(a, b []byte) bool { return string(a) == string(b) }

// longFlow is a connected client whose exchanges echo.
type longFlow struct {
	conn  netconn.Conn
	local netip.AddrPort
}

func newLongFlow(t *testing.T, v *testutil.VethPair, e *zc.Engine, to netip.AddrPort) *longFlow {
	t.Helper()
	f := &longFlow{}
	v.In(t, v.Cli, func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		f.conn, err = netconn.Dial(ctx, e, "tcp", to.String())
		return err
	})
	t.Cleanup(func() { f.conn.Close() })
	f.local = f.conn.LocalAddr().(*net.TCPAddr).AddrPort()
	return f
}

// exchange sends p and reads it back.
func (f *longFlow) exchange(p []byte) error {
	f.conn.SetDeadline(time.Now().Add(30 * time.Second))
	werr := make(chan error, 1)
	go func() {
		_, err := f.conn.Write(p)
		werr <- err
	}()
	got := make([]byte, len(p))
	if _, err := io.ReadFull(f.conn, got); err != nil {
		return err
	}
	if err := <-werr; err != nil {
		return err
	}
	if !equalBytes(got, p) {
		return errors.New("echo differs")
	}
	return nil
}

// TestXDPHook records at XDP: with the capture's own XDP program on an
// interface without one, and with fexit on zcnet's XDP steering program.
// Frames come with their RX queue and the XDP verdict; tc egress adds the
// other direction.
func TestXDPHook(t *testing.T) {
	t.Run("own", func(t *testing.T) { testXDP(t, false) })
	t.Run("fexit", func(t *testing.T) { testXDP(t, true) })
}

func testXDP(t *testing.T, steering bool) {
	v := newVethPair(t, 2)
	e := zcEngine(t)
	srv := echoListener(t, v, e)
	if steering {
		var st *bpf.Steering
		v.In(t, v.Srv, func() (err error) {
			st, err = bpf.NewSteering(nil, &bpf.Options{Queues: 2})
			if err != nil {
				return err
			}
			return st.AttachXDP(v.SrvIdx, bpf.XDPAuto)
		})
		defer st.Close()
	}
	opts := Options{Interfaces: []int{v.SrvIdx}, Hooks: HookXDP | HookEgress, Snap: MaxSnap}
	if steering {
		before := bpfFDs()
		var err error
		v.In(t, v.Srv, func() error {
			var c *Capture
			if c, err = New(io.Discard, opts, Listener(srv)); err == nil {
				c.Close()
			}
			return nil
		})
		if errors.Is(err, ErrPermission) || errors.Is(err, ErrNotSupported) {
			if after := bpfFDs(); after != before {
				t.Errorf("refused, and %d BPF fds left behind", after-before)
			}
			// A flow is unaffected by the refusal.
			if _, err := echoExchange(t, v, e, srv, randomBytes(64<<10)); err != nil {
				t.Fatal(err)
			}
			t.Skipf("this kernel refuses fexit programs: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	c, path := startCapture(t, v, opts, Listener(srv))
	payload := randomBytes(512 << 10)
	if _, err := echoExchange(t, v, e, srv, payload); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	s, _ := c.Stats()
	t.Logf("stats %+v", s)
	_, pkts := readPcapng(t, path)
	xdp := 0
	queues := map[uint32]int{}
	for i, p := range pkts {
		if p.opts.Flags.Direction != pcapgo.NgEpbFlagDirectionInbound {
			continue
		}
		xdp++
		if len(p.opts.Verdicts) != 1 || p.opts.Verdicts[0].Type != pcapgo.NgEpbVerdictTypeLinuxeBPFXDP ||
			len(p.opts.Verdicts[0].Data) != 8 || p.opts.Verdicts[0].Data[0] != 2 /* XDP_PASS */ {
			t.Fatalf("packet %d: verdict %+v, want XDP_PASS", i, p.opts.Verdicts)
		}
		if p.opts.Queue == nil || *p.opts.Queue >= 2 {
			t.Fatalf("packet %d: RX queue %v", i, p.opts.Queue)
		}
		queues[*p.opts.Queue]++
	}
	if xdp == 0 {
		t.Fatal("no packet recorded at XDP")
	}
	verdicts := tshark(t, "-r", path, "-Y", "frame.verdict.ebpf_xdp", "-T", "fields", "-e", "frame.verdict.ebpf_xdp")
	if n := len(strings.Fields(verdicts)); n != xdp {
		t.Errorf("tshark sees %d XDP verdicts, gopacket %d", n, xdp)
	}
	if sent, echoed := followTCP(t, path, 0); !equalBytes(sent, payload) || !equalBytes(echoed, payload) {
		t.Errorf("reassembled: %d/%d bytes, want %d", len(sent), len(echoed), len(payload))
	}
	t.Logf("%d frames recorded at XDP (RX queues %v), all XDP_PASS", xdp, queues)
}

// TestLoopback captures a listener on 127.0.0.1 on lo (in a namespace of
// its own): every packet passes lo's egress and then its ingress, and is
// recorded once, seen from the listener's side.
func TestLoopback(t *testing.T) {
	v := newVethPair(t, 1) // only its server namespace is used
	e := zcEngine(t)
	var ln net.Listener
	v.In(t, v.Srv, func() (err error) {
		ln, err = netconn.Listen(e, "tcp", "127.0.0.1:0")
		return err
	})
	defer ln.Close()
	srv := ln.Addr().(*net.TCPAddr).AddrPort()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { echoConn(c); c.Close() }()
		}
	}()
	c, path := startCapture(t, v, Options{Interfaces: []int{1}, Snap: MaxSnap}, Listener(srv))
	var f *longFlow
	v.In(t, v.Srv, func() (err error) {
		f = &longFlow{}
		f.conn, err = netconn.Dial(context.Background(), e, "tcp", srv.String())
		return err
	})
	payload := randomBytes(300 << 10)
	if err := f.exchange(payload); err != nil {
		t.Fatal(err)
	}
	f.conn.Close()
	time.Sleep(30 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.Stats(); st.Truncated != 0 || st.Dropped != 0 || st.Written != st.Matched {
		t.Errorf("stats %+v", st)
	}
	out := tshark(t, "-r", path, "-Y", "tcp.flags.syn==1", "-T", "fields", "-e", "tcp.flags.ack")
	if got := strings.Fields(out); len(got) != 2 || got[0] != "0" || got[1] != "1" {
		t.Errorf("SYN packets (ack flag): %q, want one SYN and one SYN-ACK", got)
	}
	if sent, echoed := followTCP(t, path, 0); !equalBytes(sent, payload) || !equalBytes(echoed, payload) {
		t.Errorf("reassembled: %d/%d bytes, want %d", len(sent), len(echoed), len(payload))
	}
}
