package zc_test

// The calls a user of the public API (written from README.md and `go doc ./zc` alone) gets
// wrong: each answered with a typed error or correct behaviour.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/zcnet/zcnet/zc"
)

// TestPublicAPIMisuse: the calls a user gets wrong, each answered with a typed error or
// correct behaviour.
func TestPublicAPIMisuse(t *testing.T) {
	eachBackend(t, func(t *testing.T, b zc.Backend) {
		checkLeaks(t)
		e := userEngine(t, zc.Config{Queues: 1, Backend: b, NoFallback: true})
		buf := make([]byte, 16)

		t.Run("not readself", func(t *testing.T) {
			c, _ := probePair(t, e, false)
			_, err := c.Read(buf)
			probeIs(t, "Read", err, zc.ErrInvalid)
			probeIs(t, "SetReadDeadline", c.SetReadDeadline(time.Now()), zc.ErrInvalid)
			probeIs(t, "SetWriteDeadline", c.SetWriteDeadline(time.Now().Add(time.Hour)), nil)
		})

		t.Run("on the queue", func(t *testing.T) {
			c, p := probePair(t, e, true)
			type res struct {
				n   int
				err error
				rf  error
			}
			got := make(chan res, 3)
			onQueue := func() {
				n, err := c.Read(buf)
				_, rf := c.ReadFrom(bytes.NewReader([]byte("x")))
				got <- res{n, err, rf}
			}
			probeIs(t, "Post", c.Post(onQueue), nil)
			if _, err := c.AfterFunc(time.Millisecond, onQueue); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 2; i++ {
				var r res
				within(t, "posted Read", func() { r = <-got })
				probeIs(t, "Read on the queue", r.err, zc.ErrWouldBlock)
				probeIs(t, "ReadFrom on the queue", r.rf, zc.ErrInvalid)
			}
			// With bytes waiting, a Read on the queue takes them.
			p.Write([]byte("abc"))
			time.Sleep(20 * time.Millisecond)
			probeIs(t, "Post", c.Post(onQueue), nil)
			var r res
			within(t, "posted Read", func() { r = <-got })
			if r.err != nil || string(buf[:r.n]) != "abc" {
				t.Errorf("Read on the queue with bytes waiting: %q, %v", buf[:r.n], r.err)
			}
			if c.OnQueue() {
				t.Error("OnQueue on the test goroutine")
			}
			// From an accept function, and from another connection's OnData.
			ln, err := e.Listen("tcp", "127.0.0.1:0",
				func(a *zc.Conn) zc.Handler {
					n, err := a.Read(buf)
					_, rf := a.ReadFrom(bytes.NewReader([]byte("x")))
					got <- res{n, err, rf}
					a.Close()
					return zc.HandlerFuncs{}
				}, zc.ListenOptions{ReadSelf: true})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			_, ep := probePairH(t, e, false, zc.HandlerFuncs{Data: func(_ *zc.Conn, d zc.Data) {
				d.Release()
				onQueue()
			}})
			ep.Write([]byte("go"))
			pc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			for i := 0; i < 2; i++ {
				var r res
				within(t, "Read in a handler", func() { r = <-got })
				probeIs(t, "Read in a handler", r.err, zc.ErrWouldBlock)
				probeIs(t, "ReadFrom in a handler", r.rf, zc.ErrInvalid)
			}
		})

		t.Run("readself refusals", func(t *testing.T) {
			c, p := probePair(t, e, true)
			err := c.SetReceivePaused(true)
			t.Logf("SetReceivePaused on ReadSelf: %v", err)
			err = c.SetHandler(zc.HandlerFuncs{})
			t.Logf("SetHandler on ReadSelf: %v", err)
			probeIs(t, "SetHandler(nil)", c.SetHandler(nil), zc.ErrInvalid)
			// SendFile sends on a ReadSelf connection like on any other.
			f, err := os.CreateTemp(t.TempDir(), "f")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			f.WriteString("file bytes")
			probeIs(t, "SendFile", c.SendFile(f, 0, 10), nil)
			p.SetReadDeadline(time.Now().Add(userBound))
			got := make([]byte, 10)
			if _, err := io.ReadFull(p, got); err != nil || string(got) != "file bytes" {
				t.Errorf("SendFile on ReadSelf: %q, %v", got, err)
			}
			// Reading still works after those.
			p.Write([]byte("after"))
			c.SetReadDeadline(time.Now().Add(userBound))
			n, err := io.ReadFull(c, buf[:5])
			if err != nil || string(buf[:n]) != "after" {
				t.Errorf("Read after the refusals: %q, %v", buf[:n], err)
			}
			// Relay is refused (the application reads c) and changes nothing: both stay
			// open until closed.
			c2, _ := probePair(t, e, false)
			_, err = zc.Relay(c, c2)
			probeIs(t, "Relay", err, zc.ErrInvalid)
			select {
			case <-c.Done():
				t.Error("a refused Relay closed the ReadSelf connection")
			case <-c2.Done():
				t.Error("a refused Relay closed the other connection")
			default:
			}
			c.Close()
			c2.Close()
			within(t, "closes", func() { <-c.Done(); <-c2.Done() })
		})

		t.Run("closewrite", func(t *testing.T) {
			// Our side half-closed: the peer sees EOF, and what it sends is still read.
			c, p := probePair(t, e, true)
			probeIs(t, "CloseWrite", c.CloseWrite(), nil)
			p.SetReadDeadline(time.Now().Add(userBound))
			if n, err := p.Read(buf); n != 0 || err != io.EOF {
				t.Errorf("peer after CloseWrite: %d, %v", n, err)
			}
			p.Write([]byte("late"))
			p.Close()
			c.SetReadDeadline(time.Now().Add(userBound))
			got, err := io.ReadAll(c)
			if err != nil || string(got) != "late" {
				t.Errorf("Read after CloseWrite: %q, %v", got, err)
			}
			_, err = c.Write([]byte("x"))
			if err == nil {
				t.Error("Write after CloseWrite succeeded")
			}
			t.Logf("Write after CloseWrite: %v", err)
		})

		t.Run("nil and zero", func(t *testing.T) {
			c, p := probePair(t, e, true)
			n, err := c.Read(nil)
			if n != 0 || err != nil {
				t.Errorf("Read(nil): %d, %v", n, err)
			}
			n, err = c.Read(buf[:0])
			if n != 0 || err != nil {
				t.Errorf("Read(empty): %d, %v", n, err)
			}
			var rn int64
			within(t, "ReadFrom(nil)", func() { rn, err = c.ReadFrom(nil) })
			probeIs(t, "ReadFrom(nil)", err, zc.ErrInvalid)
			_ = rn
			within(t, "ReadFrom(empty)", func() { rn, err = c.ReadFrom(bytes.NewReader(nil)) })
			if rn != 0 || err != nil {
				t.Errorf("ReadFrom(empty): %d, %v", rn, err)
			}
			var nilFile *os.File
			within(t, "ReadFrom(nil file)", func() { rn, err = c.ReadFrom(nilFile) })
			t.Logf("ReadFrom((*os.File)(nil)): %d, %v", rn, err)
			n, err = c.Write(nil)
			if n != 0 || err != nil {
				t.Errorf("Write(nil): %d, %v", n, err)
			}
			c.Wake(nil) // a nil channel: nothing to wake, must not block
			probeIs(t, "AfterFunc(nil)", func() error { _, err := c.AfterFunc(0, nil); return err }(), zc.ErrInvalid)
			// Nothing above sent or lost a byte.
			c.Write([]byte("end"))
			p.SetReadDeadline(time.Now().Add(userBound))
			got := make([]byte, 3)
			if _, err := io.ReadFull(p, got); err != nil || string(got) != "end" {
				t.Errorf("the stream after the nil calls: %q, %v", got, err)
			}
		})

		t.Run("deadlines", func(t *testing.T) {
			c, p := probePair(t, e, true)
			for _, d := range []time.Time{time.Unix(0, 0), time.Unix(1, 0), time.Now().Add(-time.Hour), time.Time{}.Add(1)} {
				c.SetReadDeadline(d)
				var err error
				within(t, "Read past deadline", func() { _, err = c.Read(buf) })
				probeIs(t, fmt.Sprintf("Read with the deadline %v", d), err, os.ErrDeadlineExceeded)
				c.SetWriteDeadline(d)
				_, err = c.Write([]byte("x"))
				probeIs(t, fmt.Sprintf("Write with the deadline %v", d), err, os.ErrDeadlineExceeded)
				within(t, "ReadFrom past deadline", func() { _, err = c.ReadFrom(bytes.NewReader([]byte("y"))) })
				probeIs(t, fmt.Sprintf("ReadFrom with the deadline %v", d), err, os.ErrDeadlineExceeded)
			}
			for _, d := range []time.Time{time.Unix(1<<62, 0), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), {}} {
				c.SetReadDeadline(d)
				c.SetWriteDeadline(d)
				p.Write([]byte("z"))
				var n int
				var err error
				within(t, "Read far deadline", func() { n, err = c.Read(buf) })
				if n != 1 || err != nil {
					t.Errorf("Read with the deadline %v: %d, %v", d, n, err)
				}
				if _, err := c.Write([]byte("w")); err != nil {
					t.Errorf("Write with the deadline %v: %v", d, err)
				}
			}
			p.SetReadDeadline(time.Now().Add(userBound))
			got := make([]byte, 3)
			if _, err := io.ReadFull(p, got); err != nil || string(got) != "www" {
				t.Errorf("the peer got %q, %v; want www (nothing written after a passed deadline)", got, err)
			}
			// A deadline moved while a Read waits.
			c.SetReadDeadline(time.Now().Add(time.Hour))
			go func() {
				time.Sleep(50 * time.Millisecond)
				c.SetReadDeadline(time.Now())
			}()
			var err error
			within(t, "Read with a moved deadline", func() { _, err = c.Read(buf) })
			probeIs(t, "Read with a moved deadline", err, os.ErrDeadlineExceeded)
		})

		t.Run("concurrent reads", func(t *testing.T) {
			c, p := probePair(t, e, true)
			const total = 1 << 20
			var hist [2][256]int
			var counts [2]int
			var wg sync.WaitGroup
			for r := 0; r < 2; r++ {
				wg.Add(1)
				go func(r int) {
					defer wg.Done()
					b := make([]byte, 1000+r*333)
					for {
						n, err := c.Read(b)
						for _, x := range b[:n] {
							hist[r][x]++
						}
						counts[r] += n
						if err != nil {
							return
						}
					}
				}(r)
			}
			want := make([]byte, total)
			for i := range want {
				want[i] = byte(i)
			}
			go func() {
				p.Write(want)
				p.(*net.TCPConn).CloseWrite()
			}()
			within(t, "concurrent reads", wg.Wait)
			if counts[0]+counts[1] != total {
				t.Fatalf("read %d+%d bytes, want %d", counts[0], counts[1], total)
			}
			for x := 0; x < 256; x++ {
				if hist[0][x]+hist[1][x] != total/256 {
					t.Fatalf("byte %d read %d times, want %d", x, hist[0][x]+hist[1][x], total/256)
				}
			}
		})

		t.Run("read and close", func(t *testing.T) {
			c, _ := probePair(t, e, true)
			var err error
			go func() {
				time.Sleep(50 * time.Millisecond)
				c.Close()
			}()
			within(t, "Read during Close", func() { _, err = c.Read(buf) })
			probeIs(t, "Read during Close", err, zc.ErrClosed)
			_, err = c.Read(buf)
			probeIs(t, "Read after Close", err, zc.ErrClosed)
			_, err = c.ReadFrom(bytes.NewReader([]byte("x")))
			probeIs(t, "ReadFrom after Close", err, zc.ErrClosed)
			_, err = c.Write([]byte("x"))
			probeIs(t, "Write after Close", err, zc.ErrClosed)
			probeIs(t, "SetReadDeadline after Close", c.SetReadDeadline(time.Now()), zc.ErrClosed)
			probeIs(t, "SetWriteDeadline after Close", c.SetWriteDeadline(time.Now()), zc.ErrClosed)
			probeIs(t, "second Close", c.Close(), zc.ErrClosed)
		})

		t.Run("write waits and close", func(t *testing.T) {
			// A ReadFrom and a Write waiting for a peer that does not read end at Close.
			c, _ := probePair(t, e, true)
			big := make([]byte, 64<<20)
			var werr, rerr error
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); _, werr = c.Write(big) }()
			go func() { defer wg.Done(); _, rerr = c.ReadFrom(bytes.NewReader(big)) }()
			time.Sleep(100 * time.Millisecond)
			c.Close()
			within(t, "writers at Close", wg.Wait)
			probeIs(t, "Write at Close", werr, zc.ErrClosed)
			probeIs(t, "ReadFrom at Close", rerr, zc.ErrClosed)
		})

		t.Run("after engine close", func(t *testing.T) {
			e2 := userEngine(t, zc.Config{Queues: 1, Backend: b, NoFallback: true})
			c, p := probePair(t, e2, true)
			p.Write([]byte("kept"))
			time.Sleep(20 * time.Millisecond)
			var rerr error
			blocked := make(chan struct{})
			c2, _ := probePair(t, e2, true)
			go func() {
				defer close(blocked)
				_, rerr = c2.Read(buf)
			}()
			time.Sleep(20 * time.Millisecond)
			within(t, "Engine.Close", func() { e2.Close() })
			within(t, "Read at Engine.Close", func() { <-blocked })
			probeIs(t, "Read waiting at Engine.Close", rerr, zc.ErrClosed)
			n, err := io.ReadFull(c, buf[:4])
			if string(buf[:n]) != "kept" {
				t.Errorf("Read after Engine.Close: %q, %v; want what had arrived", buf[:n], err)
			}
			_, err = c.Read(buf)
			probeIs(t, "Read after that", err, zc.ErrClosed)
			_, err = c.ReadFrom(bytes.NewReader([]byte("x")))
			probeIs(t, "ReadFrom after Engine.Close", err, zc.ErrClosed)
			_, err = c.Write([]byte("x"))
			probeIs(t, "Write after Engine.Close", err, zc.ErrClosed)
			probeIs(t, "Post after Engine.Close", c.Post(func() {}), zc.ErrClosed)
			_, err = c.AfterFunc(time.Millisecond, func() {})
			probeIs(t, "AfterFunc after Engine.Close", err, zc.ErrClosed)
			c.Wake(make(chan struct{}, 1))
			_ = c.OnQueue()
			t.Logf("SetReadDeadline after Engine.Close: %v", c.SetReadDeadline(time.Now()))
			_, err = e2.Dial(context.Background(), "tcp", "127.0.0.1:1", zc.HandlerFuncs{}, zc.DialOptions{ReadSelf: true})
			probeIs(t, "Dial with options after Engine.Close", err, zc.ErrClosed)
			_, err = e2.Listen("tcp", "127.0.0.1:0", func(*zc.Conn) zc.Handler { return nil }, zc.ListenOptions{ReadSelf: true})
			probeIs(t, "Listen with options after Engine.Close", err, zc.ErrClosed)
		})
	})
}
