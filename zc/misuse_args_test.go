package zc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/memreg"
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
	addr := dialablePort(t)
	before := e.Stats().Faults.HandlerPanics
	ran := make(chan struct{})
	err = e.DialAsync(context.Background(), "tcp", addr, HandlerFuncs{}, func(*Conn, error) {
		close(ran)
		panic("done panics on failure")
	})
	if err != nil {
		t.Fatal(err)
	}
	<-ran
	testutil.Eventually(t, "the panic counted", func() bool { return e.Stats().Faults.HandlerPanics > before })
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

// TestOutOfRangeArgs: values past a limit (KeepAlive over the kernel's 32767 s at New, Listen
// and Dial), a negative Send length and nil contexts each get a typed error, and the
// smallest HeldData bound still starts its watcher.
func TestOutOfRangeArgs(t *testing.T) {
	// KeepAlive above the kernel's limit: refused at New, at Listen and at Dial.
	var ce *ConfigError
	if _, err := New(Config{KeepAlive: 32768 * time.Second}); !errors.As(err, &ce) || ce.Field != "KeepAlive" || !errors.Is(err, ErrInvalid) {
		t.Fatalf("New with KeepAlive 32768s = %v, want a *ConfigError for KeepAlive", err)
	}
	e := newEngine(t, Config{Queues: 1, KeepAlive: 32767 * time.Second})
	if _, err := e.Listen("tcp", "127.0.0.1:0", echoAccept, ListenOptions{KeepAlive: 40000 * time.Second}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Listen with KeepAlive 40000s = %v, want ErrInvalid", err)
	}
	if _, err := e.Dial(context.Background(), "tcp", dialablePort(t), HandlerFuncs{}, DialOptions{KeepAlive: 40000 * time.Second}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Dial with KeepAlive 40000s = %v, want ErrInvalid", err)
	}
	c, _ := dialPeer(t, e, HandlerFuncs{}) // the longest KeepAlive works
	// Send with a negative length: ErrInvalid, and the buffer is not leaked.
	b, err := c.BufferWait(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Send(b, -1); !errors.Is(err, ErrInvalid) || errors.Is(err, ErrTooLarge) {
		t.Fatalf("Send(b, -1) = %v, want ErrInvalid", err)
	}
	if b.Valid() {
		t.Fatal("the buffer of a refused Send is still held")
	}
	// nil contexts are refused, not a panic.
	//lint:ignore SA1012 the misuse under test
	if _, err := c.WriteContext(nil, []byte("x")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("WriteContext(nil) = %v", err)
	}
	//lint:ignore SA1012 the misuse under test
	if err := e.CloseContext(nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("CloseContext(nil) = %v", err)
	}
	c.Close()
	<-c.Done()
	// The smallest HeldData bound: the watcher still starts (no zero ticker).
	d, err := New(Config{Queues: 1, Debug: DebugOptions{HeldData: 1}})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
}

// TestBufferWaitTimeouts: with the send pool empty, BufferWait with a timeout returns an
// error matching os.ErrDeadlineExceeded when it passes, and a negative timeout at once (it
// waited forever, as 0 does).
func TestBufferWaitTimeouts(t *testing.T) {
	e := newEngine(t, Config{Queues: 1, SendBufs: 2, SendBufSize: 4096, SendPoolMax: 8192})
	c, _ := dialPeer(t, e, HandlerFuncs{})
	var held []memreg.Buf
	for {
		b, err := c.Buffer()
		if err != nil {
			break
		}
		held = append(held, b)
	}
	if len(held) == 0 {
		t.Fatal("no buffer at all")
	}
	for _, d := range []time.Duration{-1, 20 * time.Millisecond} {
		res := make(chan error, 1)
		go func() {
			_, err := c.BufferWait(d)
			res <- err
		}()
		if err := waitHang(t, res, fmt.Sprintf("BufferWait(%v) on an empty pool", d), nil); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("BufferWait(%v) on an empty pool = %v, want os.ErrDeadlineExceeded", d, err)
		}
	}
	for _, b := range held {
		b.Release()
	}
	if b, err := c.BufferWait(-1); err != nil {
		t.Fatalf("BufferWait(-1) with free buffers = %v", err)
	} else {
		b.Release()
	}
}
