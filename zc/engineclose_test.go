package zc

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// TestReleaseAfterEngineClose: Data held across Engine.Close is still readable, its first
// Release succeeds and a second one is ErrStale (as before the close), with no crash.
func TestReleaseAfterEngineClose(t *testing.T) {
	e, err := New(Config{Queues: 1})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan Data, 1)
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		return HandlerFuncs{Data: func(_ *Conn, d Data) { got <- d }}
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("kept across the close"))
	d := <-got
	e.Close()
	if string(d.Bytes()) != "kept across the close" {
		t.Fatalf("held Data after Engine.Close reads %q", d.Bytes())
	}
	if err := d.Release(); err != nil {
		t.Fatalf("first Release after Engine.Close: %v", err)
	}
	if err := d.Release(); !errors.Is(err, memreg.ErrStale) {
		t.Fatalf("second Release after Engine.Close = %v, want memreg.ErrStale", err)
	}
	if d.Bytes() != nil {
		t.Fatal("released Data still has bytes")
	}
}

// TestCloseContext: a peer that never reads keeps a graceful close waiting; CloseContext
// returns when its context ends, with its error, and the connections are reset.
func TestCloseContext(t *testing.T) {
	e, err := New(Config{Queues: 1, CloseTimeout: time.Hour, SocketOptions: func(s *tcpglue.Socket) error {
		_, err := s.SetSendBuffer(16 << 10)
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := dialPeer(t, e, HandlerFuncs{}) // the peer never reads
	big := make([]byte, 8<<20)
	go c.Write(big) // more than the socket takes: the rest waits in the queue
	testutil.Eventually(t, "bytes queued", func() bool { return c.Queued() > 0 })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.CloseContext(ctx) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("CloseContext = %v, want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("CloseContext did not return when its context ended")
	}
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("the connection was not finished")
	}
	if err := e.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Close after CloseContext = %v, want ErrClosed", err)
	}
}
