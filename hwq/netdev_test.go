package hwq

import (
	"errors"
	"os"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/zcnet/zcnet/internal/testutil"
)

// queuesByType counts a device's queues and checks their IDs are 0..n-1 per type.
func queuesByType(t *testing.T, qs []Queue, ifindex int) (rx, tx int) {
	t.Helper()
	ids := map[QueueType][]uint32{}
	for _, q := range qs {
		if q.Ifindex != ifindex {
			t.Errorf("queue %+v of another device (want ifindex %d)", q, ifindex)
		}
		ids[q.Type] = append(ids[q.Type], q.ID)
	}
	for typ, l := range ids {
		slices.Sort(l)
		for i, id := range l {
			if id != uint32(i) {
				t.Errorf("%s queue ids %v are not 0..%d", typ, l, len(l)-1)
				break
			}
		}
	}
	return len(ids[QueueRX]), len(ids[QueueTX])
}

// TestQueuesAndNAPI: netdev queue-get lists the veth's 4+4 queues; napi-get lists no NAPI
// until GRO is on (veth runs NAPI only with GRO or XDP), then one per RX queue, and none
// again after GRO is off.
func TestQueuesAndNAPI(t *testing.T) {
	e := newVeth(t, 4)
	idx := mustIfindex(t, e.c, e.a)
	qs, err := e.c.Queues(idx)
	testutil.SkipIfNotSupported(t, err, "6.9")
	if rx, tx := queuesByType(t, qs, idx); rx != 4 || tx != 4 {
		t.Fatalf("queue-get: %d rx %d tx, want 4 and 4: %+v", rx, tx, qs)
	}
	napis, err := e.c.NAPIs(idx)
	if err != nil {
		t.Fatal(err)
	}
	if len(napis) != 0 {
		t.Fatalf("veth without GRO has NAPIs: %+v", napis)
	}
	if err := e.c.SetFeatures(e.a, map[string]bool{FeatureGRO: true}); err != nil {
		t.Fatal(err)
	}
	napis, err = e.c.NAPIs(idx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]bool{}
	for _, n := range napis {
		if n.Ifindex != idx || n.ID == 0 || seen[n.ID] {
			t.Errorf("napi %+v (ifindex %d)", n, idx)
		}
		seen[n.ID] = true
	}
	if len(napis) != 4 {
		t.Fatalf("veth with GRO: %d NAPIs, want one per RX queue (4): %+v", len(napis), napis)
	}
	// The peer has its own, distinct NAPIs only once its GRO is on too.
	if peer, err := e.c.NAPIs(mustIfindex(t, e.c, e.b)); err != nil || len(peer) != 0 {
		t.Fatalf("peer NAPIs %+v, %v", peer, err)
	}
	if err := e.c.SetFeatures(e.a, map[string]bool{FeatureGRO: false}); err != nil {
		t.Fatal(err)
	}
	if napis, err = e.c.NAPIs(idx); err != nil || len(napis) != 0 {
		t.Fatalf("after GRO off: %+v, %v", napis, err)
	}
}

// TestDevices: dev-get dumps every device of the namespace, and dev-get of one matches.
func TestDevices(t *testing.T) {
	e := newVeth(t, 2)
	devs, err := e.c.Devices()
	testutil.SkipIfNotSupported(t, err, "6.3")
	links, err := e.c.Links()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != len(links) || len(links) != 3 {
		t.Fatalf("%d devices, %d links (want lo, hq0, hq1): %+v %+v", len(devs), len(links), devs, links)
	}
	for _, l := range links {
		d, err := e.c.Device(l.Index)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(devs, d) {
			t.Errorf("dev-get %d = %+v, not in the dump %+v", l.Index, d, devs)
		}
		if !l.Loopback && d.XDPFeatures&XDPBasic == 0 {
			t.Errorf("%s: veth without basic XDP: %s", l.Name, d.XDPFeatures)
		}
		if d.XDPFeatures&XDPXSKZeroCopy != 0 {
			t.Errorf("%s claims AF_XDP zero-copy: %s", l.Name, d.XDPFeatures)
		}
	}
	if _, err := e.c.Device(1 << 30); err == nil {
		t.Fatal("dev-get of a missing ifindex succeeded")
	}
}

