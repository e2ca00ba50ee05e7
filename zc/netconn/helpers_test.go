package netconn

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/zcnet/zcnet/zc"
)

// newEngine starts an engine of cfg (2 queues and small pools unless set), closed when the
// test ends.
func newEngine(t testing.TB, cfg zc.Config) *zc.Engine {
	t.Helper()
	if cfg.Queues == 0 {
		cfg.Queues = 2
	}
	if cfg.SendBufs == 0 {
		cfg.SendBufs = 64
	}
	if cfg.RecvBufs == 0 {
		cfg.RecvBufs = 64
	}
	e, err := zc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// hangBound is how long a test waits for what must happen before it calls it a hang (a
// bound for failing, never a measurement).
const hangBound = 10 * time.Second

// waitHang returns what ch delivers, or fails the test as a hang after hangBound, with
// dump's description (dump may be nil).
func waitHang[T any](t *testing.T, ch <-chan T, what string, dump func() string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangBound):
		state := ""
		if dump != nil {
			state = dump()
		}
		t.Fatalf("%s hung\n%s", what, state)
	}
	var zero T
	return zero
}

// engineDump describes the engine for failure messages (its counters: what the public API
// shows).
func engineDump(e *zc.Engine) string {
	return fmt.Sprintf("engine %v: %+v\n", e.Config().Backend, e.Stats())
}

var (
	timeNow         = time.Now
	timeMillisecond = time.Millisecond
)

// netAccepted listens on e with the face, connects Go's net to it and accepts: the peer and
// the accepted net.Conn (the listener and the peer close with the test).
func netAccepted(t *testing.T, e *zc.Engine, o Options) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := o.Listen(e, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return s, nc
}

func newPair(t testing.TB, cfg zc.Config) (srv, cli *zc.Engine) {
	return newEngine(t, cfg), newEngine(t, cfg)
}

// lifetimeBackends are the backends the lifetime tests run on.
var lifetimeBackends = []zc.Backend{zc.BackendIOUring, zc.BackendPlain}
