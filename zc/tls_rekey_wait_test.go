package zc

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
)

// TestTLSRekeyNoRoom: a KeyUpdate owed (RekeyRecords 4: after every send) while the peer
// reads nothing finds no room in the socket (small SO_SNDBUF here, SO_RCVBUF there) and
// waits for writability, once, instead of being retried on a timer. Modes:
//
//   - drain: the peer stalls until a KeyUpdate waits, then a while longer (no retry
//     happens meanwhile: no event, no try), then reads: the KeyUpdate goes out when the
//     socket has room, the data after it (and a Write made while it waited, which must
//     not go out before it) decrypts under the next keys, every byte checked;
//   - close: Close while the KeyUpdate waits (the peer never reads: the close gives up
//     after CloseStall, with a *CloseTimeoutError) ends, its wait released;
//   - reset: the peer resets the connection while the KeyUpdate waits: it ends;
//   - engine: Engine.Close while the KeyUpdate waits returns, the connection ends.
//
// In every mode nothing leaks (descriptors: the wait's duplicate of the socket; the
// connection's operations: a close waits for the wait's). It needs kernel TLS that takes
// new TX keys (Linux 6.14: the 7.3 guest).
func TestTLSRekeyNoRoom(t *testing.T) {
	if !wantKernelTLS(t) {
		t.Skip("no kernel TLS here (CONFIG_TLS is not set): the qemu guests run it")
	}
	testutil.SkipIfNotSupported(t, tcpglue.ProbeTLSRekey(), "6.14")
	for _, b := range tlsBackends {
		for _, mode := range []string{"drain", "close", "reset", "engine"} {
			t.Run(b.String()+"/"+mode, func(t *testing.T) { testTLSRekeyNoRoom(t, b, mode) })
		}
	}
}

