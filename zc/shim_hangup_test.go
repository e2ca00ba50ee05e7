package zc

import (
	"bytes"
	"io"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

// TestShimPausedHangup: a paused connection on the shim backend whose socket hangs up (the
// peer half-closed and the connection shut its own write side, so epoll reports EPOLLHUP
// whatever the registration asks for) takes nothing from its socket while paused: the
// bytes stay in the socket's receive queue. A splice relay depends on it, since it pauses
// its connections and reads their sockets itself. A RECV posted on that event took 32 KiB
// from under the splice: TestShimRelaySplice then lost or moved a range of the stream.
// After the resume every byte arrives, then the EOF.
func TestShimPausedHangup(t *testing.T) {
	needShim(t)
	e := newEngine(t, shimForwardCfg(1))
	var mu sync.Mutex
	var got bytes.Buffer
	eof := make(chan error, 1)
	c, peer := dialPeer(t, e, HandlerFuncs{
		Data: func(_ *Conn, d Data) {
			mu.Lock()
			got.Write(d.Bytes())
			mu.Unlock()
			d.Release()
		},
		EOF: func(_ *Conn, err error) { eof <- err },
	})
	if err := c.SetReceivePaused(true); err != nil {
		t.Fatal(err)
	}
	c.q.Do(func() error { return nil }) // the pause (posted) took effect before any byte arrives
	const n = 64 << 10
	want := make([]byte, n)
	newStreamGen(3).fill(want)
	if _, err := peer.Write(want); err != nil {
		t.Fatal(err)
	}
	if err := peer.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// Our FIN went out after the peer's arrived: LAST_ACK, then CLOSE once it is acked.
	testutil.Eventually(t, "the socket to hang up", func() bool {
		var state uint8
		c.sock.Control(func(fd int) error {
			ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
			if err == nil {
				state = ti.State
			}
			return err
		})
		return state == 9 || state == 7 // TCP_LAST_ACK, TCP_CLOSE
	})
	// Let the queue's loop wait on its epoll a few times (each Do wakes it): the hang-up is
	// level-triggered, so every wait reports it.
	for range 8 {
		c.q.Do(func() error { return nil })
	}
	if in, _ := connQueues(c); in != n {
		t.Errorf("the paused connection's socket holds %d bytes, want all %d (something read it)", in, n)
	}
	if r := c.Stats().BytesRecv; r != 0 {
		t.Errorf("the paused connection received %d bytes", r)
	}
	if err := c.SetReceivePaused(false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-eof:
		if err != io.EOF {
			t.Fatalf("EOF %v, want io.EOF", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("no EOF after the resume")
	}
	mu.Lock()
	defer mu.Unlock()
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("got %d bytes after the resume, want the %d sent, in order", got.Len(), n)
	}
}
