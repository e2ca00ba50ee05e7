package zc_test

// io.Copy into and out of zc connections: Conn.ReadFrom from files, TCP connections and
// readers (with write deadlines), and Conn.Read of a ReadSelf connection as an io.Reader.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"testing"
	"time"

	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc"
)

// TestReadFromSources: io.Copy into a *zc.Conn from a file, a TCP connection and a
// bytes.Reader, off the queues, on ReadSelf and event-loop connections: every byte arrives
// once; a write deadline that passes mid-copy stops it with os.ErrDeadlineExceeded, what
// it reported is what the peer gets, and the source holds exactly the rest.
func TestReadFromSources(t *testing.T) {
	eachBackend(t, func(t *testing.T, b zc.Backend) {
		checkLeaks(t)
		e := userEngine(t, zc.Config{Queues: 1, Backend: b, NoFallback: true, MaxQueuedBytes: 256 << 10,
			SocketOptions: func(s *tcpglue.Socket) error { _, err := s.SetSendBuffer(64 << 10); return err }})
		want := make([]byte, 3<<20)
		rand.New(rand.NewSource(1)).Read(want)
		for _, src := range probeSources {
			for _, self := range []bool{false, true} {
				for _, mode := range []string{"whole", "copyN", "deadline", "moved"} {
					name := fmt.Sprintf("%s/readself=%v/%s", src.name, self, mode)
					t.Run(name, func(t *testing.T) {
						peer := newProbePeer(t)
						c, err := e.Dial(context.Background(),
							"tcp", peer.ln.Addr().String(), zc.HandlerFuncs{}, zc.DialOptions{ReadSelf: self})
						if err != nil {
							t.Fatal(err)
						}
						defer c.Close()
						r, rest := src.open(t, want)
						var n int64
						switch mode {
						case "whole":
							peer.start()
							spliced := e.Stats().Send.BytesSpliced
							within(t, "copy", func() { n, err = io.Copy(c, r) })
							if err != nil || n != int64(len(want)) {
								t.Fatalf("io.Copy: %d, %v; want %d", n, err, len(want))
							}
							// A file and a socket go by sendfile or splice, even through
							// the wrappers their WriteTo hands to io.Copy.
							if d := e.Stats().Send.BytesSpliced - spliced; src.name != "bytes" && d != uint64(n) {
								t.Errorf("%d of %d bytes spliced", d, n)
							}
						case "copyN": // an io.LimitedReader: exactly that many, the rest left in the source
							peer.start()
							within(t, "copy", func() { n, err = io.CopyN(c, r, int64(len(want)/3+1)) })
							if err != nil || n != int64(len(want)/3+1) {
								t.Fatalf("io.CopyN: %d, %v; want %d", n, err, len(want)/3+1)
							}
						case "deadline": // passes while the copy waits for a peer that does not read
							c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
							within(t, "copy", func() { n, err = io.Copy(c, r) })
							if !errors.Is(err, os.ErrDeadlineExceeded) {
								t.Fatalf("io.Copy: %d, %v; want the deadline", n, err)
							}
							var ne net.Error
							if !errors.As(err, &ne) || !ne.Timeout() {
								t.Errorf("io.Copy's error %v is no timeout net.Error", err)
							}
						case "moved": // a far deadline, moved near while the copy waits
							c.SetWriteDeadline(time.Now().Add(time.Hour))
							go func() {
								time.Sleep(200 * time.Millisecond)
								c.SetWriteDeadline(time.Now())
							}()
							within(t, "copy", func() { n, err = io.Copy(c, r) })
							if !errors.Is(err, os.ErrDeadlineExceeded) {
								t.Fatalf("io.Copy: %d, %v; want the deadline", n, err)
							}
						}
						if err := c.Close(); err != nil {
							t.Fatal(err)
						}
						if mode == "deadline" || mode == "moved" {
							peer.start() // only now: the copy had to wait
						}
						got := peer.result(t)
						if int64(len(got)) != n || !bytes.Equal(got, want[:n]) {
							t.Fatalf("peer got %d bytes (equal to the source's first: %v), copy reported %d",
								len(got), bytes.Equal(got, want[:min(len(got), len(want))]), n)
						}
						if left := rest(); !bytes.Equal(left, want[n:]) {
							t.Fatalf("the source has %d bytes left, want %d (lost or sent twice)", len(left), int64(len(want))-n)
						}
						select {
						case <-c.Done():
						case <-time.After(userBound):
							t.Fatal("connection never closed")
						}
					})
				}
			}
		}
		t.Logf("%+v", e.Stats().Send)
	})
}

// TestCopyFromReadSelf: io.Copy out of a ReadSelf connection (Conn.Read as an
// io.Reader) into a buffer, and from one ReadSelf connection into another zc connection.
func TestCopyFromReadSelf(t *testing.T) {
	eachBackend(t, func(t *testing.T, b zc.Backend) {
		checkLeaks(t)
		e := userEngine(t, zc.Config{Queues: 1, Backend: b, NoFallback: true})
		want := make([]byte, 2<<20)
		rand.New(rand.NewSource(2)).Read(want)
		// A ReadSelf server copies everything it reads into a zc connection to a Go peer.
		peer := newProbePeer(t)
		copied := make(chan error, 1)
		var n int64
		ln, err := e.Listen("tcp", "127.0.0.1:0",
			func(c *zc.Conn) zc.Handler {
				go func() {
					defer c.Close()
					out, err := e.Dial(context.Background(), "tcp", peer.ln.Addr().String(), zc.HandlerFuncs{})
					if err != nil {
						copied <- err
						return
					}
					n, err = io.Copy(out, c)
					out.Close()
					copied <- err
				}()
				return zc.HandlerFuncs{}
			}, zc.ListenOptions{ReadSelf: true})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cl, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			cl.Write(want)
			cl.Close()
		}()
		got := peer.readAll(t)
		within(t, "copy", func() { err = <-copied })
		if err != nil || n != int64(len(want)) || !bytes.Equal(got, want) {
			t.Fatalf("copied %d (%v), peer got %d, equal %v", n, err, len(got), bytes.Equal(got, want))
		}

		// A ReadSelf client reads into a bytes.Buffer (its ReadFrom calls Conn.Read).
		srv, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		go func() {
			c, err := srv.Accept()
			if err == nil {
				c.Write(want)
				c.Close()
			}
		}()
		c, err := e.Dial(context.Background(), "tcp", srv.Addr().String(), zc.HandlerFuncs{}, zc.DialOptions{ReadSelf: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var buf bytes.Buffer
		within(t, "copy", func() { n, err = io.Copy(&buf, c) })
		if err != nil || !bytes.Equal(buf.Bytes(), want) {
			t.Fatalf("io.Copy from a ReadSelf Conn: %d, %v, equal %v", n, err, bytes.Equal(buf.Bytes(), want))
		}
	})
}

// probePair dials a ReadSelf zc connection (or an event-loop one) to a Go net listener and
// returns both ends.
func probePair(t *testing.T, e *zc.Engine, self bool) (*zc.Conn, net.Conn) {
	t.Helper()
	return probePairH(t, e, self, zc.HandlerFuncs{})
}

func probePairH(t *testing.T, e *zc.Engine, self bool, h zc.Handler) (*zc.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), h, zc.DialOptions{ReadSelf: self})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return c, p
}

// probeIs fails unless err matches want (nil: no error).
func probeIs(t *testing.T, what string, err, want error) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Errorf("%s: %v, want no error", what, err)
		}
		return
	}
	if !errors.Is(err, want) {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
}
