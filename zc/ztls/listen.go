package ztls

import (
	"github.com/zcnet/zcnet/internal/ktls"

	"context"
	"crypto/tls"
	"net"

	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/tcpglue"
)

// listener accepts TLS connections (handshake on first use, like crypto/tls's).
type listener struct {
	net.Listener
	cfg  *tls.Config // serverConfig's copy: its connections share session ticket keys
	opts *Options
}

// NewListener returns a net.Listener whose Accept wraps each connection of inner in a
// server-side *Conn (see Server). Accept does not run the handshake: the first Read or
// Write does, or Conn.Handshake (net/http's Server.Serve works unchanged, but sees the
// connections as plain ones: Request.TLS is nil — set Server.ConnContext to ConnContext
// and use FromContext — and ALPN "h2" must not be offered, as net/http serves HTTP/2 only
// on a *tls.Conn).
func NewListener(inner net.Listener, cfg *tls.Config, opts *Options) net.Listener {
	l := &listener{Listener: inner, opts: opts}
	if cfg != nil {
		l.cfg = serverConfig(cfg)
	}
	return l
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	zc := newConn(c, false, l.opts)
	if l.cfg != nil {
		zc.hs = ktls.Server(c, l.cfg)
		zc.tc = zc.hs.TC
	}
	return zc, nil
}

// Listen listens on a plain TCP socket (never MPTCP, which refuses kernel TLS) and
// returns NewListener over it.
func Listen(network, address string, cfg *tls.Config, opts *Options) (net.Listener, error) {
	if cfg == nil {
		return nil, ErrNilConfig
	}
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), network, address)
	if err != nil {
		return nil, err
	}
	return NewListener(ln, cfg, opts), nil
}

// Dialer dials TLS connections; its DialContext fits http.Transport.DialTLSContext.
type Dialer struct {
	NetDialer *net.Dialer // nil: a zero net.Dialer; MPTCP is turned off either way
	Config    *tls.Config // must not be nil; ServerName defaults to the host dialed
	Options   Options
}

// DialContext connects, runs the handshake and returns a *Conn.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if d.Config == nil {
		return nil, ErrNilConfig
	}
	var nd net.Dialer
	if d.NetDialer != nil {
		nd = *d.NetDialer
	}
	nd.SetMultipathTCP(false)
	raw, err := nd.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	cfg := d.Config
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			host = address
		}
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	opts := d.Options
	c := Client(raw, cfg, &opts)
	if err := c.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Dial connects to address and runs the handshake (see Dialer).
func Dial(network, address string, cfg *tls.Config, opts *Options) (*Conn, error) {
	d := Dialer{Config: cfg}
	if opts != nil {
		d.Options = *opts
	}
	c, err := d.DialContext(context.Background(), network, address)
	if err != nil {
		return nil, err
	}
	return c.(*Conn), nil
}

// Probe says whether this kernel can carry TLS records and which ciphers it accepts
// (tcpglue.ProbeTLS): nil, or an error matching ErrNotSupported that says what is missing.
func Probe() error {
	sup, err := tcpglue.ProbeTLS()
	if err != nil {
		return err
	}
	if miss := sup.Missing(); miss != "" {
		return errs.NotSupported("kernel TLS for "+miss, "the kernel's crypto modules for them (gcm, chacha20poly1305)", nil)
	}
	return nil
}

type connKey struct{}

// ConnContext is for http.Server.ConnContext: it puts the *Conn of a connection accepted
// from a ztls listener into the request contexts, where FromContext finds it (net/http
// fills Request.TLS only for a *tls.Conn).
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if zc, ok := c.(*Conn); ok {
		return context.WithValue(ctx, connKey{}, zc)
	}
	return ctx
}

// FromContext returns the *Conn that ConnContext put into ctx: a handler's way to the
// connection's ConnectionState and Info.
func FromContext(ctx context.Context) (*Conn, bool) {
	c, ok := ctx.Value(connKey{}).(*Conn)
	return c, ok
}