func testTLSRekeyNoRoom(t *testing.T, b Backend, mode string) {
	fds := countFDs()
	t.Cleanup(func() { // registered first: runs after the engine's close
		for i := 0; countFDs() > fds; i++ {
			if i > 5000 {
				t.Errorf("descriptors: %d, %d before the test", countFDs(), fds)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	bufSize := func(opt int) func(fd uintptr) error {
		return func(fd uintptr) error { return unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, 32<<10) }
	}
	e := newEngine(t, Config{Backend: b, Queues: 1, NoFallback: true,
		CloseTimeout: 200 * time.Millisecond, CloseStall: 500 * time.Millisecond,
		SocketOptions: func(s *tcpglue.Socket) error {
			return s.Control(func(fd int) error { return bufSize(unix.SO_SNDBUF)(uintptr(fd)) })
		}})
	scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = bufSize(unix.SO_RCVBUF)(fd) }); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peers := make(chan *tls.Conn, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			close(peers)
			return
		}
		tc := tls.Server(raw, scfg)
		tc.SetDeadline(time.Now().Add(2 * time.Minute))
		if tc.Handshake() != nil {
			tc.Close()
			close(peers)
			return
		}
		peers <- tc
	}()
	closed := make(chan error, 1)
	c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), HandlerFuncs{
		EOF:   func(c *Conn, _ error) { c.Close() },
		Close: func(_ *Conn, err error) { closed <- err },
	}, DialOptions{TLS: &TLSOptions{Config: ccfg, RekeyRecords: 4}})
	if err != nil {
		t.Fatal(err)
	}
	peer := recvEvent(t, peers, "the peer's handshake")
	if peer == nil {
		t.Fatal("the peer's handshake failed")
	}
	defer peer.Close()
	checkTLSPath(t, c)
	tc := c.tlsState()

	data := make([]byte, 1<<20)
	newStreamGen(21).fill(data)
	wrote := make(chan error, 1)
	go func() { _, err := c.Write(data); wrote <- err }()

	// The peer reads nothing until a KeyUpdate found no room; should the sends stop with a
	// data send waiting instead (the last KeyUpdate just fitted), it reads a record's worth
	// and looks again.
	var got []byte
	buf := make([]byte, 16<<10)
	for i := 0; tc.kuNoRoom.Load() == 0; i++ {
		if i%500 == 499 {
			n, err := peer.Read(buf)
			if err != nil {
				t.Fatalf("peer read: %v", err)
			}
			got = append(got, buf[:n]...)
		}
		if i > 10000 {
			t.Fatalf("no KeyUpdate found the socket full: %+v\n%s", c.Stats(), engineDump(e))
		}
		time.Sleep(2 * time.Millisecond)
	}
	onLoop := func(f func()) {
		done := make(chan struct{})
		if err := c.q.Post(func() { f(); close(done) }); err != nil {
			t.Fatal(err)
		}
		recvEvent(t, done, "the queue")
	}
	var armed bool
	onLoop(func() { armed = tc.kuWait != nil && tc.kuWait.w.armed() })
	if !armed {
		t.Fatal("the KeyUpdate that found no room does not wait for writability")
	}

	switch mode {
	case "drain":
		// A stall: a retry on a timer would try the waiting KeyUpdate again and again
		// meanwhile, finding no room each time; the wait tries it again only once the
		// socket has room (what the kernel still had in flight when the KeyUpdate found
		// none may make some), and then it goes out: a KeyUpdate finds no room again only
		// after one went out (or, once, after a data send that waited for room completed).
		rekeys0 := tc.txRekeys.Load()
		noRoom0 := tc.kuNoRoom.Load()
		time.Sleep(100 * time.Millisecond)
		noRoom1 := tc.kuNoRoom.Load()
		rekeys1 := tc.txRekeys.Load()
		t.Logf("during the stall: %d more KeyUpdates without room, %d more TX key updates", noRoom1-noRoom0, rekeys1-rekeys0)
		if noRoom1-noRoom0 > rekeys1-rekeys0+1 {
			t.Fatalf("while the peer read nothing, the KeyUpdate found no room %d times more, with %d KeyUpdates sent: tries without an event", noRoom1-noRoom0, rekeys1-rekeys0)
		}
		if err := <-wrote; err != nil {
			t.Fatal(err)
		}
		// Written while a KeyUpdate is owed: it goes after it (a direct write waits too).
		tail := []byte("written while a KeyUpdate waited for room")
		if _, err := c.Write(tail); err != nil {
			t.Fatal(err)
		}
		data = append(data, tail...)
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		rest, err := io.ReadAll(peer)
		got = append(got, rest...)
		if err != nil {
			t.Fatalf("%v (read %d of %d bytes)\n%s", err, len(got), len(data), engineDump(e))
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("the peer read differs: %s", tlsFirstDiff(got, data))
		}
		peer.Close()
		if err := recvEvent(t, closed, "OnClose"); err != nil {
			t.Fatalf("OnClose: %v", err)
		}
		st := c.Stats().TLS
		noRoom := tc.kuNoRoom.Load()
		t.Logf("%d TX key updates, %d found no room and waited for it", st.TxRekeys, noRoom)
		if noRoom > st.TxRekeys {
			t.Fatalf("%d KeyUpdates found no room, with %d TX key updates: a KeyUpdate was tried again without having gone out", noRoom, st.TxRekeys)
		}
	case "close":
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := recvEvent(t, closed, "OnClose"); !errors.Is(err, ErrCloseTimeout) {
			t.Fatalf("OnClose: %v, want a close timeout (the peer reads nothing)", err)
		}
		<-wrote
	case "reset":
		raw := peer.NetConn().(*net.TCPConn)
		raw.SetLinger(0)
		raw.Close()
		if err := recvEvent(t, closed, "OnClose"); err == nil {
			t.Fatal("OnClose: nil after the peer's reset")
		}
		<-wrote
	case "engine":
		if err := e.Close(); err == nil {
			t.Fatal("Engine.Close: nil, with bytes the peer never read")
		}
		recvEvent(t, closed, "OnClose")
		<-wrote
	}
	if mode != "engine" {
		var ops int32
		var dup bool
		onLoop(func() { ops, dup = c.ops, tc.kuWait.w.dup })
		if ops != 0 || dup {
			t.Fatalf("after the close: %d operations, the wait's duplicate open %v", ops, dup)
		}
	}
}
