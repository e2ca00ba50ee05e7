package zc

import (
	"context"
	"net"
	"testing"

	"github.com/zcnet/zcnet/tcpglue/netinfo"
)

// TestConnPath: a connection's route and next hop come from tcpglue/netinfo (Stack.NextHop
// of its RemoteAddr; zc's Conn.Path before session 12 was that call): loopback's route, on
// a connection open and after the engine closed (the route is the peer's, not the socket's).
func TestConnPath(t *testing.T) {
	e, err := New(Config{Queues: 1})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := dialPeer(t, e, HandlerFuncs{})
	st, err := netinfo.Open(netinfo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, when := range []string{"open", "after Engine.Close"} {
		r, n, err := st.NextHop(context.Background(), c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap())
		if err != nil {
			t.Fatal(err)
		}
		if r.Ifname != "lo" || !r.Local() || r.MTU == 0 || n.MAC != nil {
			t.Fatalf("%s: loopback route %+v, next hop %+v", when, r, n)
		}
		e.Close()
	}
}
