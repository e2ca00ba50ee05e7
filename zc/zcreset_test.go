package zc

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zcnet/zcnet/tcpglue"
)

// TestZeroCopyResetSaysWhy: a peer that resets while zero-copy sends are in flight ends
// the connection with the reset's errno (ECONNRESET or EPIPE), also when a SEND_ZC came
// back short (io_uring reports the part it took and swallows the error): a probe
// saw "zero-copy send cut short ... short write" for 5–9 of 40 resets, which no
// errors.Is(err, syscall.ECONNRESET) matched. The short send is made deterministically
// first (it passed vacuously when none of its racing resets happened to cut one short),
// then a round of resets at random points checks every error.
func TestZeroCopyResetSaysWhy(t *testing.T) {
	t.Run("short", testZeroCopyResetShort)
	const conns = 40
	e := newEngine(t, Config{SendPath: SendZeroCopy, MaxQueuedBytes: 1 << 20})
	var mu sync.Mutex
	var errs []error
	done := make(chan struct{}, conns)
	chunk := make([]byte, 256<<10)
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		go func() {
			for {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		}()
		return HandlerFuncs{Close: func(c *Conn, err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			done <- struct{}{}
		}}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	short := resetRound(t, e, l, conns, done, &mu, &errs)
	t.Logf("%d of %d resets came through a zero-copy send cut short", short, conns)
}

// testZeroCopyResetShort: one SEND_ZC (MSG_WAITALL) of 256 KiB into a socket whose peer
// never reads through 4 KiB buffers takes a few KiB and waits for room; the peer's reset
// then ends it short. OnClose must say the send was cut short and match the reset's errno.
func testZeroCopyResetShort(t *testing.T) {
	e := newEngine(t, Config{SendPath: SendZeroCopy, MaxQueuedBytes: 1 << 20})
	l, ev := listenEvents(t, e)
	s := smallRecvBuf(t, l.Addr().String())
	c := recvEvent(t, ev.conn, "accept")
	if err := c.Socket(func(s *tcpglue.Socket) error { _, err := s.SetSendBuffer(4096); return err }); err != nil {
		t.Fatal(err)
	}
	const total = 256 << 10
	if n, err := c.Write(make([]byte, total)); n != total || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	// The send is in the kernel, part of it taken: the peer holds bytes, the rest of the
	// 256 KiB cannot fit two 4 KiB socket buffers.
	waitFor(t, func() bool {
		n, err := s.InQueue()
		return err == nil && n > 0 && c.Stats().SendZCOps > 0
	}, "the zero-copy send to reach the peer")
	s.SetLinger(0)
	s.Close()
	err := recvEvent(t, ev.closed, "close")
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Errorf("OnClose after the peer's reset = %v, want an error matching ECONNRESET or EPIPE", err)
	}
	if err == nil || !strings.Contains(err.Error(), "cut short") {
		t.Fatalf("OnClose = %v: the reset did not cut a zero-copy send short (the case under test)", err)
	}
	// The error reads as one line, and says what the send took of the bytes it was given
	// (it once gave the bytes left over as the total, and errors.Join's newline).
	msg := err.Error()
	var took, of int
	if i := strings.Index(msg, "cut short ("); i < 0 {
		t.Fatalf("OnClose = %q", msg)
	} else if _, serr := fmt.Sscanf(msg[i:], "cut short (%d of %d bytes)", &took, &of); serr != nil || took <= 0 || took >= of {
		t.Errorf("OnClose = %q: want \"cut short (took of total bytes)\" with 0 < took < total (%v)", msg, serr)
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("OnClose = %q: a newline in a connection's error", msg)
	}
}

// resetRound makes conns connections that each read a little and reset, waits for their
// OnClose, checks the errors, and returns how many came through a short zero-copy send.
func resetRound(t *testing.T, e *Engine, l *Listener, conns int, done chan struct{}, mu *sync.Mutex, errs *[]error) int {
	t.Helper()
	for i := 0; i < conns; i++ {
		nc, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64<<10)
		for got := 0; got < (i%8+1)*64<<10; {
			n, err := nc.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
		nc.(*net.TCPConn).SetLinger(0)
		nc.Close()
	}
	for i := 0; i < conns; i++ {
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of %d connections closed\n%s", i, conns, engineDump(e))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	short := 0
	for _, err := range *errs {
		if err == nil || !(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
			t.Errorf("OnClose after the peer's reset = %v, want an error matching ECONNRESET or EPIPE", err)
		}
		if err != nil && strings.Contains(err.Error(), "cut short") {
			short++
		}
	}
	*errs = (*errs)[:0]
	return short
}