// TestChannels: ethtool -l/-L through the library: the counts change, netdev sees the new
// queue counts, a count above the maximum is refused with the kernel's reason, and the
// original counts come back.
func TestChannels(t *testing.T) {
	e := newVeth(t, 4)
	ch, err := e.c.Channels(e.a)
	if err != nil {
		t.Fatal(err)
	}
	if ch.RX != 4 || ch.TX != 4 || ch.RXMax != 4 || ch.TXMax != 4 || ch.RXQueues() != 4 {
		t.Fatalf("channels %+v, want rx/tx 4 of 4", ch)
	}
	two, three := uint32(2), uint32(3)
	if err := e.c.SetChannels(e.a, ChannelsUpdate{RX: &two, TX: &three}); err != nil {
		t.Fatal(err)
	}
	got, err := e.c.Channels(e.a)
	if err != nil || got.RX != 2 || got.TX != 3 {
		t.Fatalf("after set: %+v, %v", got, err)
	}
	idx := mustIfindex(t, e.c, e.a)
	if qs, err := e.c.Queues(idx); err == nil {
		if rx, tx := queuesByType(t, qs, idx); rx != 2 || tx != 3 {
			t.Fatalf("queue-get after ethtool -L rx 2 tx 3: %d rx %d tx", rx, tx)
		}
	}
	five := uint32(5)
	err = e.c.SetChannels(e.a, ChannelsUpdate{RX: &five})
	var oe *OpError
	if !errors.As(err, &oe) || oe.Op != "channels set" || oe.Iface != e.a {
		t.Fatalf("rx 5 of max 4: %v", err)
	}
	if errors.Is(err, ErrNotSupported) {
		t.Fatalf("a count above the maximum is not a missing feature: %v", err)
	}
	if got, _ := e.c.Channels(e.a); got.RX != 2 {
		t.Fatalf("refused set changed the channels: %+v", got)
	}
	four := uint32(4)
	if err := e.c.SetChannels(e.a, ChannelsUpdate{RX: &four, TX: &four}); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.c.Channels(e.a); got != ch {
		t.Fatalf("restored %+v, want %+v", got, ch)
	}
	// Loopback has no channels at all.
	_, err = e.c.Channels("lo")
	requireRefusal(t, err, featChannels)
	// A missing device is an error, not a refusal.
	if _, err := e.c.Channels("nosuchdev0"); err == nil || errors.Is(err, ErrNotSupported) {
		t.Fatalf("missing device: %v", err)
	}
	if _, err := e.c.Channels("a-name-much-too-long-for-linux"); err == nil {
		t.Fatal("over-long interface name accepted")
	}
}

// TestClosed: a closed Client fails with os.ErrClosed and Close is idempotent.
func TestClosed(t *testing.T) {
	e := newVeth(t, 1)
	if err := e.c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Close(); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"channels": func() error { _, err := e.c.Channels(e.a); return err }(),
		"queues":   func() error { _, err := e.c.Queues(1); return err }(),
		"rules":    func() error { _, err := e.c.FlowRules(e.a); return err }(),
		"links":    func() error { _, err := e.c.Links(); return err }(),
	} {
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
	var nilClient *Client
	if err := nilClient.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentUseAndClose: requests from several goroutines interleave correctly (each
// gets its own answer) and a Close racing them makes them fail with os.ErrClosed, never
// with a wrong reply.
func TestConcurrentUseAndClose(t *testing.T) {
	e := newVeth(t, 3)
	idx := mustIfindex(t, e.c, e.a)
	errc := make(chan error, 8)
	var closed atomic.Bool
	for g := 0; g < 8; g++ {
		go func(g int) {
			for i := 0; ; i++ {
				var err error
				switch (g + i) % 3 {
				case 0:
					var ch Channels
					if ch, err = e.c.Channels(e.a); err == nil && ch.RX != 3 {
						err = errors.New("wrong channels reply")
					}
				case 1:
					var qs []Queue
					if qs, err = e.c.Queues(idx); err == nil && len(qs) != 6 {
						err = errors.New("wrong queue-get reply")
					}
				default:
					_, err = e.c.Rings(e.a)
					if errors.Is(err, ErrNotSupported) {
						err = nil
					}
				}
				if err != nil {
					// ErrClosed is right once someone closed the client: a goroutine the
					// scheduler started late may meet the close on its very first call.
					if errors.Is(err, os.ErrClosed) && closed.Load() {
						err = nil
					}
					errc <- err
					return
				}
				if i == 200 {
					closed.Store(true)
					e.c.Close()
				}
			}
		}(g)
	}
	for g := 0; g < 8; g++ {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
}
