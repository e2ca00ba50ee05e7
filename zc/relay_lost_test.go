package zc

import (
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRelaySendDataLost: the SendData relay counts what it forwarded into a destination's
// send queue and the destination then dropped (a CloseTimeout reset, a peer's reset), and
// what it took for a destination already gone: RelayStats.Lost and Err say so, as on the
// splice path, instead of a silent loss.
func TestRelaySendDataLost(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		for _, how := range []string{"closetimeout", "reset"} {
			t.Run(how, func(t *testing.T) { testRelaySendDataLost(t, be, how) })
		}
	})
}

func testRelaySendDataLost(t *testing.T, be Backend, how string) {
	s := newSpliceEnv(t, Config{Backend: be, Queues: 2, CloseTimeout: 100 * time.Millisecond},
		RelayOptions{Path: RelaySendData},
		func(c *net.TCPConn) { writeStream(c, 11, 1<<30) }) // until the relay closes it
	var front atomic.Pointer[Conn]
	hook := func(f, _ *Conn) {
		f.sock.SetSendBuffer(16 << 10) // the kernel doubles it
		front.Store(f)
	}
	s.hook.Store(&hook)
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 16<<10) })
		return errors.Join(err, serr)
	}}
	nc, err := d.Dial("tcp", s.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	client := nc.(*net.TCPConn) // never reads until the end
	var rs *RelayStats
	select {
	case rs = <-s.stats:
	case err := <-s.errs:
		t.Fatal(err)
	}
	if rs.Path != RelaySendData {
		t.Fatalf("path %v", rs.Path)
	}
	waitFor(t, func() bool { return front.Load() != nil }, "the relay's hook")
	f := front.Load()
	// The relay forwarded more than the client's way holds: the rest waits in the front's
	// send queue.
	waitFor(t, func() bool { return f.Stats().Queued > 0 && rs.BtoA.Load() > 256<<10 }, "bytes queued towards the client")
	want := ErrCloseTimeout
	hear := func() {}
	switch how {
	case "closetimeout":
		// graceful; the client does not read and goes silent: CloseTimeout resets it (a
		// client that only stops reading answers the kernel's probes: the close waits)
		hear = silenceConn(t, client)
		f.Close()
	case "reset":
		client.SetLinger(0)
		client.Close()         // a RST: the front's sends fail
		want = unix.ECONNRESET // or EPIPE: a send after the reset
	}
	waitFor(t, rs.Finished, "the relay's connections to close")
	<-f.Done()
	dropped := f.Stats().BytesDropped
	lost := rs.Lost.Load()
	if dropped == 0 || lost < dropped {
		t.Fatalf("the front dropped %d bytes the relay forwarded; Lost %d", dropped, lost)
	}
	if err := rs.Err(); !errors.Is(err, want) && !(how == "reset" && errors.Is(err, unix.EPIPE)) {
		t.Errorf("Err() = %v, want %v", err, want)
	}
	if how == "closetimeout" {
		// What reaches the client is at most what was forwarded less what was dropped.
		got := int64(0)
		buf := make([]byte, 64<<10)
		hear() // what it holds; no reset reaches it (it was silent then): the deadline ends it
		client.SetReadDeadline(time.Now().Add(time.Second))
		for {
			n, err := client.Read(buf)
			got += int64(n)
			if err != nil {
				break
			}
		}
		if uint64(got)+dropped > rs.BtoA.Load() {
			t.Errorf("client got %d, front dropped %d, of %d forwarded", got, dropped, rs.BtoA.Load())
		}
	}
	t.Logf("forwarded %d, front dropped %d, Lost %d: %v", rs.BtoA.Load(), dropped, lost, rs.Err())
}
