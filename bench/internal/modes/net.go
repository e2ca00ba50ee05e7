package modes

import (
	"context"
	"net"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// Net is Go's net package: net.TCPConn, one goroutine per connection, the runtime's
// netpoller. It is what zc users switch from, in its best simple configuration: plain
// TCP (MPTCP off, which Go 1.26 turns on by default), TCP_NODELAY (Go's default),
// the same frames and read sizes as every other mode; the way its users write it where
// that matters: a 4 KiB bufio.Writer for the small-message stream, io.Copy from the
// *os.File for a file send (sendfile), net/http for HTTP.
//
// With Buf > 0 ("net-buf", bulk and stream only) the sender writes through a
// bufio.Writer of Buf bytes: the batching a Go user gets for the asking, to the size zc
// hands the kernel in one send (UserBatch).
type Net struct{ Buf int }

// UserBatch is the write buffer of the buffered baselines (net-buf, syscall-buf): zc
// sends up to 64 buffers or 1 MiB in one SENDMSG (zc/internal/becontract, MaxSendBatch), so a
// user buffer of 1 MiB lets a plain socket batch as much per system call.
const UserBatch = 1 << 20

// Name implements harness.Mode.
func (n Net) Name() string {
	if n.Buf > 0 {
		return "net-buf"
	}
	return "net"
}

// Supports implements harness.ScenarioSupporter: the buffered variant is for the
// one-way streams, where batching writes is the user's choice; unbuffered net runs all.
func (n Net) Supports(s harness.Scenario) bool {
	return n.Buf == 0 || s == harness.Bulk || s == harness.Stream
}

// Available implements harness.Mode.
func (Net) Available() error { return nil }

// Server implements harness.Mode.
func (Net) Server(ctx context.Context, c harness.Case, m *harness.Meter, ready func(string)) error {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(ctx, "tcp", c.Addr)
	if err != nil {
		return err
	}
	if c.Scenario == harness.HTTP || c.Scenario == harness.HTTPWrk {
		return harness.ServeHTTP(c, m, l, ready)
	}
	return serve(c, m, netListener{l.(*net.TCPListener)}, ready)
}

// Client implements harness.Mode.
func (n Net) Client(ctx context.Context, c harness.Case, m *harness.Meter) error {
	var d net.Dialer
	d.SetMultipathTCP(false)
	return drive(c, m, n.Buf, func() (stream, error) {
		conn, err := d.DialContext(ctx, "tcp", c.Addr)
		if err != nil {
			return nil, err
		}
		return conn.(*net.TCPConn), nil
	})
}

type netListener struct{ l *net.TCPListener }

func (n netListener) Accept() (stream, error) {
	c, err := n.l.AcceptTCP()
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (n netListener) Addr() string { return n.l.Addr().String() }
func (n netListener) Close() error { return n.l.Close() }
