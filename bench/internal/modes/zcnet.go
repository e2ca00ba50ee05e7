package modes

import (
	"context"
	"net"
	"slices"

	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/netconn"
)

// ZCNet ("zc-net") is zc's net.Conn face (zc/netconn: Listen / Dial) driven by
// the very code that drives Go net (blocking.go): what a program that keeps its
// net.Conn code gets by switching to zc. It runs the scenarios of issue 10's goal 5:
// net/http on netconn.Listen (HTTP), a file sent with io.Copy from an *os.File (FileSend:
// io.Copy uses the connection's io.ReaderFrom when it has one), and idle connections.
// The engine is configured like "zc"'s (io_uring, fallback forbidden, NoPin). Its Read is
// read(2) on the reading goroutine (zc's default); "zc-net-ring" (Ring) reads through the
// queue's receive ring instead (netconn.Options.Ring), side by side for HTTP and file send.
type ZCNet struct{ Ring bool }

var zcNetScenarios = []harness.Scenario{harness.FileSend, harness.HTTP, harness.Idle, harness.HTTPWrk}

// Name implements harness.Mode.
func (z ZCNet) Name() string {
	if z.Ring {
		return "zc-net-ring"
	}
	return "zc-net"
}

// Supports implements harness.ScenarioSupporter.
func (z ZCNet) Supports(s harness.Scenario) bool {
	return slices.Contains(zcNetScenarios, s) && !(z.Ring && s == harness.Idle)
}

// FDsPerConn implements harness.FDCounter: a net.Conn face that reads directly holds a
// duplicate of its socket in Go's poller.
func (z ZCNet) FDsPerConn() int {
	if z.Ring {
		return 1
	}
	return 2
}

// Available implements harness.Mode.
func (ZCNet) Available() error { return ZC{path: zc.SendAdaptive}.Available() }

func (z ZCNet) config(c harness.Case, server bool) zc.Config {
	return ZC{path: zc.SendAdaptive}.config(c, server)
}

// face is the face's options: Ring reads through the queue's receive ring.
func (z ZCNet) face() netconn.Options { return netconn.Options{Ring: z.Ring} }

// Server implements harness.Mode.
func (z ZCNet) Server(_ context.Context, c harness.Case, m *harness.Meter, ready func(string)) error {
	e, err := zc.New(z.config(c, true))
	if err != nil {
		return err
	}
	defer e.Close()
	ln, err := z.face().Listen(e, "tcp", c.Addr)
	if err != nil {
		return err
	}
	if c.Scenario == harness.HTTP || c.Scenario == harness.HTTPWrk {
		err = harness.ServeHTTP(c, m, ln, ready)
	} else {
		err = serve(c, m, netConnListener{ln}, ready)
	}
	m.Stop() // the engine's teardown is not measured
	addZCStats(m, e)
	return err
}

// Client implements harness.Mode.
func (z ZCNet) Client(ctx context.Context, c harness.Case, m *harness.Meter) error {
	e, err := zc.New(z.config(c, false))
	if err != nil {
		return err
	}
	defer e.Close()
	err = drive(c, m, 0, func() (stream, error) { return z.face().Dial(ctx, e, "tcp", c.Addr) })
	m.Stop()
	addZCStats(m, e)
	return err
}

// netConnListener serves any net.Listener to the blocking loops.
type netConnListener struct{ l net.Listener }

func (n netConnListener) Accept() (stream, error) { return n.l.Accept() }
func (n netConnListener) Addr() string            { return n.l.Addr().String() }
func (n netConnListener) Close() error            { return n.l.Close() }
