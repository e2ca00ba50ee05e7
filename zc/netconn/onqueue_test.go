package netconn

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/zcnet/zcnet/zc"
)

// TestReadOnQueueWouldBlock: a Conn's Read with nothing to read, called on a queue goroutine
// (an accept function, a handler's OnData, a function posted to a connection), returns a
// *net.OpError matching zc.ErrWouldBlock instead of waiting for the queue it blocks, on
// both receive paths.
func TestReadOnQueueWouldBlock(t *testing.T) {
	for _, b := range []zc.Backend{zc.BackendIOUring, zc.BackendPlain} {
		for _, ring := range []bool{false, true} {
			for _, site := range []string{"accept", "OnData", "Post"} {
				name := b.String() + "/direct/" + site
				if ring {
					name = b.String() + "/ring/" + site
				}
				t.Run(name, func(t *testing.T) {
					e := newEngine(t, zc.Config{Backend: b, Queues: 1, NoPin: true}) // one queue: the face's too
					quiet, err := e.Listen("tcp", "127.0.0.1:0", func(*zc.Conn) zc.Handler { return zc.HandlerFuncs{} })
					if err != nil {
						t.Fatal(err)
					}
					defer quiet.Close()
					nc, err := Options{Ring: ring}.Dial(context.Background(), e, "tcp", quiet.Addr().String())
					if err != nil {
						t.Fatal(err)
					}
					defer nc.Close()
					got := make(chan error, 1)
					read := func() {
						_, err := nc.Read(make([]byte, 16))
						got <- err
					}
					// Another connection of the same queue, whose accept, OnData or
					// posted function reads the face.
					l, err := e.Listen("tcp", "127.0.0.1:0", func(c *zc.Conn) zc.Handler {
						if site == "accept" {
							read()
						}
						return zc.HandlerFuncs{Data: func(c *zc.Conn, d zc.Data) {
							d.Release()
							if site == "OnData" {
								read()
							}
						}}
					})
					if err != nil {
						t.Fatal(err)
					}
					defer l.Close()
					peer, err := net.Dial("tcp", l.Addr().String())
					if err != nil {
						t.Fatal(err)
					}
					defer peer.Close()
					if _, err := peer.Write([]byte("x")); err != nil {
						t.Fatal(err)
					}
					if site == "Post" {
						if err := nc.Zc().Post(read); err != nil {
							t.Fatal(err)
						}
					}
					err = waitHang(t, got, "Read from "+site, func() string { return engineDump(e) })
					var ne *net.OpError
					if !errors.Is(err, zc.ErrWouldBlock) || !errors.As(err, &ne) {
						t.Fatalf("Read with no data from %s = %v, want a *net.OpError matching ErrWouldBlock", site, err)
					}
				})
			}
		}
	}
}

// TestNilEngine: Listen and Dial without an engine are a *net.OpError matching
// zc.ErrInvalid, not a panic.
func TestNilEngine(t *testing.T) {
	var ne *net.OpError
	if _, err := Listen(nil, "tcp", "127.0.0.1:0"); !errors.As(err, &ne) || !errors.Is(err, zc.ErrInvalid) {
		t.Errorf("Listen(nil engine) = %v", err)
	}
	if _, err := Dial(context.Background(), nil, "tcp", "127.0.0.1:1"); !errors.As(err, &ne) || !errors.Is(err, zc.ErrInvalid) {
		t.Errorf("Dial(nil engine) = %v", err)
	}
}
