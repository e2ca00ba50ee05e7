package tcpglue

import (
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestProbeZeroCopyTXLoopback: over loopback the kernel copies every MSG_ZEROCOPY payload
// (local delivery), so the probe reports every notification as copied and says so; every
// send is accounted for by a notification. The qemu guest's NIC pair shows the other case
// (internal/guestzc).
func TestProbeZeroCopyTXLoopback(t *testing.T) {
	l, err := Listen("tcp4", "127.0.0.1:0", ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ap, err := l.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan int64, 1)
	go func() {
		s, _, err := l.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer s.Close()
		n, _ := io.Copy(io.Discard, s)
		got <- n
	}()
	const total = 4 << 20
	r, err := ProbeZeroCopyTX(netip.AddrPort{}, ap, total, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if n := <-got; n != total {
		t.Fatalf("the peer read %d bytes, want %d", n, total)
	}
	t.Log(r)
	if r.Bytes != total || r.Sends == 0 || r.Notified != r.Sends {
		t.Fatalf("report %+v: want %d bytes and a notification for each send", r, total)
	}
	if r.Real() || r.Copied != r.Notified {
		t.Fatalf("loopback: %d of %d notifications not copied, want none", r.Notified-r.Copied, r.Notified)
	}
	if s := r.String(); !strings.Contains(s, "(lo)") || !strings.Contains(s, "copied by the kernel") {
		t.Fatalf("report %q: want the device lo and the verdict", s)
	}
}
