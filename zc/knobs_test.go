package zc

import (
	"context"
	"errors"
	"runtime"
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
	if err := c.Socket(func(s *tcpglue.Socket) error { return s.SetCongestion("reno") }); err != nil {
		t.Fatal(err)
	}
	if err := c.Socket(func(s *tcpglue.Socket) error { return s.SetMaxPacingRate(10 << 20) }); err != nil {
		t.Fatal(err)
	}
	if err := c.Socket(func(s *tcpglue.Socket) error { return s.SetUserTimeout(3 * time.Second) }); err != nil {
		t.Fatal(err)
	}
	if err := c.Socket(func(s *tcpglue.Socket) error { return s.SetTOS(0x20) }); err != nil {
		t.Fatal(err)
	}
	if err := c.Socket(func(s *tcpglue.Socket) error { return s.SetTOS(300) }); err == nil {
		t.Fatal("TOS 300 accepted")
	}
	if err := c.Socket(func(s *tcpglue.Socket) error { return s.SetCongestion("no-such-algorithm") }); err == nil {
		t.Fatal("unknown congestion control accepted")
	}
	if _, err := c.Write(make([]byte, 100<<10)); err != nil {
		t.Fatal(err)
	}
	var info tcpglue.TCPInfo
	for i := 0; i < 100; i++ {
		if err = c.Socket(func(s *tcpglue.Socket) error { info, err = s.TCPInfo(); return err }); err != nil {
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
	if err := c.Socket(func(s *tcpglue.Socket) error { _, err := s.TCPInfo(); return err }); !errors.Is(err, ErrClosed) {
		t.Fatalf("TCPInfo after Close: %v, want ErrClosed", err)
	}
	if err := c.Socket(func(s *tcpglue.Socket) error { return s.SetTOS(0) }); !errors.Is(err, ErrClosed) {
		t.Fatalf("SetTOS after Close: %v, want ErrClosed", err)
	}
}

// Config.AddProcs: New adds one GOMAXPROCS P per queue and Close takes them back, engine by
// engine, in any order; a refused Config and the default change nothing.
func TestAddProcs(t *testing.T) {
	g0 := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(g0)
	a, err := New(Config{Queues: 2, NoPin: true, AddProcs: true})
	if err != nil {
		t.Fatal(err)
	}
	if g := runtime.GOMAXPROCS(0); g != g0+2 || a.Stats().AddedProcs != 2 {
		t.Fatalf("after New with 2 queues: GOMAXPROCS %d (was %d), AddedProcs %d", g, g0, a.Stats().AddedProcs)
	}
	b, err := New(Config{Queues: 1, NoPin: true, AddProcs: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Queues: -1, AddProcs: true}); err == nil {
		t.Fatal("Queues -1 accepted")
	}
	plain, err := New(Config{Queues: 1, NoPin: true})
	if err != nil {
		t.Fatal(err)
	}
	if g := runtime.GOMAXPROCS(0); g != g0+3 || plain.Stats().AddedProcs != 0 {
		t.Fatalf("two engines with AddProcs (2 + 1 queues), a refused one and one without: GOMAXPROCS %d (was %d)", g, g0)
	}
	plain.Close()
	a.Close()
	a.Close() // twice: takes back nothing more
	if g := runtime.GOMAXPROCS(0); g != g0+1 {
		t.Fatalf("after the first engine closed: GOMAXPROCS %d, want %d", g, g0+1)
	}
	b.Close()
	if g := runtime.GOMAXPROCS(0); g != g0 {
		t.Fatalf("after both closed: GOMAXPROCS %d, want %d", g, g0)
	}
}
