package netconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/zcnet/zcnet/zc"
)

// TestRelayOfFaceRefused: a net.Conn face's connection, reading its socket itself or (with
// Options.Ring) through its handler, cannot be relayed nor get another handler
// (zc.ErrInvalid: the face opens its connections Exclusive); the face goes on reading every
// byte.
func TestRelayOfFaceRefused(t *testing.T) {
	for _, ring := range []bool{false, true} {
		t.Run(fmt.Sprintf("Ring=%v", ring), func(t *testing.T) {
			e := newEngine(t, zc.Config{Queues: 1})
			l, err := Options{Ring: ring}.Listen(e, "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			peer, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			nc, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			c := nc.(Conn).Zc()
			other := spareConn(t, e)
			if _, err := zc.Relay(c, other); !errors.Is(err, zc.ErrInvalid) {
				t.Fatalf("Relay of a face's connection: %v, want ErrInvalid", err)
			}
			if _, err := zc.Relay(other, c); !errors.Is(err, zc.ErrInvalid) {
				t.Fatalf("Relay(other, face's connection): %v, want ErrInvalid", err)
			}
			if err := c.SetHandler(zc.HandlerFuncs{}); !errors.Is(err, zc.ErrInvalid) {
				t.Fatalf("SetHandler on a face's connection: %v, want ErrInvalid", err)
			}
			peer.Write([]byte("face"))
			nc.SetReadDeadline(time.Now().Add(time.Minute))
			b := make([]byte, 4)
			if _, err := io.ReadFull(nc, b); err != nil || string(b) != "face" {
				t.Fatalf("the face read %q, %v", b, err)
			}
			if closed(other) {
				t.Fatal("a refused relay closed the other connection")
			}
		})
	}
}

// spareConn dials a connection on e to a listener of Go's net (both close with the test).
func spareConn(t *testing.T, e *zc.Engine) *zc.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), zc.HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closed reports whether c finished (its Done channel is closed).
func closed(c *zc.Conn) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}
