package zc

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/tcpglue"
)

const steerChildEnv = "ZC_STEER_CHILD"

func steerEngine(t *testing.T, mode SteeringMode) (*Engine, *Listener, *peerEvents) {
	if err := bpf.Probe(); err != nil {
		t.Skipf("BPF steering unavailable: %v", err)
	}
	e := newEngine(t, Config{Queues: 2, Steering: mode, NoPin: true})
	l, ev := listenEvents(t, e)
	if l.Steering() == nil {
		t.Fatalf("no steering: %s", l.SteeringFallback())
	}
	return e, l, ev
}

func dialFrom(t *testing.T, from string, to netip.AddrPort) *tcpglue.Socket {
	s, err := tcpglue.DialAddrPort(to, tcpglue.DialOptions{LocalAddr: netip.MustParseAddrPort(from)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSteeringFlowTableAndDrain(t *testing.T) {
	_, l, ev := steerEngine(t, SteerBPF)
	st := l.Steering()
	srvAddr := l.Addr().(interface{ AddrPort() netip.AddrPort }).AddrPort()
	for _, c := range []struct {
		peer  string
		queue int
	}{{"127.0.0.2", 1}, {"127.0.0.3", 0}, {"127.0.0.4", 1}} {
		key := bpf.FlowKey{Remote: netip.AddrPortFrom(netip.MustParseAddr(c.peer), 0), Local: srvAddr}
		if err := st.SetFlow(key, c.queue); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			dialFrom(t, c.peer+":0", srvAddr)
			conn := recvEvent(t, ev.conn, "accept")
			if conn.Queue() != c.queue {
				t.Fatalf("flow from %s landed on queue %d, programmed %d", c.peer, conn.Queue(), c.queue)
			}
		}
	}
	// Drain queue 0: new connections without a flow entry avoid it, the old ones keep working.
	if err := st.Drain(0, true); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		dialFrom(t, "127.0.0.5:0", srvAddr)
		if q := recvEvent(t, ev.conn, "accept").Queue(); q != 1 {
			t.Fatalf("connection landed on drained queue %d", q)
		}
	}
	if err := st.Drain(0, false); err != nil {
		t.Fatal(err)
	}
}

func TestSteeringNoStaleFlows(t *testing.T) {
	e, l, ev := steerEngine(t, SteerAuto)
	srvAddr := l.Addr().(interface{ AddrPort() netip.AddrPort }).AddrPort()
	var conns []*Conn
	for i := 0; i < 100; i++ {
		s := dialFrom(t, "127.0.0.6:0", srvAddr)
		conns = append(conns, recvEvent(t, ev.conn, "accept"))
		s.Close()
	}
	for _, c := range conns {
		c.Close()
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("connection did not close after its peer left")
		}
	}
	learned, err := l.Steering().Learned()
	if err != nil {
		t.Fatal(err)
	}
	for k := range learned {
		if k.Remote.Addr() == netip.MustParseAddr("127.0.0.6") {
			t.Fatalf("stale flow %v after churn (%d learned)", k, len(learned))
		}
	}
	if e.Stats().SteeringFallbacks != 0 {
		t.Fatal("fallback counted although steering loaded")
	}
}

// TestSteeringFallback runs a child without CAP_BPF/CAP_NET_ADMIN: SteerAuto falls back to
// SO_REUSEPORT hashing visibly, SteerBPF fails with the typed error.
func TestSteeringFallback(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to drop capabilities in a child")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	cmd := exec.Command(setpriv, "--bounding-set", "-bpf,-sys_admin,-net_admin,-perfmon", "--inh-caps", "-all", "--", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), steerChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "STEER-FALLBACK-OK") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

func steerChild() int {
	e, err := New(Config{Queues: 2, NoPin: true, SendBufs: 16, RecvBufs: 16, SendBufSize: 16 << 10, RecvBufSize: 16 << 10})
	if err != nil {
		println("new:", err.Error())
		return 1
	}
	defer e.Close()
	l, err := e.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return HandlerFuncs{} })
	if err != nil {
		println("listen:", err.Error())
		return 1
	}
	defer l.Close()
	if l.Steering() != nil || l.SteeringFallback() == "" || e.Stats().SteeringFallbacks != 1 {
		println("fallback not visible")
		return 1
	}
	println("fallback:", l.SteeringFallback())
	e2, err := New(Config{Queues: 2, NoPin: true, Steering: SteerBPF, SendBufs: 16, RecvBufs: 16, SendBufSize: 16 << 10, RecvBufSize: 16 << 10})
	if err != nil {
		println("new:", err.Error())
		return 1
	}
	defer e2.Close()
	_, err = e2.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return HandlerFuncs{} })
	if !errors.Is(err, bpf.ErrPermission) {
		println("SteerBPF without privileges:", err)
		return 1
	}
	println("forbidden fallback:", err.Error())
	println("STEER-FALLBACK-OK")
	return 0
}
