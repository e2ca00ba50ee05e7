package netconn

import (
	"github.com/zcnet/zcnet/zc"

	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
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
	for _, b := range []zc.Backend{zc.BackendIOUring, zc.BackendPlain} {
		t.Run(b.String(), func(t *testing.T) {
			mk := netPipe(t, smallCfg(b), Options{})
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
					ev, _ := engines.Load(c1)
					e := ev.(*zc.Engine)
					before := e.Stats().Send.BytesSpliced
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
					if err := c1.(Conn).CloseWrite(); err != nil {
						t.Fatal(err)
					}
					g := <-got
					if sha256.Sum256(g) != sha256.Sum256(want[:n]) {
						t.Fatalf("received %d bytes, differ from the %d sent", len(g), n)
					}
					spliced := e.Stats().Send.BytesSpliced - before
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
	c1, c2, stop, err := netPipe(t, smallCfg(zc.BackendIOUring), Options{})()
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

// A sendfile into a peer that does not read waits for room (in Go's poller on a direct
// connection, in poll(2) on a ring one) and ends at the write deadline, or at Close, with
// the bytes sent so far counted.
func TestNetConnSendfileStalled(t *testing.T) {
	file := filepath.Join(t.TempDir(), "big")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil { // sparse: sendfile reads zero pages
		t.Fatal(err)
	}
	f.Close()
	for _, ring := range []bool{false, true} {
		for _, how := range []string{"deadline", "Close"} {
			name := "direct/" + how
			if ring {
				name = "ring/" + how
			}
			t.Run(name, func(t *testing.T) {
				c1, _, stop, err := netPipe(t, smallCfg(zc.BackendIOUring), Options{Ring: ring})()
				if err != nil {
					t.Fatal(err)
				}
				defer stop()
				src, err := os.Open(file)
				if err != nil {
					t.Fatal(err)
				}
				defer src.Close()
				if how == "deadline" {
					c1.SetWriteDeadline(timeNow().Add(300 * timeMillisecond))
				} else {
					go func() {
						time.Sleep(300 * time.Millisecond)
						c1.Close()
					}()
				}
				type result struct {
					n   int64
					err error
				}
				done := make(chan result, 1)
				go func() {
					n, err := io.Copy(c1, src)
					done <- result{n, err}
				}()
				r := waitHang(t, done, "sendfile into a stalled peer", func() string { return "" })
				if r.n <= 0 || r.n >= 1<<30 {
					t.Errorf("sent %d bytes into a peer that does not read", r.n)
				}
				switch how {
				case "deadline":
					if !os.IsTimeout(r.err) {
						t.Fatalf("sendfile past the write deadline: %v, want a timeout", r.err)
					}
				case "Close":
					if !errors.Is(r.err, net.ErrClosed) {
						t.Fatalf("sendfile when the connection closed: %v, want net.ErrClosed", r.err)
					}
				}
			})
		}
	}
}

// Many stalled sendfiles on direct connections wait in Go's poller, not on threads: no
// thread of the process sleeps in poll(2) for them (on the ring path each waits there on a
// thread of its own).
func TestNetConnSendfileNoThreadPerWait(t *testing.T) {
	file := filepath.Join(t.TempDir(), "big")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// (With Options.Ring on the server, 48 of the process's threads sat in poll(2).)
	srv, cli := newEngine(t, smallCfg(zc.BackendIOUring)), newEngine(t, smallCfg(zc.BackendIOUring))
	ln, err := Listen(srv, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const conns = 48
	for i := 0; i < conns; i++ {
		c, err := Dial(context.Background(), cli, "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close() // never read: the senders stall
	}
	// Threads asleep in poll(2)/ppoll(2), by the kernel function they wait in.
	inPoll := func() (n, all int) {
		tasks, _ := os.ReadDir("/proc/self/task")
		for _, task := range tasks {
			w, _ := os.ReadFile("/proc/self/task/" + task.Name() + "/wchan")
			if bytes.HasPrefix(w, []byte("poll_schedule_timeout")) || bytes.HasPrefix(w, []byte("do_sys_poll")) {
				n++
			}
		}
		return n, len(tasks)
	}
	polling0, _ := inPoll()
	done := make(chan error, conns)
	var srvConns []net.Conn
	for i := 0; i < conns; i++ {
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		srvConns = append(srvConns, c)
		go func() {
			src, err := os.Open(file)
			if err != nil {
				done <- err
				return
			}
			defer src.Close()
			_, err = io.Copy(c, src)
			done <- err
		}()
	}
	// Every sender has stalled once each waits somewhere: parked in Go's poller, or (the
	// regression this test is for) on a thread asleep in poll(2).
	var polling, threads int
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		polling, threads = inPoll()
		parked := ioWaiting("TestNetConnSendfileNoThreadPerWait")
		if parked+polling-polling0 >= conns {
			break
		}
		if time.Since(start) > 6*hangBound {
			t.Fatalf("of %d senders, %d wait in the poller and %d threads in poll(2) (%d before)", conns, parked, polling, polling0)
		}
	}
	for _, c := range srvConns {
		c.Close()
	}
	for i := 0; i < conns; i++ {
		if err := waitHang(t, done, "a stalled sendfile after Close", func() string { return "" }); !errors.Is(err, net.ErrClosed) {
			t.Errorf("stalled sendfile after Close: %v, want net.ErrClosed", err)
		}
	}
	if polling-polling0 >= conns/2 {
		t.Errorf("%d stalled sendfiles: %d threads in poll(2) (%d before), of %d", conns, polling, polling0, threads)
	}
	t.Logf("%d stalled sendfiles: %d of %d threads in poll(2) (%d before)", conns, polling, threads, polling0)
}
