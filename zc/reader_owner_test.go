package zc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/testutil"
)

// Who reads a connection is part of its state (Conn.rd): one reader at a time, so a second
// Relay of a connection, a Relay of a FanOut subscriber or of a ReadSelf connection are
// refused with ErrInvalid and change nothing (before, the second relay's handlers or splice
// read the same socket and the bytes scrambled: 10 of 10 runs on the splice path).

// TestRelaySecondReaderRefused: once a relay runs, Relay(front, back) again, Relay(front,
// spare), Relay(spare, back), FanOut.Add(front) and front.SetHandler are all ErrInvalid,
// the spare connection stays open, and every byte of the running relay arrives once, in
// order, both ways, on both paths.
func TestRelaySecondReaderRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		for _, path := range []RelayPath{RelaySplice, RelaySendData} {
			t.Run(path.String(), func(t *testing.T) {
				const conns, perConn = 4, 4 << 20
				s := newSpliceEnv(t, Config{Backend: be, Queues: 2}, RelayOptions{Path: path, PipeSize: 256 << 10},
					streamServe(perConn))
				spare, _ := dialPeer(t, s.e, HandlerFuncs{})
				fo, err := NewFanOut(FanOutOptions{Policy: FanOutDrop})
				if err != nil {
					t.Fatal(err)
				}
				var refused, wrong atomic.Int32
				var why atomic.Value
				check := func(what string, err error) {
					if errors.Is(err, ErrInvalid) {
						refused.Add(1)
						return
					}
					wrong.Add(1)
					why.Store(fmt.Sprintf("%s: %v, want ErrInvalid", what, err))
				}
				hook := func(front, back *Conn) {
					_, err := Relay(front, back)
					check("Relay(front, back) again", err)
					_, err = Relay(front, back, RelayOptions{Path: RelaySendData})
					check("RelayWith(front, back, SendData) again", err)
					_, err = Relay(front, spare)
					check("Relay(front, spare)", err)
					_, err = Relay(spare, back)
					check("Relay(spare, back)", err)
					check("FanOut.Add(front)", fo.Add(front))
					check("front.SetHandler", front.SetHandler(HandlerFuncs{}))
				}
				s.hook.Store(&hook)
				runSpliceClients(t, s.addr(), conns, perConn)
				if spare.isClosing() {
					t.Error("a refused relay closed the spare connection")
				}
				spare.Close()
				<-spare.Done()
				s.checkRelays(t, conns, perConn+8, perConn)
				if w := wrong.Load(); w > 0 {
					t.Errorf("%d calls not refused, one: %v", w, why.Load())
				}
				if r := refused.Load(); r != 6*conns {
					t.Errorf("%d refusals, want %d", r, 6*conns)
				}
				if n := fo.Stats().Subscribers; n != 0 {
					t.Errorf("FanOut has %d subscribers, want 0", n)
				}
			})
		}
	})
}

// TestRelayOfSubscriberRefused: a FanOut subscriber cannot be relayed (ErrInvalid, its
// handler keeps receiving, nothing closed) until it is removed; then the relay takes it and
// forwards. A ReadSelf connection is refused the same way and still reads its socket.
func TestRelayOfSubscriberRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		e := newEngine(t, Config{Backend: be, Queues: 2})
		got := make(chan string, 16)
		h := HandlerFuncs{Data: func(c *Conn, d Data) {
			got <- string(d.Bytes())
			d.Release()
		}}
		a, pa := dialPeer(t, e, h)
		b, pb := dialPeer(t, e, HandlerFuncs{})
		fo, err := NewFanOut(FanOutOptions{Policy: FanOutDrop})
		if err != nil {
			t.Fatal(err)
		}
		if err := fo.Add(a); err != nil {
			t.Fatal(err)
		}
		if _, err := Relay(a, b); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Relay of a subscriber: %v, want ErrInvalid", err)
		}
		if _, err := Relay(b, a); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Relay(b, subscriber): %v, want ErrInvalid", err)
		}
		if err := a.SetHandler(HandlerFuncs{}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("SetHandler on a subscriber: %v, want ErrInvalid", err)
		}
		if a.isClosing() || b.isClosing() {
			t.Fatal("a refused relay closed a connection")
		}
		// The subscriber's own handler still gets its bytes.
		pa.Write([]byte("hello"))
		if s := recvString(t, got, 5); s != "hello" {
			t.Fatalf("subscriber's handler got %q", s)
		}
		// b was claimed and given back by the refused Relay(b, a): a relay now takes it.
		if !fo.Remove(a) {
			t.Fatal("Remove: not a subscriber")
		}
		testutil.Eventually(t, "the subscriber's handler back", func() bool {
			var back bool
			a.q.Do(func() error { _, back = a.h.(HandlerFuncs); return nil })
			return back
		})
		// Paused until the relay's handler is in place (bytes that arrive earlier go to
		// the old handler: Relay's doc).
		// (On its queue: a pause posted from here could run after the bytes' event.)
		if err := a.q.Do(func() error { return a.SetReceivePaused(true) }); err != nil {
			t.Fatal(err)
		}
		rs, err := Relay(a, b)
		if err != nil {
			t.Fatalf("Relay after Remove: %v", err)
		}
		if err := fo.Add(a); !errors.Is(err, ErrInvalid) {
			t.Fatalf("FanOut.Add of a relayed connection: %v, want ErrInvalid", err)
		}
		pa.Write([]byte("world"))
		buf := make([]byte, 5)
		pb.SetReadDeadline(time.Now().Add(time.Minute))
		if _, err := io.ReadFull(pb, buf); err != nil || string(buf) != "world" {
			t.Fatalf("relayed %q, %v: got %d path %v stats %d/%d\n%s%s", buf, err, len(got), rs.Path, rs.AtoB.Load(), rs.BtoA.Load(), spliceDump(e), engineDump(e))
		}

		// ReadSelf: the application reads it; a relay is refused, nothing changes.
		c2, p2 := dialSelf(t, e)
		d, _ := dialPeer(t, e, HandlerFuncs{})
		if _, err := Relay(c2, d); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Relay of a ReadSelf connection: %v, want ErrInvalid", err)
		}
		if _, err := Relay(d, c2); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Relay(d, ReadSelf connection): %v, want ErrInvalid", err)
		}
		p2.Write([]byte("self"))
		rb := make([]byte, 4)
		if _, err := io.ReadFull(c2, rb); err != nil || string(rb) != "self" {
			t.Fatalf("ReadSelf read %q, %v", rb, err)
		}
		if _, err := Relay(d, spareConn(t, e)); err != nil {
			t.Fatalf("Relay of the connection a refused relay gave back: %v", err)
		}
	})
}

