package zc

import (
	"context"
	"net"

	"github.com/zcnet/zcnet/tcpglue/netinfo"
)

// Path is what the IP stack says about a connection's way to its peer.
type Path struct {
	// Route is the kernel's route to the peer: outgoing device, gateway, the source address
	// it prefers, and the path MTU (the route's metric or a learned PMTU exception, else the
	// device's MTU).
	Route netinfo.Route
	// NextHopMAC is the link-layer address the frames carry (the gateway's, or the peer's
	// when it is on-link); nil for a local peer or a device without link-layer addresses.
	NextHopMAC net.HardwareAddr
}

// Path asks the kernel (rtnetlink) for the connection's route and next hop, resolving the
// next hop's link-layer address when the kernel does not know it yet (bounded by ctx). It
// works on a closed connection too (the route is the peer's, not the socket's).
func (c *Conn) Path(ctx context.Context) (Path, error) {
	if ctx == nil || !c.raddr.IsValid() {
		return Path{}, c.opErr("path", ErrInvalid)
	}
	st, err := c.e.netStack()
	if err != nil {
		return Path{}, c.opErr("path", err)
	}
	r, n, err := st.NextHop(ctx, c.raddr.Addr().Unmap())
	if err != nil {
		return Path{Route: r}, c.opErr("path", err)
	}
	return Path{Route: r, NextHopMAC: n.MAC}, nil
}

// netStack opens the engine's rtnetlink connection on first use (closed with the engine).
func (e *Engine) netStack() (*netinfo.Stack, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return nil, ErrClosed
	}
	if e.stack == nil {
		st, err := netinfo.Open(netinfo.Options{})
		if err != nil {
			return nil, err
		}
		e.stack = st
	}
	return e.stack, nil
}
