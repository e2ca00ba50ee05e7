package netinfo

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/tcpglue"
)

// TestPerFlowKnobsAcrossVeth: the per-connection knobs zc exposes, on a connection
// between two namespaces: congestion control, pacing rate and ToS read back and show in
// TCP_INFO, and the user timeout really ends a connection whose peer vanished (ETIMEDOUT).
func TestPerFlowKnobsAcrossVeth(t *testing.T) {
	tp := newTopo(t)
	ln, la := listenIn(t, tp.b, "10.9.2.1")
	var c *tcpglue.Socket
	err := netns.Do(tp.a.Fd(), func() (err error) {
		c, err = tcpglue.DialAddrPort(la, tcpglue.DialOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peer, _, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()

	if err := c.SetCongestion("reno"); err != nil {
		t.Fatal(err)
	}
	if cc, err := c.Congestion(); err != nil || cc != "reno" {
		t.Fatalf("congestion %q, %v", cc, err)
	}
	if err := c.SetMaxPacingRate(10 << 20); err != nil {
		t.Fatal(err)
	}
	if err := c.SetTOS(0x28); err != nil { // DSCP AF11
		t.Fatal(err)
	}
	if tos, err := c.TOS(); err != nil || tos != 0x28 {
		t.Fatalf("tos %#x, %v", tos, err)
	}
	if _, err := c.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	info, err := c.TCPInfo()
	if err != nil {
		t.Fatal(err)
	}
	if info.MaxPacingRate != 10<<20 || info.State != tcpglue.StateEstablished || info.RTT == 0 {
		t.Fatalf("TCP_INFO %+v", info)
	}

	// The peer disappears (its link goes down); with a 300 ms user timeout the kernel drops
	// the connection once data stays unacknowledged that long, and writes fail ETIMEDOUT.
	if err := c.SetUserTimeout(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := tp.b.IP("link", "set", "hn1", "down"); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 16<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				errc <- err
				return
			}
		}
	}()
	select {
	case err = <-errc:
	case <-time.After(30 * time.Second): // liveness bound: without the timeout this blocks for minutes
		c.Close() // wakes the blocked Write
		<-errc
		t.Fatal("writes still blocked 30 s after the peer vanished: the user timeout did not fire")
	}
	if !errors.Is(err, unix.ETIMEDOUT) {
		t.Fatalf("write after the peer vanished: %v (want ETIMEDOUT from the user timeout)", err)
	}
}
