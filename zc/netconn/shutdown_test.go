package netconn

import (
	"github.com/zcnet/zcnet/zc"

	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestEngineCloseWakesAccept: http.Server.Serve on Listen returns when the engine
// closes, with an error matching net.ErrClosed.
func TestEngineCloseWakesAccept(t *testing.T) {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(e, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- (&http.Server{}).Serve(ln) }()
	accepted := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		accepted <- err
	}()
	time.Sleep(10 * time.Millisecond) // let both reach Accept (either order is correct)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan error{served, accepted} {
		select {
		case err := <-ch:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Accept after Engine.Close = %v, want net.ErrClosed", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("Accept not woken by Engine.Close")
		}
	}
}

// TestEngineCloseWakesRead: a Conn's Read blocked when the engine closes returns an error
// matching net.ErrClosed (not io.EOF: the peer did not end the stream), on both receive
// paths.
func TestEngineCloseWakesRead(t *testing.T) {
	for _, ring := range []bool{false, true} {
		name := "direct"
		if ring {
			name = "ring"
		}
		t.Run(name, func(t *testing.T) {
			e, err := zc.New(zc.Config{Queues: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c, err := Options{Ring: ring}.Dial(context.Background(), e, "tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			peer, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			read := make(chan error, 1)
			go func() {
				_, err := c.Read(make([]byte, 10))
				read <- err
			}()
			time.Sleep(10 * time.Millisecond) // let it block (a Read that starts later must say the same)
			e.Close()
			select {
			case err := <-read:
				if !errors.Is(err, net.ErrClosed) {
					t.Fatalf("Read after Engine.Close = %v, want net.ErrClosed", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("Read not woken by Engine.Close")
			}
			if _, err := c.Read(make([]byte, 10)); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("a later Read = %v, want net.ErrClosed", err)
			}
		})
	}
}
