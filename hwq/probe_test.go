package hwq

import (
	"slices"
	"strings"
	"testing"
)

func requireAnswer(t *testing.T, nic, name string, a Answer, want Support, reasonHas string) {
	t.Helper()
	if a.Support != want || a.Reason == "" || !strings.Contains(a.Reason, reasonHas) {
		t.Errorf("%s %s = %v, want %v with a reason mentioning %q", nic, name, a, want, reasonHas)
	}
}

// TestProbeVeth: the per-NIC report of a 4-queue veth: queues yes, and every "special"
// capability no, each with the reason.
func TestProbeVeth(t *testing.T) {
	e := newVeth(t, 4)
	n, err := e.c.Probe(e.a)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", n)
	if n.Driver != "veth" || n.Kind != "veth" || n.Loopback {
		t.Errorf("identity %+v", n)
	}
	if n.RXQueues != 4 || n.TXQueues != 4 || n.Channels == nil || n.Channels.RXMax != 4 {
		t.Errorf("queues rx %d tx %d channels %+v", n.RXQueues, n.TXQueues, n.Channels)
	}
	requireAnswer(t, n.Name, "queues", n.Queues, Yes, "rx 4 tx 4")
	requireAnswer(t, n.Name, "header split", n.HeaderSplit, No, "EOPNOTSUPP")
	requireAnswer(t, n.Name, "ntuple", n.Ntuple, No, FeatureNtuple)
	requireAnswer(t, n.Name, "rss", n.RSS, No, "EOPNOTSUPP")
	requireAnswer(t, n.Name, "zcrx", n.ZCRX, No, "header split")
	requireAnswer(t, n.Name, "devmem", n.Devmem, No, "header split")
	requireAnswer(t, n.Name, "xdp zero-copy", n.XDPZeroCopy, No, "xsk-zerocopy")
	requireAnswer(t, n.Name, "hw timestamps", n.HWTimestamps, No, "software")
	requireAnswer(t, n.Name, "special", n.Special, No, "zcrx")
	if n.PHCIndex != -1 {
		t.Errorf("veth PHC index %d", n.PHCIndex)
	}
	if !strings.Contains(n.String(), "header split   no: veth") {
		t.Errorf("report:\n%s", n)
	}
}

// TestProbeAllNamespace: every device of the namespace is probed; loopback says why it has
// no hardware queue.
func TestProbeAllNamespace(t *testing.T) {
	e := newVeth(t, 2)
	nics, err := e.c.ProbeAll()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range nics {
		names = append(names, n.Name)
		if n.Name == "lo" {
			requireAnswer(t, "lo", "queues", n.Queues, No, "loopback")
			requireAnswer(t, "lo", "zcrx", n.ZCRX, No, "loopback has no hardware RX queue")
			requireAnswer(t, "lo", "special", n.Special, No, "none of")
		}
	}
	slices.Sort(names)
	if strings.Join(names, ",") != "hq0,hq1,lo" {
		t.Fatalf("probed %v", names)
	}
	if _, err := e.c.Probe("nosuchdev0"); err == nil {
		t.Fatal("probe of a missing device succeeded")
	}
}

// TestProbeAllHost probes the devices of the test's own namespace (reading only: eth0 is
// never changed). It checks that every capability got an answer with a reason.
func TestProbeAllHost(t *testing.T) {
	nics, err := ProbeAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(nics) == 0 {
		t.Fatal("no devices")
	}
	for _, n := range nics {
		t.Logf("\n%s", n)
		for name, a := range map[string]Answer{"queues": n.Queues, "header split": n.HeaderSplit, "ntuple": n.Ntuple,
			"rss": n.RSS, "zcrx": n.ZCRX, "devmem": n.Devmem, "xdp zero-copy": n.XDPZeroCopy,
			"hw timestamps": n.HWTimestamps, "special": n.Special} {
			if a.Reason == "" {
				t.Errorf("%s %s: %v without a reason", n.Name, name, a)
			}
		}
	}
}
