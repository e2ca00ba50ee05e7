package netconn

import (
	"github.com/zcnet/zcnet/zc"

	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Direct reads (netconn_direct.go): the net.Conn face reads the socket itself by default,
// through the ring with Options.Ring; both carry every byte, the counters say which
// path carried them, and the descriptors come and go with the connections (TestMain counts
// them).

func TestNetConnReadPaths(t *testing.T) {
	for _, b := range []zc.Backend{zc.BackendIOUring, zc.BackendPlain} {
		for _, ring := range []bool{false, true} {
			name := b.String() + "/direct"
			if ring {
				name = b.String() + "/ring"
			}
			t.Run(name, func(t *testing.T) {
				cfg := smallCfg(b)
				o := Options{Ring: ring}
				srv, cli := newEngine(t, cfg), newEngine(t, cfg)
				ln, err := o.Listen(srv, "tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				// The server echoes with io.Copy (its WriteTo and ReadFrom), the client
				// writes 8 MiB from one goroutine and reads it back on another.
				go func() {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					io.Copy(c, c)
					c.(Conn).CloseWrite()
					c.Close()
				}()
				c, err := o.Dial(context.Background(), cli, "tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				// Misuse: asking the zc.Conn underneath to receive must not start the ring
				// beside the face's own reads (the counters below would show it).
				if err := c.Zc().SetReceivePaused(false); err != nil {
					t.Fatal(err)
				}
				if p := c.Zc().Stats().RecvPaused; p == ring {
					t.Errorf("RecvPaused %v on a face that reads through the ring: %v", p, ring)
				}
				msg := make([]byte, 8<<20)
				for i := range msg {
					msg[i] = byte(i*31 + i>>9)
				}
				werr := make(chan error, 1)
				go func() {
					for p := msg; len(p) > 0; {
						k := min(len(p), 1+len(p)%70001)
						if _, err := c.Write(p[:k]); err != nil {
							werr <- err
							return
						}
						p = p[k:]
					}
					werr <- c.CloseWrite()
				}()
				c.SetReadDeadline(time.Now().Add(hangBound))
				got, err := io.ReadAll(c)
				if err != nil {
					t.Fatalf("ReadAll: %v after %d bytes", err, len(got))
				}
				if err := <-werr; err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, msg) {
					t.Fatalf("echoed %d bytes (crc %08x), sent %d (crc %08x)", len(got), crc32.ChecksumIEEE(got), len(msg), crc32.ChecksumIEEE(msg))
				}
				for side, e := range map[string]*zc.Engine{"server": srv, "client": cli} {
					st := e.Stats()
					if ring && (st.Recv.BytesDirect != 0 || st.Recv.BytesRing+st.Recv.BytesPlain < uint64(len(msg))) {
						t.Errorf("%s with Options.Ring: %d bytes read directly, %d through the queue", side, st.Recv.BytesDirect, st.Recv.BytesRing+st.Recv.BytesPlain)
					}
					if !ring && (st.Recv.BytesDirect != uint64(len(msg)) || st.Recv.BytesRing+st.Recv.BytesPlain != 0) {
						t.Errorf("%s: %d bytes read directly, %d through the queue; want %d and 0", side, st.Recv.BytesDirect, st.Recv.BytesRing+st.Recv.BytesPlain, len(msg))
					}
				}
				if n := c.Zc().Stats().BytesRecv; n != uint64(len(msg)) {
					t.Errorf("ConnStats.BytesRecv = %d, want %d", n, len(msg))
				}
			})
		}
	}
}

// A Read waiting in the poller ends with the connection: when the application closes it
// (net.ErrClosed), when the engine closes it (the peer sees the close, the reader an error),
// and at its deadline, moved while it waits.
func TestNetConnDirectReadWakes(t *testing.T) {
	for _, b := range []zc.Backend{zc.BackendIOUring, zc.BackendPlain} {
		t.Run(b.String(), func(t *testing.T) {
			for _, how := range []string{"Close", "Engine.Close", "deadline"} {
				t.Run(how, func(t *testing.T) {
					e, err := zc.New(zc.Config{Backend: b, Queues: 1, NoPin: true})
					if err != nil {
						t.Fatal(err)
					}
					defer e.Close()
					s, nc := netAccepted(t, e, Options{})
					defer nc.Close()
					got := make(chan error, 1)
					go func() {
						_, err := nc.Read(make([]byte, 64))
						got <- err
					}()
					waitIOWait(t, "TestNetConnDirectReadWakes", 1) // the Read waits in the poller
					switch how {
					case "Close":
						nc.Close()
					case "Engine.Close":
						e.Close()
					case "deadline":
						nc.SetReadDeadline(time.Now().Add(time.Hour))
						waitIOWait(t, "TestNetConnDirectReadWakes", 1) // still waiting, under the new deadline
						nc.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
					}
					err = waitHang(t, got, "a waiting Read after "+how, func() string { return engineDump(e) })
					var ne net.Error
					switch how {
					case "Close":
						if !errors.Is(err, net.ErrClosed) {
							t.Fatalf("Read after Close: %v, want net.ErrClosed", err)
						}
						// As in Go's net: setting a deadline on a closed connection fails.
						for name, set := range map[string]func(time.Time) error{"SetDeadline": nc.SetDeadline,
							"SetReadDeadline": nc.SetReadDeadline, "SetWriteDeadline": nc.SetWriteDeadline} {
							if err := set(time.Now()); !errors.Is(err, net.ErrClosed) {
								t.Errorf("%s after Close: %v, want net.ErrClosed", name, err)
							}
						}
					case "Engine.Close":
						if err != io.EOF && !errors.Is(err, zc.ErrClosed) {
							t.Fatalf("Read after Engine.Close: %v, want io.EOF or zc.ErrClosed", err)
						}
						// The peer sees the close (FIN), and nothing keeps the socket open.
						s.SetReadDeadline(time.Now().Add(hangBound)) // a bound for a hang only
						k, rerr := s.Read(make([]byte, 8))
						if k != 0 || (rerr != nil && rerr != io.EOF && !errors.Is(rerr, unix.ECONNRESET)) {
							t.Fatalf("peer after Engine.Close: read %d, %v; want the end of the stream", k, rerr)
						}
						if _, err := nc.Read(make([]byte, 8)); err == nil {
							t.Fatal("a second Read after Engine.Close succeeded")
						}
					case "deadline":
						if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
							t.Fatalf("Read past its deadline: %v, want a timeout", err)
						}
					}
				})
			}
		})
	}
}

// Races on direct connections: readers, deadline changes, Close and the engine's close
// arrive in any order; every call returns (no hang, no panic), and the descriptors come
// back (TestMain counts them).
func TestNetConnDirectRaces(t *testing.T) {
	for _, b := range []zc.Backend{zc.BackendIOUring, zc.BackendPlain} {
		t.Run(b.String(), func(t *testing.T) {
			for round := 0; round < 3; round++ {
				e, err := zc.New(zc.Config{Backend: b, Queues: 2, NoPin: true})
				if err != nil {
					t.Fatal(err)
				}
				ln, err := Listen(e, "tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				const conns = 16
				var peers []net.Conn
				for i := 0; i < conns; i++ {
					p, err := net.Dial("tcp", ln.Addr().String())
					if err != nil {
						t.Fatal(err)
					}
					defer p.Close()
					peers = append(peers, p)
				}
				done := make(chan struct{}, 4*conns)
				for i := 0; i < conns; i++ {
					nc, err := ln.Accept()
					if err != nil {
						t.Fatal(err)
					}
					go func() { // a reader
						defer func() { done <- struct{}{} }()
						buf := make([]byte, 512)
						for {
							if _, err := nc.Read(buf); err != nil {
								var ne net.Error
								if errors.As(err, &ne) && ne.Timeout() {
									continue
								}
								return
							}
						}
					}()
					go func() { // deadlines moving under it
						defer func() { done <- struct{}{} }()
						for j := 0; j < 50; j++ {
							if nc.SetReadDeadline(time.Now().Add(time.Duration(j%3)*time.Millisecond)) != nil {
								return
							}
							time.Sleep(100 * time.Microsecond)
						}
					}()
					go func(i int) { // the peer writes; half the connections are closed by us
						defer func() { done <- struct{}{} }()
						peers[i].Write(make([]byte, 1000*(i+1)))
						if i%2 == 0 {
							time.Sleep(time.Duration(i) * 200 * time.Microsecond)
							nc.Close()
						}
					}(i)
					go func() { // a second reader now and then
						defer func() { done <- struct{}{} }()
						nc.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
						nc.Read(make([]byte, 64))
					}()
				}
				time.Sleep(3 * time.Millisecond)
				closed := make(chan error, 1)
				go func() { closed <- e.Close() }()
				waitHang(t, closed, "Engine.Close among racing readers", func() string { return engineDump(e) })
				for i := 0; i < 4*conns; i++ {
					waitHang(t, done, "a racing net.Conn call", func() string { return "" })
				}
				ln.Close()
			}
		})
	}
}

// ioWaiting counts the goroutines parked in Go's poller ("IO wait") whose stacks hold fn
// (part of a function's name, such as the test's).
func ioWaiting(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	k := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		head, _, _ := bytes.Cut(g, []byte("\n"))
		if bytes.Contains(head, []byte("[IO wait")) && bytes.Contains(g, []byte(fn)) {
			k++
		}
	}
	return k
}

// waitIOWait waits until at least n goroutines of fn wait in Go's poller; it fails when
// they do not within hangBound.
func waitIOWait(t *testing.T, fn string, n int) {
	t.Helper()
	for start := time.Now(); ioWaiting(fn) < n; time.Sleep(time.Millisecond) {
		if time.Since(start) > hangBound {
			t.Fatalf("%d goroutines of %s wait in the poller, want %d", ioWaiting(fn), fn, n)
		}
	}
}
