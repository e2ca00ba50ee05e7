package netconn

import (
	"github.com/zcnet/zcnet/zc"

	"context"
	"io"
	"testing"
	"time"
)

// TestHalfCloseEchoNoReset: a client streams 8 MiB through a net.Conn echo and half-closes;
// the server echoes until EOF, half-closes and closes; every byte comes back and nothing is
// reset. (io_uring gave up sends on non-blocking sockets with EAGAIN under a full send buffer,
// and the core took it for an error: the connection was reset.)
func TestHalfCloseEchoNoReset(t *testing.T) {
	for _, b := range []zc.Backend{zc.BackendIOUring, zc.BackendPlain} {
		t.Run(b.String(), func(t *testing.T) { testHalfCloseEcho(t, zc.Config{Backend: b, Queues: 2}) })
	}
}

func testHalfCloseEcho(t *testing.T, cfg zc.Config) {
	srv, cli := newPair(t, cfg)
	ln, err := Listen(srv, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							t.Errorf("server write: %v", werr)
							return
						}
					}
					if err != nil {
						if err != io.EOF {
							t.Errorf("server read: %v", err)
						}
						break
					}
				}
				c.(Conn).CloseWrite()
				c.Close()
			}()
		}
	}()
	for round := 0; round < 20; round++ {
		c, err := Dial(context.Background(), cli, "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		const total = 8 << 20
		got := make(chan error, 1)
		go func() {
			n, err := io.Copy(io.Discard, c)
			if err == nil && n != total {
				err = io.ErrUnexpectedEOF
			}
			got <- err
		}()
		p := make([]byte, 64<<10)
		for sent := 0; sent < total; sent += len(p) {
			if _, err := c.Write(p); err != nil {
				t.Fatal(err)
			}
		}
		c.CloseWrite()
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: stalled\n%s\n%s", round, engineDump(cli), engineDump(srv))
		}
		c.Close()
	}
}
