package zc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Tests of what a splice relay holds when it stops: bytes it took from one side's socket
// into its pipe reach the other side before that side closes, or are counted as lost
// (RelayStats.Lost, Err), never dropped silently.

// sockQueues returns the bytes in a socket's receive queue (SIOCINQ) and send queue
// (SIOCOUTQ: not yet acknowledged).
func sockQueues(fd int) (in, out int, err error) {
	if in, err = unix.IoctlGetInt(fd, unix.SIOCINQ); err != nil {
		return
	}
	out, err = unix.IoctlGetInt(fd, unix.SIOCOUTQ)
	return
}

func connQueues(c *Conn) (in, out int) {
	in, out = -1, -1
	c.sock.Control(func(fd int) error {
		var err error
		in, out, err = sockQueues(fd)
		return err
	})
	return
}

// heldEnv is a splice relay whose backend writes towards a client that does not read, with
// small socket buffers on the client's way: the relay stops with bytes it took from the
// backend in its pipe, waiting for room towards the client.
type heldEnv struct {
	s           *spliceEnv
	client      *net.TCPConn
	bc          *net.TCPConn // the backend's connection
	front, back *Conn
	rs          *RelayStats
	taken       int64 // bytes the relay took from the backend's socket before the test acted
}

func newHeldEnv(t *testing.T, cfg Config) *heldEnv {
	h := &heldEnv{}
	backConn := make(chan *net.TCPConn, 1)
	start := make(chan struct{})
	h.s = newSpliceEnv(t, cfg, RelayOptions{Path: RelaySplice, PipeSize: 1 << 20},
		func(c *net.TCPConn) {
			backConn <- c
			// Once the splice runs: bytes received before would go by SendData into the
			// front's send queue (which a graceful close sends too), not into the pipe.
			<-start
			writeStream(c, 11, 1<<30) // until the relay closes (or resets) it
		})
	var front, back atomic.Pointer[Conn]
	hook := func(f, b *Conn) {
		f.sock.SetSendBuffer(16 << 10) // the kernel doubles it
		front.Store(f)
		back.Store(b)
	}
	h.s.hook.Store(&hook)
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 16<<10) })
		if err == nil {
			err = serr
		}
		return err
	}}
	c, err := d.Dial("tcp", h.s.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h.client = c.(*net.TCPConn)
	select {
	case h.rs = <-h.s.stats:
	case err := <-h.s.errs:
		t.Fatal(err)
	}
	h.bc = <-backConn
	h.front, h.back = front.Load(), back.Load()
	waitFor(t, func() bool { return spliceRelays(h.s.e) == 1 }, "the splice to start")
	close(start)
	// The relay waits for room towards the client with bytes in its pipe; what it took
	// from the backend's socket is what that socket received less what it still holds. A
	// segment that arrives between the two readings would count as taken: the reading
	// holds only when the received count is the same before and after the queue's.
	var inPipe int
	deadline := time.Now().Add(20 * time.Second)
	for {
		inPipe = pipeBytes(h.s.e, 1)
		before := bytesReceived(h.back)
		in, _ := connQueues(h.back)
		received := bytesReceived(h.back)
		h.taken = int64(received) - int64(in)
		if inPipe > 0 && in > 0 && received == before {
			break // the backend's socket holds more: the relay does not read it now
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay's pipe never held bytes for the client\n%s", spliceDump(h.s.e))
		}
		time.Sleep(2 * time.Millisecond)
	}
	return h
}

// bytesReceived returns the bytes c's socket has received (TCP_INFO).
func bytesReceived(c *Conn) uint64 {
	var received uint64
	c.sock.Control(func(fd int) error {
		ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err == nil {
			received = ti.Bytes_received
		}
		return err
	})
	return received
}

// pipeBytes returns the bytes direction dir (0: client → backend, 1: backend → client) of
// the engine's one splice relay holds in its pipe while it waits for room at the
// destination (0 otherwise).
func pipeBytes(e *Engine, dir int) int {
	n := 0
	for _, q := range e.queues {
		q.Do(func() error {
			for r := range q.splq().relays {
				if d := r.dirs[dir]; d.out.armed {
					n += d.inPipe
				}
			}
			return nil
		})
	}
	return n
}

