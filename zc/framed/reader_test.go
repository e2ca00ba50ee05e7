package framed

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/zcnet/zcnet/zc"
)

// newEngine starts an engine of cfg (small pools), closed when the test ends.
func newEngine(t *testing.T, cfg zc.Config) *zc.Engine {
	t.Helper()
	if cfg.SendBufs == 0 {
		cfg.SendBufs = 64
	}
	if cfg.RecvBufs == 0 {
		cfg.RecvBufs = 64
	}
	e, err := zc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// serveOne listens on loopback with h as the handler of every connection and dials it once
// with Go's net: the client's side.
func serveOne(t *testing.T, e *zc.Engine, h func() zc.Handler) net.Conn {
	t.Helper()
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *zc.Conn) zc.Handler { return h() })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	nc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// TestReaderFrames: length-prefixed frames written in random pieces arrive in small receive
// buffers, so headers and payloads span buffer boundaries; the handler parses them with a
// Reader (Peek, Skip, Next) and echoes each frame as references to the received buffers
// (Message.SendTo), except some frames that lie whole in the first buffer, read in place
// with Span and copied into the reply: the echo is the stream, byte for byte.
func TestReaderFrames(t *testing.T) {
	for _, b := range []zc.Backend{zc.BackendIOUring, zc.BackendPlain} {
		t.Run(b.String(), func(t *testing.T) { testReaderFrames(t, b) })
	}
}

func testReaderFrames(t *testing.T, b zc.Backend) {
	// Debug's buffer checks: slices of shared buffers must not look like writes after Send
	e := newEngine(t, zc.Config{Backend: b, Queues: 1, RecvBufSize: 1024, Debug: zc.DebugOptions{Buffers: true, HeldData: time.Hour}})
	bad := make(chan error, 1)
	nc := serveOne(t, e, func() zc.Handler {
		var r Reader
		frames := 0
		return zc.HandlerFuncs{
			Data: func(c *zc.Conn, d zc.Data) {
				r.Push(d)
				var hdr [4]byte
				for r.Peek(hdr[:]) == 4 {
					n := int(binary.BigEndian.Uint32(hdr[:]))
					if r.Len() < 4+n {
						return
					}
					frames++
					if s := r.Span(); frames%5 == 4 && len(s) >= 4+n {
						// the whole frame in the first buffer: read in place (a copy
						// into the reply), then skipped
						if !bytes.Equal(s[:4], hdr[:]) {
							bad <- errors.New("Span differs from Peek")
							return
						}
						c.Write(s[:4+n])
						r.Skip(4 + n)
						continue
					}
					if frames%3 == 0 {
						// header and payload apart: Skip, then Next of the payload,
						// echoing a header of our own
						r.Skip(4)
						m, err := r.Next(n)
						if err != nil || m.Len() != n {
							bad <- err
							return
						}
						c.Write(hdr[:])
						if err := m.SendTo(c); err != nil {
							bad <- err
						}
						continue
					}
					m, err := r.Next(4 + n)
					if err != nil {
						bad <- err
						return
					}
					if err := m.SendTo(c); err != nil {
						bad <- err
					}
				}
			},
			Close: func(c *zc.Conn, err error) { r.Release() },
		}
	})
	rng := rand.New(rand.NewPCG(1, 2))
	var stream []byte
	for len(stream) < 1<<20 {
		n := rng.IntN(5000)
		stream = binary.BigEndian.AppendUint32(stream, uint32(n))
		for i := 0; i < n; i++ {
			stream = append(stream, byte(rng.Uint32()))
		}
	}
	go func() {
		for p := stream; len(p) > 0; {
			k := min(len(p), 1+rng.IntN(3000))
			if _, err := nc.Write(p[:k]); err != nil {
				return
			}
			p = p[k:]
		}
	}()
	got := make([]byte, len(stream))
	nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	done := make(chan error, 1)
	go func() { _, err := io.ReadFull(nc, got); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case err := <-bad:
		t.Fatal(err)
	}
	if !bytes.Equal(got, stream) {
		i := 0
		for got[i] == stream[i] {
			i++
		}
		t.Fatalf("echo differs at byte %d of %d", i, len(stream))
	}
	st := e.Stats()
	t.Logf("shared %d bytes in %d sends, copied %d", st.Send.BytesShared, st.Send.SharedSends, st.Send.BytesDataCopied)
	if st.Debug.Misuses != 0 {
		t.Errorf("Debug reported %d misuses", st.Debug.Misuses)
	}
	if st.Send.BytesDataCopied != 0 || st.Send.BytesShared == 0 { // Write copies, but not Data
		t.Errorf("shared %d, copied %d", st.Send.BytesShared, st.Send.BytesDataCopied)
	}
}

func TestReaderMisuse(t *testing.T) {
	var r Reader
	if err := r.Skip(1); !errors.Is(err, zc.ErrInvalid) {
		t.Errorf("Skip past the end = %v", err)
	}
	if _, err := r.Next(1); !errors.Is(err, zc.ErrInvalid) {
		t.Errorf("Next past the end = %v", err)
	}
	if _, err := r.Next(0); !errors.Is(err, zc.ErrEmpty) {
		t.Errorf("Next(0) = %v", err)
	}
	if s := r.Span(); s != nil {
		t.Errorf("Span of an empty Reader = %q", s)
	}
	if _, err := (zc.Data{}).Slice(1, 1); !errors.Is(err, zc.ErrInvalid) {
		t.Errorf("Slice out of range = %v", err)
	}
	// A pushed Data released behind the Reader's back: Span says nothing is there instead
	// of slicing a nil buffer. The Data is a real one, 100 bytes received by a handler.
	e := newEngine(t, zc.Config{Backend: zc.BackendPlain, Queues: 1})
	got := make(chan zc.Data, 1)
	nc := serveOne(t, e, func() zc.Handler {
		return zc.HandlerFuncs{Data: func(c *zc.Conn, d zc.Data) { got <- d }}
	})
	if _, err := nc.Write(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	var d zc.Data
	select {
	case d = <-got:
	case <-time.After(time.Minute):
		t.Fatal("no Data in a minute")
	}
	r.Push(d)
	if err := r.Skip(min(10, d.Len()-1)); err != nil {
		t.Fatal(err)
	}
	d.Release()
	if s := r.Span(); s != nil {
		t.Errorf("Span over a released Data = %d bytes", len(s))
	}
	r.Release()
}
