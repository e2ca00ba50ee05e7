package zc_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/nettest"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/netconn"
)

// The net.Conn face (zc/netconn) over the backends and receive paths whose probes live in
// zc's tests: these run in zc's test binary, through the seams of export_test.go. The
// face's own tests are zc/netconn's.

// TestShimNettest: the net.Conn face over the zcshim backend passes x/net/nettest's
// conformance tests (it runs in zc's test binary: vmtest runs ^TestShim of ./zc).
func TestShimNettest(t *testing.T) {
	zc.NeedShim(t)
	nettest.TestConn(t, facePipe(t, zc.ShimCfg()))
}

// TestZcrxNettest: the net.Conn face over RecvZcrx passes x/net/nettest's conformance tests
// (reads copy out of the area and release at once; deadlines, close races, concurrency).
func TestZcrxNettest(t *testing.T) {
	zc.ZcrxExpected(t)
	cfg := zc.SmallCfg(zc.BackendIOUring)
	cfg.RecvPath, cfg.ZcrxAreaSize = zc.RecvZcrx, 256<<10
	nettest.TestConn(t, facePipe(t, cfg))
}

// facePipe makes nettest pipes of two engines of cfg joined by the face.
func facePipe(t *testing.T, cfg zc.Config) nettest.MakePipe {
	return func() (c1, c2 net.Conn, stop func(), err error) {
		srv, err := zc.New(cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		cli, err := zc.New(cfg)
		if err != nil {
			srv.Close()
			return nil, nil, nil, err
		}
		ln, err := netconn.Listen(srv, "tcp", "127.0.0.1:0")
		if err != nil {
			cli.Close()
			srv.Close()
			return nil, nil, nil, err
		}
		done := make(chan net.Conn, 1)
		go func() {
			c, _ := ln.Accept()
			done <- c
		}()
		c1, err = netconn.Dial(context.Background(), cli, "tcp", ln.Addr().String())
		if err != nil {
			ln.Close()
			cli.Close()
			srv.Close()
			return nil, nil, nil, err
		}
		c2 = <-done
		stop = func() {
			c1.Close()
			if c2 != nil {
				c2.Close()
			}
			ln.Close()
			cli.Close()
			srv.Close()
		}
		if c2 == nil {
			stop()
			return nil, nil, nil, errors.New("no accepted connection")
		}
		return c1, c2, stop, nil
	}
}

// TestShimNetConnReadAfterEngineClose: zc/netconn's TestNetConnReadAfterEngineClose over the
// zcshim backend (whose sockets the face always reads through the queue).
func TestShimNetConnReadAfterEngineClose(t *testing.T) {
	zc.NeedShim(t)
	for _, partial := range []bool{false, true} {
		testShimFaceReadAfterEngineClose(t, zc.Config{Backend: zc.BackendShim, Queues: 1, NoPin: true}, partial)
	}
}

func testShimFaceReadAfterEngineClose(t *testing.T, cfg zc.Config, partial bool) {
	e, err := zc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, nc := faceAccepted(t, e)
	msg := make([]byte, 200<<10) // several receive buffers
	const direct = false         // the shim always receives through the queue
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	if _, err := s.Write(msg); err != nil {
		t.Fatal(err)
	}
	s.(*net.TCPConn).CloseWrite()
	// Wait until everything arrived: queued in the net.Conn (ring: the engine received it
	// all) or in the socket (direct reads).
	zconn := nc.(netconn.Conn).Zc()
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
	deadline := time.Now().Add(10 * time.Second)
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
	if err := zc.WaitHang(t, closed, "Engine.Close", func() string { return "" }); err != nil {
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
			nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			n, err := nc.Read(p)
			data = append(data, p[:n]...)
			if err != nil || i > 10000 {
				done <- result{data, err}
				return
			}
		}
	}()
	r := zc.WaitHang(t, done, "NetConn.Read after Engine.Close", func() string { return "" })
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

// faceAccepted listens on e with the face, connects Go's net to it and accepts: the peer
// and the accepted net.Conn (the listener and the peer close with the test).
func faceAccepted(t *testing.T, e *zc.Engine) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := netconn.Listen(e, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return s, nc
}
