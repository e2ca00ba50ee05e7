// Package services is zcbench's services suite (issue 20): the servers users write with
// zc and with Go's net — a TCP relay, a pub/sub fan-out, a file streamer, a pipelined
// key-value store — and the load generators that drive and check them.
//
// Each server is written the way its users write it: Go net with a goroutine per
// connection (per direction for the relay), io.Copy, bufio, a bounded channel per
// subscriber; zc in the event-loop style its docs teach (zc.Relay with DialAsync, Data
// parsed in OnData, loop-driven senders resumed by OnWritable). The client side of every
// service runs in the client process on Go net and is the same whatever the server: it
// checks every byte and counts the units of work (Meter.Count, verifiers), and the
// server's CPU is spread over them.
//
// The zc servers keep each send that another helper's API may replace in one function:
// zcRelay (a splice relay), zcDeliver (a shared send to many subscribers), zcFileSend
// (Conn.SendFile).
package services

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"

	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/zc"
)

// Mode is one server implementation of the services: "net" (Go net), "net-aa" (the same
// again, the services' A/A pair), "zc" (the event-loop API) or "zc-straight" (the
// key-value server written the straightforward way with it).
type Mode struct {
	name  string
	scens []harness.Scenario
}

// Modes lists the services modes.
func Modes() []harness.Mode {
	own := []harness.Scenario{harness.Relay, harness.RelayHalfClose, harness.FanOut, harness.FileStream, harness.KV}
	return []harness.Mode{
		Mode{name: "net", scens: own},
		// net run again as a variant of its own: the A/A pair of the services (relay ×8
		// and key-value small), so the services goals are read against their own noise.
		Mode{name: NetAA, scens: []harness.Scenario{harness.Relay, harness.KV}},
		Mode{name: "zc", scens: own},
		// the key-value server written the straightforward way (values in Go memory,
		// sent with Conn.SendBytes), beside the tuned one (issue 29)
		Mode{name: ZCStraight, scens: []harness.Scenario{harness.KV}},
	}
}

// ZCStraight is the straightforward zc key-value server (kvZCStraight).
const ZCStraight = "zc-straight"

// NetAA is the A/A copy of the net services.
const NetAA = "net-aa"

// Name implements harness.Mode.
func (m Mode) Name() string { return m.name }

// Supports implements harness.ScenarioSupporter.
func (m Mode) Supports(s harness.Scenario) bool { return slices.Contains(m.scens, s) }

// ServiceMode marks a harness.ServiceMode.
func (Mode) ServiceMode() {}

// Available implements harness.Mode.
func (m Mode) Available() error {
	if m.name != "zc" && m.name != ZCStraight {
		return nil
	}
	e, err := zc.New(zc.Config{Queues: 1, Backend: zc.BackendIOUring, NoFallback: true, NoPin: true, SendBufs: 16, RecvBufs: 16})
	if err != nil {
		return err
	}
	return e.Close()
}

// Server implements harness.Mode.
func (m Mode) Server(ctx context.Context, c harness.Case, mt *harness.Meter, ready func(string)) error {
	isZC := m.name == "zc"
	switch c.Scenario {
	case harness.Relay, harness.RelayHalfClose:
		if isZC {
			return relayZC(ctx, c, mt, ready)
		}
		return relayNet(ctx, c, mt, ready)
	case harness.FanOut:
		if isZC {
			return fanoutZC(c, mt, ready)
		}
		return fanoutNet(ctx, c, mt, ready)
	case harness.FileStream:
		if isZC {
			return filesZC(c, mt, ready)
		}
		return filesNet(ctx, c, mt, ready)
	case harness.KV:
		if m.name == ZCStraight {
			return kvZCStraight(c, mt, ready)
		}
		if isZC {
			return kvZC(c, mt, ready)
		}
		return kvNet(ctx, c, mt, ready)
	}
	return fmt.Errorf("services: no %s server for %s", m.name, c.Scenario)
}

// Client implements harness.Mode: the same load for every server.
func (m Mode) Client(ctx context.Context, c harness.Case, mt *harness.Meter) error {
	switch c.Scenario {
	case harness.Relay, harness.RelayHalfClose:
		return relayClient(ctx, c, mt)
	case harness.FanOut:
		return fanoutClient(ctx, c, mt)
	case harness.FileStream:
		return filesClient(ctx, c, mt)
	case harness.KV:
		return kvClient(ctx, c, mt)
	}
	return fmt.Errorf("services: no client for %s", c.Scenario)
}

// zcConfig is the engine of a zc service server: zc's defaults on one queue (the server
// process has one CPU), io_uring without fallback, threads left where zcbench pinned the
// process.
//
// A variable so that tests can shrink the pools and drive the servers' waits.
var zcConfig = func() zc.Config {
	return zc.Config{Queues: 1, Backend: zc.BackendIOUring, NoFallback: true, NoPin: true}
}

// listenNet listens on Go net without MPTCP (Go 1.26 turns it on by default).
func listenNet(ctx context.Context, addr string) (*net.TCPListener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return l.(*net.TCPListener), nil
}

// dialNet dials on Go net without MPTCP.
func dialNet(ctx context.Context, addr string) (*net.TCPConn, error) {
	var d net.Dialer
	d.SetMultipathTCP(false)
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// firstErr keeps the first error of many goroutines.
type firstErr struct {
	ch chan error
	// onErr, if set, runs once with the first error (a client closes its connections,
	// so that nothing waits for a peer that will never send).
	onErr func()
}

// serveNet is the skeleton of every Go server here, as Go users write it: accept c.Conns
// connections, a goroutine per connection running serve (the first error is the run's),
// the meter started at each accept and stopped once every connection is done.
func serveNet(ctx context.Context, c harness.Case, m *harness.Meter, ready func(string), serve func(conn *net.TCPConn) error) error {
	ln, err := listenNet(ctx, c.Addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	ready(ln.Addr().String())
	fail := newFirstErr()
	var wg sync.WaitGroup
	for range c.Conns {
		conn, err := ln.AcceptTCP()
		if err != nil {
			return err
		}
		m.Start()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			fail.set(serve(conn))
		}()
	}
	wg.Wait()
	m.Stop()
	return fail.get()
}

func newFirstErr() *firstErr { return &firstErr{ch: make(chan error, 1)} }

func (f *firstErr) set(err error) {
	if err == nil {
		return
	}
	select {
	case f.ch <- err:
		if f.onErr != nil {
			go f.onErr()
		}
	default:
	}
}

// closers closes connections on a failure, and again (harmlessly) at the end.
type closers struct {
	mu sync.Mutex
	cs []io.Closer
}

func (c *closers) add(x io.Closer) {
	c.mu.Lock()
	c.cs = append(c.cs, x)
	c.mu.Unlock()
}

func (c *closers) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range c.cs {
		x.Close()
	}
}

func (f *firstErr) get() error {
	select {
	case err := <-f.ch:
		f.ch <- err
		return err
	default:
		return nil
	}
}
