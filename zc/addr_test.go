package zc

import (
	"context"
	"net"
	"net/netip"
	"testing"
)

// TestConnAddrs: accepted and dialed connections report the addresses their peers see, on
// IPv4, IPv6 and a dual-stack listener (an IPv4 peer is reported unmapped, as Go's net
// does), still after the close; the AddrPort forms do not allocate.
func TestConnAddrs(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		e := newEngine(t, Config{Backend: b, Queues: 1, NoPin: true})
		for _, tc := range []struct{ listen, dial string }{
			{"127.0.0.1:0", "127.0.0.1"},
			{"[::1]:0", "::1"},
			{":0", "127.0.0.1"},
		} {
			acc := make(chan *Conn, 1)
			l, err := e.Listen("tcp", tc.listen, func(c *Conn) Handler { acc <- c; return HandlerFuncs{} })
			if err != nil {
				t.Fatal(err)
			}
			port := l.Addr().(*net.TCPAddr).Port
			d, err := e.Dial(context.Background(), "tcp", net.JoinHostPort(tc.dial, itoa(port)), HandlerFuncs{})
			if err != nil {
				t.Fatal(err)
			}
			a := recvEvent(t, acc, "accept")
			want := netip.MustParseAddr(tc.dial)
			if a.laddr != d.raddr || a.raddr != d.laddr ||
				a.raddr.Addr() != want || a.laddr.Port() != uint16(port) {
				t.Errorf("%s: accepted %v->%v, dialed %v->%v", tc.listen, a.raddr, a.laddr,
					d.laddr, d.raddr)
			}
			if got := a.RemoteAddr().String(); got != d.LocalAddr().String() || got != net.JoinHostPort(tc.dial, itoa(int(d.laddr.Port()))) {
				t.Errorf("%s: RemoteAddr %q, the dialer's LocalAddr %q", tc.listen, got, d.LocalAddr())
			}
			d.Close()
			a.Close()
			<-a.Done()
			if a.RemoteAddr().String() != d.LocalAddr().String() {
				t.Errorf("after close: RemoteAddr %v", a.RemoteAddr())
			}
			l.Close()
		}
	})
	// Unknown addresses (a connection that failed before they were read) are nil
	// interfaces, not nil pointers in one: comparisons with nil and net.OpError's text work.
	var c Conn
	if c.LocalAddr() != nil || c.RemoteAddr() != nil {
		t.Errorf("unknown addresses: %#v, %#v", c.LocalAddr(), c.RemoteAddr())
	}
	if s := (&net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: ErrClosed}).Error(); s != "read tcp: "+ErrClosed.Error() {
		t.Errorf("OpError without addresses: %q", s)
	}
}
