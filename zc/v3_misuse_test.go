package zc

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestDialAsyncDonePanics: a panic in DialAsync's done is a handler's panic: counted, the
// new connection closed with a *PanicError, the process alive; on the failure path too.
func TestDialAsyncDonePanics(t *testing.T) {
	e := newEngine(t, Config{Queues: 1})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed := make(chan error, 1)
	err = e.DialAsync(context.Background(), "tcp", ln.Addr().String(), HandlerFuncs{
		Close: func(_ *Conn, err error) { closed <- err },
	}, func(*Conn, error) { panic("done panics") })
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	select {
	case err := <-closed:
		var pe *PanicError
		if !errors.As(err, &pe) || pe.Method != "DialAsync done" {
			t.Fatalf("OnClose(%v), want a *PanicError of DialAsync done", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the connection was not closed")
	}
	peer.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.Copy(io.Discard, peer); err != nil && !isReset(err) {
		t.Fatalf("peer: %v", err)
	}
	// The failure path: a port nobody listens on.
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	before := e.Stats().HandlerPanics
	ran := make(chan struct{})
	err = e.DialAsync(context.Background(), "tcp", addr, HandlerFuncs{}, func(*Conn, error) {
		close(ran)
		panic("done panics on failure")
	})
	if err != nil {
		t.Fatal(err)
	}
	<-ran
	waitCond(t, "the panic counted", func() bool { return e.Stats().HandlerPanics > before })
	// The queue still works.
	c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), HandlerFuncs{})
	if err != nil {
		t.Fatalf("dial after the panics: %v", err)
	}
	c.Close()
	if p, err := ln.Accept(); err == nil {
		p.Close()
	}
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// waitCond polls cond (a liveness wait, not a timing assertion).
func waitCond(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
