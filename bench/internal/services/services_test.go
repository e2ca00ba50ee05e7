package services

import (
	"context"
	"testing"
	"time"

	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/zc"
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