// recvString collects n bytes of handler deliveries.
func recvString(t *testing.T, ch chan string, n int) string {
	t.Helper()
	var s string
	for len(s) < n {
		select {
		case p := <-ch:
			s += p
		case <-time.After(time.Minute):
			t.Fatalf("got %q, want %d bytes", s, n)
		}
	}
	return s
}

func spareConn(t *testing.T, e *Engine) *Conn {
	c, _ := dialPeer(t, e, HandlerFuncs{})
	return c
}

// dialSelf dials a ReadSelf connection to a Go peer.
func dialSelf(t *testing.T, e *Engine) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), HandlerFuncs{}, DialOptions{ReadSelf: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); c.Close() })
	return c, p
}

// TestSetHandlerRacingRelay: a SetHandler from another goroutine, accepted while the
// connection still had its own handler, whose install runs after a Relay took the
// connection on its queue, gives way: the relay's handler stays, and the relay forwards.
func TestSetHandlerRacingRelay(t *testing.T) {
	e := newEngine(t, Config{Queues: 1})
	a, pa := dialPeer(t, e, HandlerFuncs{})
	b, pb := dialPeer(t, e, HandlerFuncs{})
	var entered atomic.Bool
	gate := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- a.q.Do(func() error {
			entered.Store(true)
			<-gate
			// On a's queue: the relay's handler is in place at once.
			_, err := Relay(a, b, RelayOptions{Path: RelaySendData})
			return err
		})
	}()
	testutil.Eventually(t, "the queue busy", entered.Load)
	// Posted behind the function above: it runs after the relay took a.
	if err := a.SetHandler(HandlerFuncs{}); err != nil {
		t.Fatalf("SetHandler before the relay: %v", err)
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("Relay: %v", err)
	}
	var h Handler
	a.q.Do(func() error { h = a.h; return nil })
	if _, ok := h.(*relaySide); !ok {
		t.Fatalf("a's handler is %T, want the relay's", h)
	}
	pa.Write([]byte("raced"))
	buf := make([]byte, 5)
	pb.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadFull(pb, buf); err != nil || string(buf) != "raced" {
		t.Fatalf("relayed %q, %v", buf, err)
	}
}

// TestExclusiveHandler: a connection opened Exclusive (ListenOptions, DialOptions: what the
// net.Conn face, zc/netconn, opens) keeps its first handler as its reader: Relay (either
// side) and SetHandler are ErrInvalid and change nothing, and the handler goes on receiving
// every byte; without Exclusive the same SetHandler is taken.
func TestExclusiveHandler(t *testing.T) {
	for _, exclusive := range []bool{true, false} {
		t.Run(fmt.Sprintf("Exclusive=%v", exclusive), func(t *testing.T) {
			e := newEngine(t, Config{Queues: 1})
			got := make(chan string, 16)
			h := HandlerFuncs{Data: func(c *Conn, d Data) { got <- string(d.Bytes()); d.Release() }}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), h, DialOptions{Exclusive: exclusive})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			peer, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			other := spareConn(t, e)
			_, err1 := Relay(c, other)
			_, err2 := Relay(other, c)
			if exclusive {
				if !errors.Is(err1, ErrInvalid) || !errors.Is(err2, ErrInvalid) {
					t.Fatalf("Relay of an Exclusive connection: %v, %v; want ErrInvalid", err1, err2)
				}
				if err := c.SetHandler(HandlerFuncs{}); !errors.Is(err, ErrInvalid) {
					t.Fatalf("SetHandler on an Exclusive connection: %v, want ErrInvalid", err)
				}
				peer.Write([]byte("mine"))
				if s := recvString(t, got, 4); s != "mine" {
					t.Fatalf("the handler got %q", s)
				}
				if other.isClosing() || c.isClosing() {
					t.Fatal("a refused call closed a connection")
				}
				return
			}
			if err1 != nil {
				t.Fatalf("Relay of a connection opened without Exclusive: %v", err1)
			}
		})
	}
}
