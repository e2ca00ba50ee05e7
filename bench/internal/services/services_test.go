package services

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/ztls"
)

// runPair runs one services case in this process: the server in a goroutine, the
// client here; both must succeed and the client must have verified some units.
func runPair(t *testing.T, c harness.Case, server func(harness.Case, *harness.Meter, func(string)) error) {
	t.Helper()
	if err := (Mode{name: "zc"}).Available(); err != nil {
		t.Skip("zc:", err)
	}
	c.Addr = "127.0.0.1:0"
	ready := make(chan string, 1)
	srvErr := make(chan error, 1)
	go func() { srvErr <- server(c, harness.NewMeter(c, false), func(a string) { ready <- a }) }()
	select {
	case c.Addr = <-ready:
	case err := <-srvErr:
		t.Fatal("server:", err)
	}
	cm := harness.NewMeter(c, true)
	if err := (Mode{name: "zc"}).Client(context.Background(), c, cm); err != nil {
		t.Fatal("client:", err)
	}
	select {
	case err := <-srvErr:
		if err != nil {
			t.Fatal("server:", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("server did not finish")
	}
}

// With a send pool of a few 4 KiB buffers the zc key-value server runs out of buffers all
// the time (values up to 100 KiB): its responses wait in out, receiving pauses, OnWritable
// resumes it, and every byte still arrives in order (the client checks each value).
func TestKVZCWaitsForBuffers(t *testing.T) {
	old := zcConfig
	t.Cleanup(func() { zcConfig = old })
	zcConfig = func() zc.Config {
		cfg := old()
		cfg.SendBufSize, cfg.SendBufs, cfg.SendPoolMax = 4096, 4, 16<<10
		return cfg
	}
	for _, size := range []int{64, KVMixMax} {
		c := harness.Case{Scenario: harness.KV, Mode: "zc", Size: size, Conns: 4, RecvBuf: 64 << 10,
			Duration: 200 * time.Millisecond, CorruptSeq: -1}
		runPair(t, c, func(c harness.Case, m *harness.Meter, ready func(string)) error { return kvZC(c, m, ready) })
	}
}

// With receive buffers of 1 KiB, requests (headers and keys included) are split between
// buffers all the time: the zc key-value server's Reader path (Peek, Skip) serves them, and
// the client checks every value; with the default send pool, values of kvSharedMin bytes
// or more are sent by reference from the store's registered buffers.
func TestKVZCSplitRequests(t *testing.T) {
	old := zcConfig
	t.Cleanup(func() { zcConfig = old })
	for _, rb := range []int{1 << 10, 0} {
		zcConfig = func() zc.Config {
			cfg := old()
			cfg.RecvBufSize = rb
			return cfg
		}
		for _, size := range []int{64, KVMixMax} {
			c := harness.Case{Scenario: harness.KV, Mode: "zc", Size: size, Conns: 4, RecvBuf: 64 << 10,
				Duration: 200 * time.Millisecond, CorruptSeq: -1}
			runPair(t, c, func(c harness.Case, m *harness.Meter, ready func(string)) error { return kvZC(c, m, ready) })
		}
	}
}

// The straightforward key-value server (values in Go memory, each GET's value sent with
// SendBytes): with a pool of a few 4 KiB buffers its headers wait for buffers (and the
// values behind them are copied after them), with 1 KiB receive buffers its requests are
// split; every value the client reads is checked.
func TestKVZCStraight(t *testing.T) {
	old := zcConfig
	t.Cleanup(func() { zcConfig = old })
	for _, tc := range []struct {
		name string
		mod  func(*zc.Config)
	}{
		{"default", func(*zc.Config) {}},
		{"fewBuffers", func(cfg *zc.Config) { cfg.SendBufSize, cfg.SendBufs, cfg.SendPoolMax = 4096, 4, 16<<10 }},
		{"splitRequests", func(cfg *zc.Config) { cfg.RecvBufSize = 1 << 10 }},
	} {
		zcConfig = func() zc.Config {
			cfg := old()
			tc.mod(&cfg)
			return cfg
		}
		for _, size := range []int{64, KVMixMax} {
			c := harness.Case{Scenario: harness.KV, Mode: ZCStraight, Size: size, Conns: 4, RecvBuf: 64 << 10,
				Duration: 200 * time.Millisecond, CorruptSeq: -1}
			runPair(t, c, func(c harness.Case, m *harness.Meter, ready func(string)) error { return kvZCStraight(c, m, ready) })
		}
	}
}

// The straightforward server's store reuses its slices (a SET into the key's slice, or
// one from the free list) and never writes a slice a SendBytes still holds: with
// Config.Debug.Buffers zc checksums each value at SendBytes and again before its
// callback, so a write in between is reported; the client checks every value it reads.
// Every path of the store is taken: in place, from the free list, new, and a replaced
// slice freed by its last send's callback.
func TestKVZCStraightReuse(t *testing.T) {
	old, oldMade := zcConfig, kvAppStoreMade
	t.Cleanup(func() { zcConfig, kvAppStoreMade = old, oldMade })
	var misuses atomic.Int64
	var firstMisuse atomic.Value
	zcConfig = func() zc.Config {
		cfg := old()
		cfg.Debug.Buffers = true
		cfg.Debug.OnMisuse = func(err error) {
			if misuses.Add(1) == 1 {
				firstMisuse.Store(err.Error())
			}
		}
		return cfg
	}
	var stores []*kvAppStore
	kvAppStoreMade = func(s *kvAppStore) { stores = append(stores, s) }
	var inPlace, reused, made, freedLate int
	for _, size := range []int{64, KVMixMax} {
		c := harness.Case{Scenario: harness.KV, Mode: ZCStraight, Size: size, Conns: 8, RecvBuf: 64 << 10,
			Duration: 300 * time.Millisecond, CorruptSeq: -1}
		runPair(t, c, func(c harness.Case, m *harness.Meter, ready func(string)) error { return kvZCStraight(c, m, ready) })
	}
	if n := misuses.Load(); n > 0 {
		t.Fatalf("%d misuses reported, the first: %v", n, firstMisuse.Load())
	}
	for _, s := range stores {
		inPlace, reused, made, freedLate = inPlace+s.inPlace, reused+s.reused, made+s.made, freedLate+s.freedLate
	}
	t.Logf("SETs: %d in place, %d from the free list, %d new slices; %d freed by a callback", inPlace, reused, made, freedLate)
	if len(stores) != 2 || inPlace == 0 || reused == 0 || made == 0 || freedLate == 0 {
		t.Errorf("%d stores; SETs %d in place, %d reused, %d new, %d freed late: want each > 0", len(stores), inPlace, reused, made, freedLate)
	}
}

// The zc fan-out server with a pool of a few buffers: the publisher's receive buffers are
// shared by every subscriber (a slow one holds them; the publisher stops receiving at its
// MaxRecvHeld), a message split between two Data finds no send buffer now and then and is
// dropped for all, slow subscribers are skipped, and what arrives is whole and in order.
func TestFanoutZCWaitsForBuffers(t *testing.T) {
	old := zcConfig
	t.Cleanup(func() { zcConfig = old })
	zcConfig = func() zc.Config {
		cfg := old()
		cfg.SendBufSize, cfg.SendBufs, cfg.SendPoolMax = 16<<10, 4, 64<<10
		return cfg
	}
	c := harness.Case{Scenario: harness.FanOut, Mode: "zc", Size: 1 << 10, Conns: 20, RecvBuf: 64 << 10,
		Duration: 200 * time.Millisecond, CorruptSeq: -1}
	runPair(t, c, func(c harness.Case, m *harness.Meter, ready func(string)) error { return fanoutZC(c, m, ready) })
}

// runTLS runs one files-tls case of mode in this process and returns the server's notes
// and the server's and the client's errors.
func runTLS(t *testing.T, mode string, conns int) (notes map[string]string, srvErr, cliErr error) {
	t.Helper()
	file, err := harness.MakeFrameFile(t.TempDir(), 64<<10, 4<<20, -1)
	if err != nil {
		t.Fatal(err)
	}
	return runTLSCase(t, harness.Case{Scenario: harness.FilesTLS, Mode: mode, Size: 64 << 10, Conns: conns, RecvBuf: 64 << 10,
		Duration: time.Second, CorruptSeq: -1, Addr: "127.0.0.1:0", File: file, Total: 2 << 20})
}

// runTLSCase runs one case of a TLS mode in this process (see runTLS).
func runTLSCase(t *testing.T, c harness.Case) (notes map[string]string, srvErr, cliErr error) {
	t.Helper()
	mode := c.Mode
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	m := TLSMode{mode}
	sm := harness.NewMeter(c, false)
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- m.Server(context.Background(), c, sm, func(a string) { ready <- a }) }()
	select {
	case c.Addr = <-ready:
	case err := <-done:
		return nil, err, nil
	}
	cm := harness.NewMeter(c, true)
	cliErr = m.Client(context.Background(), c, cm)
	select {
	case srvErr = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("server did not finish")
	}
	if cliErr == nil {
		if got := cm.CheckErr(); got != nil {
			t.Fatal(got)
		}
	}
	return sm.Notes(), srvErr, cliErr
}

// files-tls with crypto/tls and with ztls's user-space path: every byte of every client's
// slice arrives (the client checks each frame), the server notes TLS 1.3 with the suite it
// negotiated, and ztls-user's handshakes all stayed in user space.
func TestFilesTLSUserSpace(t *testing.T) {
	for _, mode := range []string{NetTLS, ZTLSUser} {
		notes, srvErr, cliErr := runTLS(t, mode, 3)
		if srvErr != nil || cliErr != nil {
			t.Fatalf("%s: server %v, client %v", mode, srvErr, cliErr)
		}
		if !strings.HasPrefix(notes["tls"], "TLS 1.3 TLS_") {
			t.Errorf("%s: negotiated %q", mode, notes["tls"])
		}
		if mode == ZTLSUser && notes["ztls_handshakes"] != "kernel 0, user 3, refused 0" {
			t.Errorf("ztls-user handshakes: %q", notes["ztls_handshakes"])
		}
	}
}

// relay-tls with crypto/tls and ztls-user: 4 TLS clients through the relay to the plain
// backend, 1 MiB each way on each, every frame checked at both ends to the last (the
// relay passes each direction's end on: CloseWrite, close_notify towards the client).
func TestRelayTLSUserSpace(t *testing.T) {
	for _, mode := range []string{NetTLS, ZTLSUser} {
		bl, err := listenNet(context.Background(), "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		backend := bl.Addr().String()
		bl.Close() // the client process listens there
		notes, srvErr, cliErr := runTLSCase(t, harness.Case{Scenario: harness.RelayTLS, Mode: mode, Size: 64 << 10, Conns: 4,
			RecvBuf: 64 << 10, Duration: time.Second, CorruptSeq: -1, Addr: "127.0.0.1:0", Backend: backend, Total: 1 << 20})
		if srvErr != nil || cliErr != nil {
			t.Fatalf("%s: server %v, client %v", mode, srvErr, cliErr)
		}
		if !strings.HasPrefix(notes["tls"], "TLS 1.3 TLS_") {
			t.Errorf("%s: negotiated %q", mode, notes["tls"])
		}
	}
}

// The ztls mode never falls back to user space unseen: where the kernel has no TLS its
// Available says so ("not available here: kernel TLS ..."), and a server forced to run
// anyway fails the case (NoFallback) instead of measuring crypto/tls under ztls's name.
// Where the kernel has TLS, every handshake went to the kernel.
func TestZTLSModeNoSilentFallback(t *testing.T) {
	avail := TLSMode{ZTLS}.Available()
	probe := ztls.Probe()
	if (avail == nil) != (probe == nil) {
		t.Fatalf("Available %v, but ztls.Probe %v", avail, probe)
	}
	if avail != nil {
		if !strings.HasPrefix(avail.Error(), "not available here: kernel TLS") || !errors.Is(avail, zc.ErrNotSupported) {
			t.Errorf("Available: %v", avail)
		}
		if strings.Contains(probe.Error(), "CONFIG_TLS") && !strings.Contains(avail.Error(), "kernel TLS (CONFIG_TLS not set): ") {
			t.Errorf("Available does not say CONFIG_TLS is not set: %v", avail)
		}
	}
	notes, srvErr, cliErr := runTLS(t, ZTLS, 2)
	if avail == nil {
		if srvErr != nil || cliErr != nil || notes["ztls_handshakes"] != "kernel 2, user 0, refused 0" {
			t.Fatalf("with kernel TLS: server %v, client %v, handshakes %q", srvErr, cliErr, notes["ztls_handshakes"])
		}
		return
	}
	if cliErr == nil && srvErr == nil {
		t.Fatalf("without kernel TLS the ztls case succeeded (handshakes %q)", notes["ztls_handshakes"])
	}
	var nk *ztls.NoKernelError
	if !errors.As(srvErr, &nk) {
		t.Errorf("server error %v, want a *ztls.NoKernelError", srvErr)
	}
}
