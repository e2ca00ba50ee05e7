package netconn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zcnet/zcnet/zc"
)

// pattern fills p with bytes that depend on seed and position (a shifted or scribbled byte
// shows).
func pattern(p []byte, seed int) {
	for i := range p {
		p[i] = byte(i*7 + seed*13 + i>>11)
	}
}

// scribble overwrites p: what the peer still gets from it after this is wrong.
func scribble(p []byte) {
	for i := range p {
		p[i] = 0xEE
	}
}

// refEngine is an engine of backend b whose graceful closes give up quickly on a peer that
// does not read (the deadline and close tests).
func refEngine(t *testing.T, b zc.Backend) *zc.Engine {
	return newEngine(t, zc.Config{Backend: b, CloseTimeout: 300 * time.Millisecond, CloseStall: 300 * time.Millisecond})
}

// TestWriteRefNotBeforeDone: a large Write is sent from the caller's slice (BytesApp) and
// returns only when the kernel is done with it: the slice is scribbled the moment Write
// returns, and the peer, which starts reading late, must still see the original bytes.
func TestWriteRefNotBeforeDone(t *testing.T) {
	for _, b := range lifetimeBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := newEngine(t, zc.Config{Backend: b})
			peer, nc := netAccepted(t, e, Options{})
			sizes := []int{refWriteMin, refWriteMin + 1, 300 << 10, 2 << 20, refWriteMin - 1, 100}
			total := 0
			for _, n := range sizes {
				total += n
			}
			got := make(chan []byte, 1)
			go func() {
				time.Sleep(50 * time.Millisecond) // let Write's bytes sit in the queue
				buf := make([]byte, total)
				k, _ := io.ReadFull(peer, buf)
				got <- buf[:k]
			}()
			want := make([]byte, 0, total)
			before := e.Stats().Send.BytesApp
			refBytes := 0
			for i, n := range sizes {
				p := make([]byte, n)
				pattern(p, i)
				want = append(want, p...)
				k, err := nc.Write(p)
				if err != nil || k != n {
					t.Fatalf("Write(%d) = %d, %v", n, k, err)
				}
				scribble(p)
				if n >= refWriteMin {
					refBytes += n
				}
			}
			b := waitHang(t, got, "peer read", func() string { return engineDump(e) })
			if len(b) != total {
				t.Fatalf("peer got %d of %d bytes", len(b), total)
			}
			if i := firstDiff(b, want); i >= 0 {
				t.Fatalf("byte %d: got %#x, want %#x (Write returned before the kernel was done with the slice?)", i, b[i], want[i])
			}
			if app := e.Stats().Send.BytesApp - before; app < uint64(refBytes) {
				t.Fatalf("BytesApp %d, want at least %d: large Writes were not sent from the caller's slice", app, refBytes)
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestWriteRefConcurrent: Writes from several goroutines, small (copied) and large (from the
// slice) mixed, each a record (writer, sequence, length, pattern): every record arrives
// whole, each writer's in order, and every slice is scribbled as soon as its Write returns.
// Some records go as WriteBuffers (header and two body parts), some through net.Buffers.WriteTo.
func TestWriteRefConcurrent(t *testing.T) {
	for _, b := range lifetimeBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := newEngine(t, zc.Config{Backend: b})
			peer, nc := netAccepted(t, e, Options{})
			const writers, each = 4, 12
			sizeOf := func(w, i int) int {
				switch (w + i) % 4 {
				case 0:
					return 40
				case 1:
					return 3000
				case 2:
					return refWriteMin + 17*i
				}
				return 256<<10 + w
			}
			total := 0
			for w := range writers {
				for i := range each {
					total += 12 + sizeOf(w, i)
				}
			}
			errc := make(chan error, 1)
			go func() {
				next := make([]int, writers)
				hdr := make([]byte, 12)
				for got := 0; got < total; {
					if _, err := io.ReadFull(peer, hdr); err != nil {
						errc <- err
						return
					}
					w, i, n := int(binary.BigEndian.Uint32(hdr)), int(binary.BigEndian.Uint32(hdr[4:])), int(binary.BigEndian.Uint32(hdr[8:]))
					if w >= writers || i != next[w] || n != sizeOf(w, i) {
						errc <- errors.New("record out of order or torn")
						return
					}
					next[w]++
					body := make([]byte, n)
					if _, err := io.ReadFull(peer, body); err != nil {
						errc <- err
						return
					}
					want := make([]byte, n)
					pattern(want, w*100+i)
					if !bytes.Equal(body, want) {
						errc <- errors.New("record body differs (a slice written before the kernel was done, or interleaved)")
						return
					}
					got += 12 + n
				}
				errc <- nil
			}()
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						n := sizeOf(w, i)
						p := make([]byte, 12+n)
						binary.BigEndian.PutUint32(p, uint32(w))
						binary.BigEndian.PutUint32(p[4:], uint32(i))
						binary.BigEndian.PutUint32(p[8:], uint32(n))
						pattern(p[12:], w*100+i)
						var err error
						switch i % 3 {
						case 2:
							// A record as net.Buffers: header and body in one write.
							bufs := net.Buffers{p[:12], p[12 : 12+n/2], p[12+n/2:]}
							_, err = nc.(Conn).WriteBuffers(&bufs)
							if err == nil && len(bufs) != 0 {
								t.Errorf("WriteBuffers left %d buffers", len(bufs))
							}
						case 1:
							// net.Buffers.WriteTo: one Write per buffer, so only one
							// buffer here (another writer may come between two).
							bufs := net.Buffers{p}
							_, err = bufs.WriteTo(nc)
						default:
							_, err = nc.Write(p)
						}
						if err != nil {
							t.Errorf("writer %d record %d: %v", w, i, err)
							return
						}
						scribble(p)
					}
				}()
			}
			wg.Wait()
			if err := waitHang(t, errc, "peer read", func() string { return engineDump(e) }); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWriteRefDeadline: a large Write to a peer that does not read, with a write deadline:
// Write returns os.ErrDeadlineExceeded (Timeout) only after the kernel let go of the slice
// (the connection is closed for it: the slice is scribbled at once and the peer must see
// only original bytes), and the face is closed afterwards. A Write after the deadline
// fails at once and sends nothing.
func TestWriteRefDeadline(t *testing.T) {
	for _, b := range lifetimeBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := refEngine(t, b)
			peer, nc := netAccepted(t, e, Options{})
			p := make([]byte, 16<<20) // more than the socket buffers take
			pattern(p, 3)
			want := bytes.Clone(p)
			nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			res := make(chan error, 1)
			go func() {
				k, err := nc.Write(p)
				if k != 0 && k != len(p) {
					t.Errorf("Write = %d", k)
				}
				scribble(p)
				res <- err
			}()
			err := waitHang(t, res, "Write past its deadline", func() string { return engineDump(e) })
			var ne net.Error
			if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("Write: %v, want os.ErrDeadlineExceeded", err)
			}
			// The peer now reads what reached it: the original bytes only.
			peer.SetReadDeadline(time.Now().Add(hangBound))
			got, _ := io.ReadAll(peer)
			if len(got) == len(p) {
				t.Fatalf("the peer got everything: the deadline did not bound the Write")
			}
			if i := firstDiff(got, want[:len(got)]); i >= 0 {
				t.Fatalf("byte %d of %d differs: Write returned before the kernel let go of the slice", i, len(got))
			}
			if _, err := nc.Write(p); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Write after the deadline closed the face: %v, want net.ErrClosed", err)
			}
		})
	}
}

