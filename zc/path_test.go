package zc

import (
	"context"
	"errors"
	"testing"
)

// TestConnPath: the route and next hop of a loopback connection, and Path after the engine
// closed.
func TestConnPath(t *testing.T) {
	e, err := New(Config{Queues: 1})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := dialPeer(t, e, HandlerFuncs{})
	p, err := c.Path(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p.Route.Ifname != "lo" || !p.Route.Local() || p.Route.MTU == 0 || p.NextHopMAC != nil {
		t.Fatalf("loopback path = %+v", p)
	}
	t.Logf("path: %+v", p.Route)
	e.Close()
	if _, err := c.Path(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Path after Engine.Close = %v, want ErrClosed", err)
	}
}
