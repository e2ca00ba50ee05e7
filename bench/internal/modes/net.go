package modes

import (
	"context"
	"net"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// Net is Go's net package: net.TCPConn, one goroutine per connection, the runtime's
// netpoller. It is what zc users switch from, in its best simple configuration: plain
// TCP (MPTCP off, which Go 1.26 turns on by default), TCP_NODELAY (Go's default),
// the same write and read sizes as every other mode; the way its users write it where
// that matters: a bufio.Writer for the small-message stream, io.Copy from the
// *os.File for a file send (sendfile), net/http for HTTP.
type Net struct{}

// Name implements harness.Mode.
func (Net) Name() string { return "net" }

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
	if c.Scenario == harness.HTTP {
		return harness.ServeHTTP(c, m, l, ready)
	}
	return serve(c, m, netListener{l.(*net.TCPListener)}, ready)
}

// Client implements harness.Mode.
func (Net) Client(ctx context.Context, c harness.Case, m *harness.Meter) error {
	var d net.Dialer
	d.SetMultipathTCP(false)
	return drive(c, m, func() (stream, error) {
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