// relayDirDone reports whether direction dir of the engine's splice relay passed its EOF on.
func relayDirDone(e *Engine, dir int) bool {
	done := false
	for _, q := range e.queues {
		q.Do(func() error {
			for r := range q.splq().relays {
				done = done || r.dirs[dir].done
			}
			return nil
		})
	}
	return done
}

// spliceRelays counts the engine's splice relays that started splicing.
func spliceRelays(e *Engine) int {
	n := 0
	for _, q := range e.queues {
		q.Do(func() error {
			n += len(q.splq().relays)
			return nil
		})
	}
	return n
}

// checkPrefix reads r to EOF, checks that it is a prefix of the stream seeded with seed,
// and returns its length.
func checkPrefix(r io.Reader, seed uint64) (int64, error) {
	g := newStreamGen(seed)
	buf := make([]byte, 256<<10)
	want := make([]byte, len(buf))
	var got int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			g.fill(want[:k])
			if !bytes.Equal(buf[:k], want[:k]) {
				return got, fmt.Errorf("bytes %d..%d differ: %s", got, got+int64(k), describeMismatch(r, seed, got, buf[:k]))
			}
			got += int64(k)
		}
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, fmt.Errorf("after %d bytes: %w", got, err)
		}
	}
}

// finish reads the client's stream to EOF and checks it: a prefix of the backend's stream
// with at least every byte the relay had taken, and as many as the relay says it forwarded.
func (h *heldEnv) finish(t *testing.T) {
	t.Helper()
	h.client.SetReadDeadline(time.Now().Add(time.Minute))
	got, err := checkPrefix(h.client, 11)
	if err != nil {
		t.Fatalf("client: %v (relay: lost %d, err %v)", err, h.rs.Lost.Load(), h.rs.Err())
	}
	if got < h.taken {
		t.Errorf("the client got %d bytes; the relay had taken %d from the backend (lost %d, err %v)",
			got, h.taken, h.rs.Lost.Load(), h.rs.Err())
	}
	waitFor(t, h.rs.Finished, "the relay's connections to close")
	if n := int64(h.rs.BtoA.Load()); n != got {
		t.Errorf("BtoA %d, the client got %d", n, got)
	}
}

// TestRelaySpliceCloseHeld: a graceful Close of either relayed connection while the relay's
// pipe holds bytes for the client: the client gets every byte the relay took, then EOF.
func TestRelaySpliceCloseHeld(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		for _, side := range []string{"destination", "source", "destination-after-half-close"} {
			for _, queues := range []int{1, 2} {
				t.Run(fmt.Sprintf("%s/%dq", side, queues), func(t *testing.T) {
					testRelaySpliceCloseHeld(t, Config{Backend: be, Queues: queues}, side)
				})
			}
		}
	})
}

func testRelaySpliceCloseHeld(t *testing.T, cfg Config, side string) {
	h := newHeldEnv(t, cfg)
	c := h.front // the pipe's destination
	switch side {
	case "source":
		c = h.back
	case "destination-after-half-close":
		// The client half-closes first: the relay passes its EOF on (the backend's side is
		// half-closed) while the other way still waits with bytes in the pipe.
		h.client.CloseWrite()
		waitFor(t, func() bool { return relayDirDone(h.s.e, 0) }, "the client's EOF to be passed on")
		if pipeBytes(h.s.e, 1) == 0 {
			t.Fatal("the pipe towards the client emptied meanwhile")
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	h.finish(t)
	if n := h.rs.Lost.Load(); n != 0 || h.rs.Err() != nil {
		t.Errorf("lost %d bytes, Err %v", n, h.rs.Err())
	}
	waitPipes(t, h.s.e)
}

// TestRelaySpliceResetOtherWay: the backend resets after the relay took its bytes; the
// client's next byte makes the relay's splice towards the backend fail. The client still
// gets every byte the relay took from the backend, and the byte it sent, which cannot reach
// the backend, is counted as lost and Err says why.
func TestRelaySpliceResetOtherWay(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		h := newHeldEnv(t, Config{Backend: be, Queues: 2})
		h.bc.SetLinger(0)
		h.bc.Close() // RST
		back := h.back
		waitFor(t, func() bool {
			var state uint8
			back.sock.Control(func(fd int) error {
				ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
				if err == nil {
					state = ti.State
				}
				return err
			})
			return state == 7 // TCP_CLOSE: the reset arrived
		}, "the backend's reset")
		if _, err := h.client.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		h.finish(t)
		if n := h.rs.Lost.Load(); n != 1 {
			t.Errorf("lost %d bytes, want the client's 1", n)
		}
		if err := h.rs.Err(); err == nil || !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("Err %v, want the reset", err)
		}
		waitPipes(t, h.s.e)
	})
}

