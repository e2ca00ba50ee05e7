package ktls

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync/atomic"
)

// Handshake is one connection's TLS handshake run by crypto/tls so that its records can
// move into the kernel afterwards: crypto/tls reads the socket through an hsConn (one
// record at a time, nothing past the peer's Finished) and writes its key log to a
// keyLog of this package. After Run, Keys derives the kernel's state of both directions;
// or, when the records stay in user space, Passthrough lets crypto/tls read the socket
// freely and TC carries the records.
type Handshake struct {
	TC       *tls.Conn
	hs       *hsConn
	isClient bool
	done     atomic.Bool
}

// Server returns the server side of a handshake on conn. cfg must come from ServerConfig
// (its key log writer reaches this package).
func Server(conn net.Conn, cfg *tls.Config) *Handshake {
	h := &Handshake{hs: &hsConn{Conn: conn, sec: &secrets{m: map[string][]byte{}}}}
	h.TC = tls.Server(h.hs, cfg)
	return h
}

// Client returns the client side of a handshake on conn: cfg is cloned with this
// package's key log writer (which passes every line on to cfg's). Unless userSpace,
// TLS 1.2 sessions are kept out of cfg's ClientSessionCache (crypto/tls writes no key
// log line for a resumed TLS 1.2 session, so its records could not move to the kernel).
func Client(conn net.Conn, cfg *tls.Config, userSpace bool) *Handshake {
	h := &Handshake{isClient: true, hs: &hsConn{Conn: conn, isClient: true, sec: &secrets{m: map[string][]byte{}}}}
	c := cfg.Clone()
	c.KeyLogWriter = &keyLog{user: cfg.KeyLogWriter, sec: h.hs.sec}
	if cfg.ClientSessionCache != nil && !userSpace {
		c.ClientSessionCache = &noResume12{ClientSessionCache: cfg.ClientSessionCache, h: h}
	}
	h.TC = tls.Client(h.hs, c)
	return h
}

// noResume12 keeps TLS 1.2 sessions out of a client's session cache. crypto/tls stores a
// TLS 1.2 session during the handshake and a TLS 1.3 one after it (from a
// NewSessionTicket), which is how the two are told apart.
type noResume12 struct {
	tls.ClientSessionCache
	h *Handshake
}

func (n *noResume12) Put(key string, cs *tls.ClientSessionState) {
	if cs != nil && !n.h.done.Load() {
		return
	}
	n.ClientSessionCache.Put(key, cs)
}

// ServerConfig returns a copy of cfg whose key log reaches this package (shared by the
// connections of one listener, so that they share its session ticket keys).
//
// It also declines TLS 1.2 session tickets (a full handshake instead): crypto/tls writes
// no key log line for a resumed TLS 1.2 session, so its records could not move to the
// kernel. TLS 1.3 resumption is unchanged.
func ServerConfig(cfg *tls.Config) *tls.Config {
	b := cfg.Clone()
	b.KeyLogWriter = &keyLog{user: cfg.KeyLogWriter}
	unwrap := cfg.UnwrapSession
	b.UnwrapSession = func(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
		if cs.Version == tls.VersionTLS12 {
			return nil, nil
		}
		if unwrap != nil {
			return unwrap(identity, cs)
		}
		return b.DecryptTicket(identity, cs)
	}
	if gc := cfg.GetConfigForClient; gc != nil {
		b.GetConfigForClient = func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
			nc, err := gc(chi)
			if err != nil || nc == nil {
				return nc, err
			}
			if _, ok := nc.KeyLogWriter.(*keyLog); ok {
				return nc, nil
			}
			nc = nc.Clone()
			nc.KeyLogWriter = &keyLog{user: nc.KeyLogWriter}
			return nc, nil
		}
	}
	return b
}

// Run runs crypto/tls's handshake; its error is mapped by UserErr. The server's key log
// route ends with it.
func (h *Handshake) Run(ctx context.Context) error {
	defer h.hs.unroute()
	err := h.TC.HandshakeContext(ctx)
	h.done.Store(true)
	return UserErr(err)
}

// Unroute stops routing key log lines to this handshake (Run does it; for callers that
// run TC's handshake themselves).
func (h *Handshake) Unroute() { h.hs.unroute() }

// Keys derives both directions' kernel state from the finished handshake.
func (h *Handshake) Keys() (tx, rx DirKeys, err error) {
	h.hs.rmu.Lock()
	pend := len(h.hs.pending)
	h.hs.rmu.Unlock()
	if pend > 0 {
		return tx, rx, fmt.Errorf("crypto/tls left %d bytes of a record unread", pend)
	}
	return deriveKeys(h.isClient, h.TC.ConnectionState(), h.hs.sec, &h.hs.obs)
}

// Passthrough hands the socket to crypto/tls for good: the records stay in user space.
func (h *Handshake) Passthrough() { h.hs.passthrough.Store(true) }
