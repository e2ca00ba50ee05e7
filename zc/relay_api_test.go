package zc

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

func TestRelayMisuse(t *testing.T) {
	e := newEngine(t, Config{Queues: 1})
	a, _ := dialPeer(t, e, HandlerFuncs{})
	for _, tc := range []struct {
		name string
		a, b *Conn
	}{{"nil", a, nil}, {"nil first", nil, a}, {"same", a, a}} {
		if _, err := Relay(tc.a, tc.b); !errors.Is(err, ErrInvalid) {
			t.Errorf("Relay %s = %v, want ErrInvalid", tc.name, err)
		}
	}
	// A side that closed: the other is closed too, nothing leaks.
	b, _ := dialPeer(t, e, HandlerFuncs{})
	a.Close()
	<-a.Done()
	if _, err := Relay(a, b); !errors.Is(err, ErrClosed) {
		t.Fatalf("Relay with a closed side = %v, want ErrClosed", err)
	}
	select {
	case <-b.Done():
	case <-time.After(time.Minute):
		t.Fatal("the other side was not closed")
	}
}

// TestRelayFrontGone: the front closes before the backend is connected; Relay (from
// DialAsync's done, posted to the closed side) still closes the backend.
func TestRelayFrontGone(t *testing.T) {
	e := newEngine(t, Config{Queues: 2})
	backend, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	backs := make(chan *Conn, 1)
	fronts := make(chan *Conn, 1)
	l, err := e.Listen("tcp", "127.0.0.1:0", func(front *Conn) Handler {
		front.SetReceivePaused(true)
		fronts <- front
		return HandlerFuncs{}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	front := <-fronts
	front.Close() // gone before the backend is connected (a paused side sees no reset)
	<-front.Done()
	err = e.DialAsync(context.Background(), "tcp", backend.Addr().String(), HandlerFuncs{}, func(back *Conn, err error) {
		if err != nil {
			t.Errorf("dial: %v", err)
			return
		}
		Relay(front, back)
		backs <- back
	})
	if err != nil {
		t.Fatal(err)
	}
	bc, err := backend.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	back := <-backs
	select {
	case <-back.Done():
	case <-time.After(time.Minute):
		t.Fatal("backend connection left open")
	}
	if n, err := io.Copy(io.Discard, bc); n != 0 || err != nil {
		t.Fatalf("backend saw %d bytes, %v", n, err)
	}
}
