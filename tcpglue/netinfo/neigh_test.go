package netinfo

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/netns"
)

// TestResolveNeighbor: an empty neighbour cache, a resolution across the veth that gives
// the peer's MAC (IPv4 ARP and IPv6 ND), the cached answer, NextHop through a gateway, an
// address nobody has (context deadline; FAILED once the kernel gives up).
func TestResolveNeighbor(t *testing.T) {
	tp := newTopo(t)
	hn0 := ifindexIn(t, tp.a, "hn0")
	peerMAC := macIn(t, tp.b, "hn1")
	ns, err := tp.sa.Neighbors(hn0)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.Addr == ip("10.9.0.2") || n.Addr == ip("fd00:9::2") {
			t.Fatalf("peer already in the cache before resolving: %+v", n)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, addr := range []string{"10.9.0.2", "fd00:9::2"} {
		n, err := tp.sa.ResolveNeighbor(ctx, hn0, ip(addr))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(n.MAC, peerMAC) || !n.State.Resolved() || n.Addr != ip(addr) {
			t.Fatalf("%s: %+v (state %s), want MAC %s", addr, n, n.State, peerMAC)
		}
		again, err := tp.sa.ResolveNeighbor(ctx, hn0, ip(addr))
		if err != nil || !bytes.Equal(again.MAC, peerMAC) {
			t.Fatalf("cached %s: %+v, %v", addr, again, err)
		}
	}
	r, n, err := tp.sa.NextHop(ctx, ip("10.9.3.1"))
	if err != nil || r.NextHop != ip("10.9.0.2") || !bytes.Equal(n.MAC, peerMAC) {
		t.Fatalf("next hop: %+v %+v %v", r, n, err)
	}
	r, n, err = tp.sa.NextHop(ctx, ip("10.9.0.1"))
	if err != nil || !r.Local() || n.MAC != nil {
		t.Fatalf("local destination: %+v %+v %v", r, n, err)
	}

	// Nobody answers for 10.9.0.77: the caller's deadline ends the wait.
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	_, err = tp.sa.ResolveNeighbor(short, hn0, ip("10.9.0.77"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unanswered with a short deadline: %v", err)
	}
	// With one probe 100 ms apart the kernel gives up quickly: FAILED.
	err = netns.Do(tp.a.Fd(), func() error {
		for f, v := range map[string]string{"mcast_solicit": "1", "retrans_time_ms": "100", "app_solicit": "0"} {
			if err := os.WriteFile("/proc/sys/net/ipv4/neigh/hn0/"+f, []byte(v), 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = tp.sa.ResolveNeighbor(ctx, hn0, ip("10.9.0.78"))
	var ne *NeighborError
	if !errors.As(err, &ne) || !errors.Is(err, unix.EHOSTUNREACH) || ne.State&NUDFailed == 0 {
		t.Fatalf("unanswered: %v", err)
	}
	// Bad arguments.
	if _, err := tp.sa.ResolveNeighbor(ctx, 0, ip("10.9.0.2")); err == nil {
		t.Fatal("ifindex 0 accepted")
	}
	cancelled, cancel3 := context.WithCancel(context.Background())
	cancel3()
	if _, err := tp.sa.ResolveNeighbor(cancelled, hn0, ip("10.9.0.79")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
}
