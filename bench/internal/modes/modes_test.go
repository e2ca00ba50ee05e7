package modes

import (
	"context"
	"errors"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zcnet/zcnet/bench/internal/frame"
	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/bench/internal/netns"
	"github.com/zcnet/zcnet/internal/testutil"
)

// The test binary doubles as zcbench's child: RunPair re-executes it with the role
// flags.
func TestMain(m *testing.M) {
	if harness.IsChild(os.Args) {
		os.Exit(harness.ChildMain(os.Args[1:], All(), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func testEnv(t *testing.T) *harness.Env {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := &harness.Env{Exe: exe, ServerHost: "127.0.0.1", Procs: &harness.Procs{}}
	if cli, srv := harness.PickCPUs(); cli >= 0 {
		env.Client.CPUs, env.Server.CPUs = []int{cli}, []int{srv}
	}
	t.Cleanup(env.Procs.KillAll)
	return env
}

// frameFile makes a FileSend file of n frames of size bytes for the test.
func frameFile(t *testing.T, size, n int, corrupt int64) string {
	t.Helper()
	p, err := harness.MakeFrameFile(t.TempDir(), size, int64(size*n), corrupt)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tinyCase is a fast case of every scenario: the plumbing, not the speed. MultiCore
// runs its load generator and a one-queue server on the test's one-CPU placements.
func tinyCase(t *testing.T, mode string, s harness.Scenario) harness.Case {
	c := harness.Case{Scenario: s, Mode: mode, Size: 4096, Conns: 1, RecvBuf: 64 << 10,
		Duration: 40 * time.Millisecond, CorruptSeq: -1}
	switch s {
	case harness.Echo:
		c.Size, c.Conns = 64, 8
	case harness.PingPong, harness.HTTP:
		c.Size = 64
		if s == harness.HTTP {
			c.Conns = 4
		}
	case harness.MultiCore:
		c.Size, c.Conns, c.Queues = 64, 24, 2 // two queues (not pinned) on the server's CPU: steering is exercised
	case harness.Idle:
		c.Size, c.Conns = 64, 40
	case harness.FileSend:
		c.Size = 64 << 10
		c.File = frameFile(t, c.Size, 48, -1)
	}
	return c
}

// checkSane checks figures that hold whatever the machine's speed.
func checkSane(t *testing.T, c harness.Case, r harness.Rep, env *harness.Env) {
	t.Helper()
	pos := func(name string, v float64) {
		if !(v > 0) || math.IsInf(v, 0) {
			t.Errorf("%s = %v, want a positive number", name, v)
		}
	}
	if c.Scenario == harness.Idle {
		if r.IdleConns != c.Conns || r.Server.RSSAfter == 0 || r.Server.RSSBefore == 0 || math.IsNaN(r.IdleBytesPerConn) {
			t.Errorf("idle: %d of %d connections, RSS %d -> %d, %v bytes/conn", r.IdleConns, c.Conns,
				r.Server.RSSBefore, r.Server.RSSAfter, r.IdleBytesPerConn)
		}
		if !math.IsNaN(r.MsgsPerS) || !math.IsNaN(r.Gbps) {
			t.Errorf("idle reports traffic: %v msgs/s, %v Gbit/s", r.MsgsPerS, r.Gbps)
		}
	} else if c.Scenario.RequestResponse() {
		pos("msgs/s", r.MsgsPerS)
		pos("p50", r.P50us)
		if !(r.P50us <= r.P99us && r.P99us <= r.P999us) {
			t.Errorf("percentiles out of order: %v %v %v", r.P50us, r.P99us, r.P999us)
		}
		if r.Client.Frames != r.Client.Sent || r.Server.Frames != r.Client.Sent {
			t.Errorf("frames: client sent %d, server %d, client got back %d", r.Client.Sent, r.Server.Frames, r.Client.Frames)
		}
		if !math.IsNaN(r.Gbps) {
			t.Errorf("Gbps = %v for a request/response scenario", r.Gbps)
		}
	} else {
		pos("Gbps", r.Gbps)
		pos("CPU snd", r.CPUSndPerGB+1e-12)
		pos("CPU rcv", r.CPURcvPerGB+1e-12)
		if r.Server.Frames != r.Client.Sent || r.Bytes != r.Client.Sent*uint64(c.Size) {
			t.Errorf("server verified %d frames (%d bytes), client sent %d", r.Server.Frames, r.Bytes, r.Client.Sent)
		}
		if c.Scenario == harness.FileSend {
			if st, err := os.Stat(c.File); err != nil || int64(r.Bytes) != st.Size() {
				t.Errorf("file send: %d bytes verified of a %v-byte file (%v)", r.Bytes, st.Size(), err)
			}
		}
	}
	if c.Scenario != harness.Idle && (r.Server.Wall <= 0 || r.Client.Wall <= 0) {
		t.Errorf("wall times %v %v", r.Server.Wall, r.Client.Wall)
	}
	if len(env.Client.CPUs) > 0 {
		if !slices.Equal(r.Client.CPUs, env.Client.CPUs) || !slices.Equal(r.Server.CPUs, env.Server.CPUs) {
			t.Errorf("pinning: client on %v (want %v), server on %v (want %v)", r.Client.CPUs, env.Client.CPUs, r.Server.CPUs, env.Server.CPUs)
		}
	}
}

// requireAvailable fails the test when a mode cannot run s here: every mode runs on a root
// Linux 6.6+ host (zc-mmap needs TCP_ZEROCOPY_RECEIVE, 4.18; zc-cpu BPF steering, 6.6), so
// a refusal there is a regression, not a missing feature. Without root (not how make test
// runs) a mode that needs it is skipped.
func requireAvailable(t *testing.T, m harness.Mode, s harness.Scenario) {
	t.Helper()
	if !harness.Supports(m, s) {
		t.Fatalf("%s does not run %s", m.Name(), s)
	}
	err := m.Available()
	if err != nil && os.Geteuid() != 0 {
		t.Skipf("%s: %v (not root)", m.Name(), err)
	}
	testutil.SkipIfNotSupported(t, err, "6.6")
}

func TestModesEndToEnd(t *testing.T) {
	env := testEnv(t)
	for _, m := range All() {
		for _, s := range harness.Scenarios {
			if (m.Name() == "zc-copy" || m.Name() == "zc-sendzc") && (s == harness.PingPong || s == harness.Stream) {
				continue // the same code as zc's echo and bulk paths; keeps the test short
			}
			if !harness.Supports(m, s) {
				continue // the mode's model has no such scenario (netpoll serves no HTTP)
			}
			if s.Service() {
				continue // the services suite has its own tests (cmd/zcbench TestServicesRun)
			}
			t.Run(m.Name()+"/"+string(s), func(t *testing.T) {
				requireAvailable(t, m, s)
				c := tinyCase(t, m.Name(), s)
				r, err := harness.RunPair(context.Background(), env, c)
				if err != nil {
					t.Fatal(err)
				}
				checkSane(t, c, r, env)
				if m.Name() == "zc-mmap" {
					checkMapped(t, s, r)
				}
				if s == harness.MultiCore && strings.HasPrefix(m.Name(), "zc") {
					checkSteering(t, m.Name(), r)
				}
				// The C servers are driven by the zc rows' own client (zc runs on every
				// host make test runs on): goal 13 compares two servers under one load.
				if strings.HasPrefix(m.Name(), "c-") && s != harness.MultiCore && r.Client.Notes["echo-client"] != "zc" {
					t.Errorf("%s's client was %q, want zc's", m.Name(), r.Client.Notes["echo-client"])
				}
			})
		}
	}
}

// checkSteering: a multi-core zc server says how its listener steered, and that is
// what its configuration asked for.
func checkSteering(t *testing.T, mode string, r harness.Rep) {
	t.Helper()
	st := r.Server.Notes["steering"]
	t.Logf("%s: steering %q, per queue %q", mode, st, r.Server.Notes["per_queue"])
	want := map[string]string{"zc-hash": "hash (reuseport-hash)", "zc-cpu": "bpf (cpu policy)"}[mode]
	if st == "" || (want != "" && !strings.HasPrefix(st, want)) {
		t.Errorf("%s steering note %q, want %q", mode, st, want)
	}
	if q := r.Server.Notes["per_queue"]; !strings.Contains(q, "q") {
		t.Errorf("%s per-queue note %q", mode, q)
	}
}

// checkMapped: zc-mmap's server counts every received byte as mapped or copied, and a
// bulk stream of 4 KiB frames from its SEND_ZC sender with a 4 KiB MSS maps pages.
func checkMapped(t *testing.T, s harness.Scenario, r harness.Rep) {
	t.Helper()
	wantBytes := r.Bytes
	if s.RequestResponse() {
		wantBytes = r.Server.Bytes
	}
	if got := r.RxMappedBytes + r.RxCopiedBytes; got != wantBytes {
		t.Errorf("mapped %d + copied %d = %d received bytes, the verifier checked %d", r.RxMappedBytes, r.RxCopiedBytes, got, wantBytes)
	}
	if s == harness.Bulk && r.RxMappedBytes == 0 {
		t.Errorf("no byte mapped (copied %d)", r.RxCopiedBytes)
	}
}

func TestCorruptionFailsTheRun(t *testing.T) {
	env := testEnv(t)
	for _, m := range All() {
		if !slices.Contains([]string{"net", "syscall", "netpoll", "zc", "zc-mmap", "c-uring", "c-epoll"}, m.Name()) {
			continue // one of each kind keeps the test short; all modes share the check
		}
		for _, s := range []harness.Scenario{harness.Bulk, harness.Echo} {
			if !harness.Supports(m, s) {
				continue
			}
			t.Run(m.Name()+"/"+string(s), func(t *testing.T) {
				requireAvailable(t, m, s)
				c := tinyCase(t, m.Name(), s)
				c.CorruptSeq = 0 // every connection sends frame 0, however loaded the machine
				_, err := harness.RunPair(context.Background(), env, c)
				if !errors.Is(err, frame.ErrCorrupt) {
					t.Fatalf("err = %v, want ErrCorrupt", err)
				}
				var ie *harness.IntegrityError
				if !errors.As(err, &ie) || ie.Case.Mode != m.Name() {
					t.Fatalf("err = %#v, want an IntegrityError naming the mode", err)
				}
			})
		}
	}
}

// The harness's own clients and the file send find corrupted frames too: the load
// generator's and the HTTP client's requests, and a frame file with a bad frame.
func TestCorruptionHarnessScenarios(t *testing.T) {
	env := testEnv(t)
	for _, tc := range []struct {
		mode string
		s    harness.Scenario
	}{{"net", harness.MultiCore}, {"net", harness.HTTP}, {"net", harness.FileSend}, {"zc-net", harness.FileSend}, {"zc-net-ring", harness.FileSend}} {
		t.Run(tc.mode+"/"+string(tc.s), func(t *testing.T) {
			var m harness.Mode
			for _, x := range All() {
				if x.Name() == tc.mode {
					m = x
				}
			}
			requireAvailable(t, m, tc.s)
			c := tinyCase(t, tc.mode, tc.s)
			c.CorruptSeq = 0 // every connection sends frame 0, however loaded the machine
			if tc.s == harness.FileSend {
				c.File = frameFile(t, c.Size, 16, 2)
			}
			_, err := harness.RunPair(context.Background(), env, c)
			if !errors.Is(err, frame.ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	p, err := netns.Create()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	env := testEnv(t)
	env.ServerHost = netns.ServerIP
	env.Server.NetNS, env.Client.NetNS = p.ServerNS, p.ClientNS
	c := tinyCase(t, "syscall", harness.Bulk)
	r, err := harness.RunPair(context.Background(), env, c)
	if err != nil {
		t.Fatal(err)
	}
	checkSane(t, c, r, env)
	names := []string{p.Server, p.Client}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, err := os.Stat("/run/netns/" + n); !os.IsNotExist(err) {
			t.Errorf("namespace %s left behind (%v)", n, err)
		}
	}
}