// TestWriteRefAfterDeadline: a large Write that starts after the write deadline passed
// fails at once (nothing queued, the connection stays open), as Go's net does.
func TestWriteRefAfterDeadline(t *testing.T) {
	for _, b := range lifetimeBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := newEngine(t, zc.Config{Backend: b})
			peer, nc := netAccepted(t, e, Options{})
			p := make([]byte, refWriteMin)
			nc.SetWriteDeadline(time.Now().Add(-time.Second))
			if k, err := nc.Write(p); k != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("Write after the deadline = %d, %v", k, err)
			}
			nc.SetWriteDeadline(time.Time{})
			pattern(p, 9)
			want := bytes.Clone(p)
			got := make(chan []byte, 1)
			go func() { // a large Write waits for the kernel: read meanwhile
				b := make([]byte, len(p))
				k, _ := io.ReadFull(peer, b)
				got <- b[:k]
			}()
			if k, err := nc.Write(p); k != len(p) || err != nil {
				t.Fatalf("Write with the deadline cleared = %d, %v", k, err)
			}
			if b := waitHang(t, got, "peer read", nil); !bytes.Equal(b, want) {
				t.Fatalf("peer got %d bytes, equal %v", len(b), bytes.Equal(b, want))
			}
		})
	}
}

// TestWriteRefCloseWhileWaiting: a large Write waits on a peer that does not read; the face
// is closed (graceful: it gives up on the stalled peer) or the peer resets. Write returns
// an error once the slice is released (scribbled at once: the peer sees original bytes
// only), and nothing stays pinned.
func TestWriteRefCloseWhileWaiting(t *testing.T) {
	for _, b := range lifetimeBackends {
		for _, how := range []string{"close", "reset"} {
			t.Run(b.String()+"/"+how, func(t *testing.T) {
				e := refEngine(t, b)
				peer, nc := netAccepted(t, e, Options{})
				p := make([]byte, 16<<20)
				pattern(p, 5)
				want := bytes.Clone(p)
				res := make(chan error, 1)
				go func() {
					_, err := nc.Write(p)
					scribble(p)
					res <- err
				}()
				// Wait until the kernel holds what it can take and the rest is queued.
				for deadline := time.Now().Add(hangBound); nc.(Conn).Zc().Queued() == 0; {
					if time.Now().After(deadline) {
						t.Fatal("nothing queued")
					}
					time.Sleep(time.Millisecond)
				}
				var got []byte
				switch how {
				case "close":
					if err := nc.Close(); err != nil {
						t.Fatal(err)
					}
				case "reset":
					peer.(*net.TCPConn).SetLinger(0)
					peer.Close()
				}
				err := waitHang(t, res, "Write during "+how, func() string { return engineDump(e) })
				if err == nil {
					t.Fatalf("Write returned nil: the peer never read 16 MiB")
				}
				if how == "close" {
					peer.SetReadDeadline(time.Now().Add(hangBound))
					got, _ = io.ReadAll(peer)
					if i := firstDiff(got, want[:len(got)]); i >= 0 {
						t.Fatalf("byte %d of %d differs", i, len(got))
					}
				}
				t.Logf("%s: Write: %v (peer got %d bytes)", how, err, len(got))
			})
		}
	}
}

