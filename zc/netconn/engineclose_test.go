package netconn

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc"
)

// TestNetConnReadAfterEngineClose: unread data queued in a net.Conn when the engine closes is
// still read (also when the first buffer was partly read), then Read returns an error; no
// spin, no panic, bounded time.
func TestNetConnReadAfterEngineClose(t *testing.T) {
	for _, b := range lifetimeBackends {
		t.Run(b.String(), func(t *testing.T) {
			for _, ring := range []bool{false, true} {
				for _, partial := range []bool{false, true} {
					name := "direct"
					if ring {
						name = "ring"
					}
					if partial {
						name += "/partly-read"
					} else {
						name += "/unread"
					}
					t.Run(name, func(t *testing.T) {
						testNetConnReadAfterEngineClose(t, zc.Config{Backend: b, Queues: 1, NoPin: true}, Options{Ring: ring}, partial)
					})
				}
			}
		})
	}
}

func testNetConnReadAfterEngineClose(t *testing.T, cfg zc.Config, o Options, partial bool) {
	e, err := zc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, nc := netAccepted(t, e, o)
	msg := make([]byte, 200<<10) // several receive buffers
	direct := false
	if o.direct(e) {
		// Direct reads: "received" is what the socket holds, which is within its buffer.
		msg = msg[:60<<10]
		direct = true
	}
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	if _, err := s.Write(msg); err != nil {
		t.Fatal(err)
	}
	s.(*net.TCPConn).CloseWrite()
	// Wait until everything arrived: queued in the net.Conn (ring: the engine received it
	// all) or in the socket (direct reads).
	zconn := nc.(Conn).Zc()
	if nc.(*netConn).direct != direct {
		t.Fatalf("the connection reads directly: %v, the engine says %v", nc.(*netConn).direct, direct)
	}
	arrived := func() uint64 {
		if !direct {
			return zconn.Stats().BytesRecv
		}
		inq := 0
		zconn.Socket(func(s *tcpglue.Socket) error {
			return s.Control(func(fd int) error {
				var err error
				inq, err = unix.IoctlGetInt(fd, unix.SIOCINQ)
				return err
			})
		})
		return zconn.Stats().BytesRecv + uint64(inq)
	}
	deadline := time.Now().Add(hangBound)
	for arrived() < uint64(len(msg)) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d bytes arrived", arrived(), len(msg))
		}
		time.Sleep(5 * time.Millisecond)
	}
	var got []byte
	if partial {
		p := make([]byte, 100)
		n, err := nc.Read(p)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p[:n]...)
	}
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	if err := waitHang(t, closed, "Engine.Close", func() string { return "" }); err != nil {
		t.Fatal(err)
	}
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var data []byte
		p := make([]byte, 3000) // odd size: reads end inside buffers
		for i := 0; ; i++ {
			nc.SetReadDeadline(time.Now().Add(hangBound))
			n, err := nc.Read(p)
			data = append(data, p[:n]...)
			if err != nil || i > 10000 {
				done <- result{data, err}
				return
			}
		}
	}()
	r := waitHang(t, done, "NetConn.Read after Engine.Close", func() string { return "" })
	got = append(got, r.data...)
	if !bytes.Equal(got, msg) {
		t.Errorf("read %d of %d bytes after Engine.Close, equal %v", len(got), len(msg), bytes.Equal(got, msg))
	}
	if r.err == nil {
		t.Errorf("Read after the data ended: %v, want an error", r.err)
	}
	var ne net.Error
	if errors.As(r.err, &ne) && ne.Timeout() {
		t.Errorf("Read after Engine.Close ended by its deadline (%v): it should end with the connection", r.err)
	}
	if r.err != io.EOF && !errors.Is(r.err, zc.ErrClosed) {
		t.Logf("Read after the data: %v", r.err)
	}
	nc.Close()
}

// TestEngineCloseTimeoutNetConn: zc.Engine.Close's graceful close of a net.Conn face whose peer
// does not read gives up after CloseTimeout; zc.Engine.Close, a Read blocked meanwhile and a
// later Write say that bytes were dropped (zc.ErrCloseTimeout, matching net.ErrClosed too), on
// both receive paths of the face.
func TestEngineCloseTimeoutNetConn(t *testing.T) {
	for _, ring := range []bool{false, true} {
		name := "direct"
		if ring {
			name = "ring"
		}
		t.Run(name, func(t *testing.T) {
			e, err := zc.New(zc.Config{Queues: 1, CloseTimeout: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
				return errors.Join(err, serr)
			}}
			ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c, err := Options{Ring: ring}.Dial(context.Background(), e, "tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			peer, err := ln.Accept() // never reads
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			// A small send buffer: what the kernel cannot hold stays queued in the engine.
			if err := c.Zc().Socket(func(s *tcpglue.Socket) error { _, err := s.SetSendBuffer(4096); return err }); err != nil {
				t.Fatal(err)
			}
			// A large Write is sent from its slice and waits for the kernel (as Go's net's
			// does on a peer that does not read): Engine.Close's timed-out close ends it.
			const total = 1 << 20
			wrote := make(chan error, 1)
			go func() {
				_, err := c.Write(make([]byte, total))
				wrote <- err
			}()
			for deadline := time.Now().Add(time.Minute); c.Zc().Queued() == 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("nothing queued")
				}
			}
			read := make(chan error, 1)
			go func() {
				_, err := c.Read(make([]byte, 10))
				read <- err
			}()
			if err := e.Close(); !errors.Is(err, zc.ErrCloseTimeout) {
				t.Errorf("Engine.Close = %v, want ErrCloseTimeout", err)
			}
			select {
			case err := <-wrote:
				if !errors.Is(err, zc.ErrCloseTimeout) || !errors.Is(err, net.ErrClosed) {
					t.Errorf("Write waiting at Engine.Close = %v, want ErrCloseTimeout and net.ErrClosed", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("Write not woken by Engine.Close")
			}
			select {
			case err := <-read:
				if !errors.Is(err, zc.ErrCloseTimeout) || !errors.Is(err, net.ErrClosed) {
					t.Errorf("Read at Engine.Close = %v, want ErrCloseTimeout and net.ErrClosed", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("Read not woken by Engine.Close")
			}
			if _, err := c.Write([]byte("x")); !errors.Is(err, zc.ErrCloseTimeout) || !errors.Is(err, net.ErrClosed) {
				t.Errorf("Write after Engine.Close = %v, want ErrCloseTimeout and net.ErrClosed", err)
			}
			if d := c.Zc().Stats().BytesDropped; d == 0 {
				t.Errorf("BytesDropped 0 after the timed-out close")
			}
		})
	}
}