// TestRelaySpliceCloseTimeout: a graceful Close of the client's connection while the client
// never reads and is silent (silence: a client that only stops reading answers the kernel's
// probes, and the close waits for it): the bytes handed to it cannot go out, CloseTimeout
// resets it, and the relay counts them as lost (Lost, Err) instead of dropping them
// silently.
func TestRelaySpliceCloseTimeout(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) {
		h := newHeldEnv(t, Config{Backend: be, Queues: 2, CloseTimeout: 100 * time.Millisecond})
		silenceConn(t, h.client)
		if err := h.front.Close(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, h.rs.Finished, "the relay's connections to close")
		if h.rs.Lost.Load() == 0 || h.rs.Err() == nil || !errors.Is(h.rs.Err(), ErrClosed) {
			t.Errorf("lost %d, Err %v: want the bytes the client never read", h.rs.Lost.Load(), h.rs.Err())
		}
		if st := h.s.e.Stats(); st.Faults.CloseTimeouts == 0 {
			t.Errorf("no close timed out")
		}
		waitPipes(t, h.s.e)
	})
}

// describeMismatch says what a stream that differs from the one seeded with seed holds from
// offset at (whose first received chunk is chunk; the rest is read from r to EOF, up to
// 64 MiB): the first differing offset, then each run of received bytes as the offset range
// of the expected stream it copies (a duplicate, a skip or a reordering shows as a jump),
// or as the stream of another seed (another connection's bytes), or as unknown.
func describeMismatch(r io.Reader, seed uint64, at int64, chunk []byte) string {
	rest, _ := io.ReadAll(io.LimitReader(r, 64<<20))
	got := append(append([]byte(nil), chunk...), rest...)
	end := at + int64(len(got))
	exp := make([]byte, end+4<<20) // a stream may lose bytes: look a little beyond
	newStreamGen(seed).fill(exp)
	first := at
	for first < end && got[first-at] == exp[first] {
		first++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "first differing byte at %d, %d bytes received from %d;", first, len(got), at)
	const win = 32
	others := map[uint64][]byte{}
	for p, runs := first, 0; p < end && runs < 12; runs++ {
		w := got[p-at : min(p-at+win, int64(len(got)))]
		if q := bytes.Index(exp, w); q >= 0 && len(w) == win {
			n := int64(0)
			for p+n < end && int64(q)+n < int64(len(exp)) && got[p+n-at] == exp[int64(q)+n] {
				n++
			}
			fmt.Fprintf(&b, " [%d,%d) = stream [%d,%d)", p, p+n, q, int64(q)+n)
			p += n
			continue
		}
		found := false
		for s := uint64(0); s < 20 && len(w) == win; s++ {
			if s == seed {
				continue
			}
			o := others[s]
			if o == nil {
				o = make([]byte, end+1<<20)
				newStreamGen(s).fill(o)
				others[s] = o
			}
			if q := bytes.Index(o, w); q >= 0 {
				n := int64(0)
				for p+n < end && int64(q)+n < int64(len(o)) && got[p+n-at] == o[int64(q)+n] {
					n++
				}
				fmt.Fprintf(&b, " [%d,%d) = stream of seed %d [%d,%d)", p, p+n, s, q, int64(q)+n)
				p += n
				found = true
				break
			}
		}
		if found {
			continue
		}
		// Unknown bytes: skip to where the expected stream (at any offset) resumes.
		n := int64(64)
		for p+n+win <= end && n < 1<<16 && !bytes.Contains(exp, got[p+n-at:p+n-at+win]) {
			n += 64
		}
		n = min(n, end-p)
		fmt.Fprintf(&b, " [%d,%d) unknown (%x...)", p, p+n, got[p-at:min(p-at+16, int64(len(got)))])
		p += n
	}
	return b.String()
}
