package zc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/zcnet/zcnet/tcpglue"
)

func TestConnKnobs(t *testing.T) {
	srv, cli := newPair(t, Config{})
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetCongestion("reno"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetPacingRate(10 << 20); err != nil {
		t.Fatal(err)
	}
	if err := c.SetUserTimeout(3 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.SetTOS(0x20); err != nil {
		t.Fatal(err)
	}
	if err := c.SetTOS(300); err == nil {
		t.Fatal("TOS 300 accepted")
	}
	if err := c.SetCongestion("no-such-algorithm"); err == nil {
		t.Fatal("unknown congestion control accepted")
	}
	if _, err := c.Write(make([]byte, 100<<10)); err != nil {
		t.Fatal(err)
	}
	var info tcpglue.TCPInfo
	for i := 0; i < 100; i++ {
		if info, err = c.TCPInfo(); err != nil {
			t.Fatal(err)
		}
		if info.BytesAcked >= 100<<10 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if info.State != tcpglue.StateEstablished || info.BytesAcked < 100<<10 || info.RTT == 0 {
		t.Fatalf("TCP_INFO %+v", info)
	}
	var cc string
	c.Socket(func(s *tcpglue.Socket) error { cc, err = s.Congestion(); return err })
	if cc != "reno" {
		t.Fatalf("congestion control %q", cc)
	}
	c.Close()
	<-c.Done()
	if _, err := c.TCPInfo(); !errors.Is(err, ErrClosed) {
		t.Fatalf("TCPInfo after Close: %v, want ErrClosed", err)
	}
	if err := c.SetTOS(0); !errors.Is(err, ErrClosed) {
		t.Fatalf("SetTOS after Close: %v, want ErrClosed", err)
	}
}