// BenchmarkFaceWrite: the face's Write of size bytes to a Go net peer that drains, with the
// slice sent by reference (ref: waits for the kernel) or copied (copy: zc.Conn.Write,
// written directly when the socket takes it); cpu-µs/op is the process's CPU (both sides:
// the peer's share is the same in both). For choosing refWriteMin.
func BenchmarkFaceWrite(b *testing.B) {
	for _, size := range []int{16 << 10, 60 << 10, 256 << 10, 1 << 20, 4 << 20} {
		for _, mode := range []string{"copy", "ref"} {
			b.Run(fmt.Sprintf("%s/%dK", mode, size>>10), func(b *testing.B) {
				e := newEngine(b, zc.Config{Backend: zc.BackendIOUring, SendBufs: 256})
				ln, err := Listen(e, "tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				defer ln.Close()
				peer, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				defer peer.Close()
				nc, err := ln.Accept()
				if err != nil {
					b.Fatal(err)
				}
				defer nc.Close()
				go io.Copy(io.Discard, peer)
				old := refWriteMin
				defer func() { refWriteMin = old }()
				if mode == "ref" {
					refWriteMin = 1
				} else {
					refWriteMin = 1 << 40
				}
				p := make([]byte, size)
				var ru0, ru1 syscall.Rusage
				syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
				b.SetBytes(int64(size))
				b.ResetTimer()
				for range b.N {
					if _, err := nc.Write(p); err != nil {
						b.Fatal(err)
					}
				}
				for nc.(Conn).Zc().Queued() > 0 {
					time.Sleep(100 * time.Microsecond)
				}
				b.StopTimer()
				syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
				cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
			})
		}
	}
}

// TestWriteBuffers: WriteBuffers sends every buffer in order (empty ones too), consumes v,
// refuses a nil v with zc.ErrInvalid, and after Close fails with net.ErrClosed, sending
// nothing.
func TestWriteBuffers(t *testing.T) {
	for _, b := range lifetimeBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := newEngine(t, zc.Config{Backend: b})
			peer, nc := netAccepted(t, e, Options{})
			sizes := []int{0, 10, refWriteMin, 0, 5000, refWriteMin + 3, 1}
			var v net.Buffers
			var want []byte
			for i, n := range sizes {
				p := make([]byte, n)
				pattern(p, i)
				v = append(v, p)
				want = append(want, p...)
			}
			keep := v
			gotc := make(chan []byte, 1)
			go func() { // large buffers wait for the kernel: read meanwhile
				b := make([]byte, len(want))
				k, _ := io.ReadFull(peer, b)
				gotc <- b[:k]
			}()
			k, err := nc.(Conn).WriteBuffers(&v)
			if err != nil || k != int64(len(want)) || len(v) != 0 {
				t.Fatalf("WriteBuffers = %d, %v, %d buffers left", k, err, len(v))
			}
			for _, p := range keep {
				scribble(p)
			}
			got := waitHang(t, gotc, "peer read", nil)
			if i := firstDiff(got, want); i >= 0 {
				t.Fatalf("byte %d differs", i)
			}
			var empty net.Buffers
			if k, err := nc.(Conn).WriteBuffers(&empty); k != 0 || err != nil {
				t.Fatalf("WriteBuffers(empty) = %d, %v", k, err)
			}
			// A nil *net.Buffers is a typed refusal, not a nil dereference.
			var ope *net.OpError
			if k, err := nc.(Conn).WriteBuffers(nil); k != 0 || !errors.Is(err, zc.ErrInvalid) || !errors.As(err, &ope) {
				t.Fatalf("WriteBuffers(nil) = %d, %v, want a *net.OpError matching zc.ErrInvalid", k, err)
			}
			nc.Close()
			v = net.Buffers{make([]byte, 10)}
			if k, err := nc.(Conn).WriteBuffers(&v); k != 0 || !errors.Is(err, net.ErrClosed) || len(v) != 1 {
				t.Fatalf("WriteBuffers after Close = %d, %v, %d buffers left", k, err, len(v))
			}
		})
	}
}
