package zc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// payload returns n deterministic bytes.
func payload(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*131 + i>>11)
	}
	return p
}

// onlyReader hides every other method of a reader (io.Copy must not find WriteTo).
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// TestNetConnReadFromWriteTo: io.Copy into a zc net.Conn from a file (sendfile), a TCP socket
// (splice), a plain reader (straight into send buffers) and a LimitedReader; io.Copy out of
// one through WriteTo. Every byte checked, on both backends.
func TestNetConnReadFromWriteTo(t *testing.T) {
	const size = 3<<20 + 12345
	want := payload(size)
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, want, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, b := range []Backend{BackendIOUring, BackendPlain} {
		t.Run(b.String(), func(t *testing.T) {
			mk := netPipe(t, smallCfg(b))
			type source struct {
				name string
				open func(t *testing.T) (io.Reader, int)
			}
			for _, src := range []source{
				{"file", func(t *testing.T) (io.Reader, int) {
					f, err := os.Open(file)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { f.Close() })
					return f, size
				}},
				{"limited-file", func(t *testing.T) (io.Reader, int) {
					f, err := os.Open(file)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { f.Close() })
					return io.LimitReader(f, size/2), size / 2
				}},
				{"tcp", func(t *testing.T) (io.Reader, int) {
					ln, err := net.Listen("tcp", "127.0.0.1:0")
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { ln.Close() })
					go func() {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						c.Write(want)
						c.Close()
					}()
					c, err := net.Dial("tcp", ln.Addr().String())
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { c.Close() })
					return c, size
				}},
				{"reader", func(t *testing.T) (io.Reader, int) { return onlyReader{bytes.NewReader(want)}, size }},
			} {
				t.Run(src.name, func(t *testing.T) {
					c1, c2, stop, err := mk()
					if err != nil {
						t.Fatal(err)
					}
					defer stop()
					r, n := src.open(t)
					e := c1.(NetConn).Zc().e
					before := e.Stats().BytesSentSpliced
					got := make(chan []byte, 1)
					go func() {
						var buf bytes.Buffer
						io.Copy(&buf, c2) // WriteTo
						got <- buf.Bytes()
					}()
					if _, ok := c1.(io.ReaderFrom); !ok {
						t.Fatal("no io.ReaderFrom")
					}
					k, err := io.Copy(c1, r)
					if err != nil || k != int64(n) {
						t.Fatalf("io.Copy = %d, %v; want %d", k, err, n)
					}
					if err := c1.(NetConn).CloseWrite(); err != nil {
						t.Fatal(err)
					}
					g := <-got
					if sha256.Sum256(g) != sha256.Sum256(want[:n]) {
						t.Fatalf("received %d bytes, differ from the %d sent", len(g), n)
					}
					spliced := e.Stats().BytesSentSpliced - before
					if (src.name == "reader") != (spliced == 0) || (spliced != 0 && spliced != uint64(n)) {
						t.Fatalf("%d bytes went by sendfile/splice for a %s source of %d", spliced, src.name, n)
					}
				})
			}
		})
	}
}

// A write deadline bounds a ReadFrom whose peer does not read.
func TestNetConnReadFromDeadline(t *testing.T) {
	c1, c2, stop, err := netPipe(t, smallCfg(BackendIOUring))()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	_ = c2
	f, err := os.Open("/dev/zero")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c1.SetWriteDeadline(timeNow().Add(300 * timeMillisecond))
	_, err = io.Copy(c1, io.LimitReader(f, 1<<30))
	if !os.IsTimeout(err) {
		t.Fatalf("io.Copy to a peer that does not read: %v, want a timeout", err)
	}
	_ = context.Background
}
