package hwq

import (
	"errors"
	"strings"
	"testing"

	"github.com/zcnet/zcnet/bpf"
)

// TestRawQueueProbe: the per-NIC report predicts what OpenRawQueue then gets on veth
// (copy mode; generic XDP by default on veth, with the reason), and says which RX metadata
// the driver gives.
func TestRawQueueProbe(t *testing.T) {
	e := newRawEnv(t, 2)
	c, err := Open(Options{NetNS: e.Srv.Fd()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n, err := c.Probe(e.SrvIf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("raw queue: %v; metadata: %v", n.RawQueue, n.RawMetadata)
	if n.RawQueue.Support != Yes || n.RawMetadata.Support == Unknown {
		t.Fatalf("raw queue %v, metadata %v", n.RawQueue, n.RawMetadata)
	}
	if !strings.Contains(n.String(), "raw queue") {
		t.Fatalf("report lacks the raw queue line:\n%s", n)
	}
	q := e.openRaw(t, 0, newRegion(t, 64), nil)
	m := q.Mode()
	wantZC := strings.HasPrefix(n.RawQueue.Reason, "zero-copy")
	wantNative := strings.Contains(n.RawQueue.Reason, "native XDP") && !strings.Contains(n.RawQueue.Reason, "generic XDP")
	if m.ZeroCopy != wantZC || (m.XDP == bpf.RawXDPNative) != wantNative {
		t.Fatalf("probe said %q, the queue got %+v", n.RawQueue.Reason, m)
	}
	var ce *bpf.NativeXDPCostError
	if m.XDP != bpf.RawXDPGeneric || !errors.As(m.XDPReason, &ce) || !strings.Contains(n.RawQueue.Reason, "TSO") {
		t.Fatalf("veth: probe %q, mode %+v: want generic XDP by default, with the cost to the peer named", n.RawQueue.Reason, m)
	}
}
