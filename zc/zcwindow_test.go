package zc

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/zc/internal/becontract"
)

// TestZCSmallPeerWindow: 1 MiB in 64 KiB buffers over loopback to a peer whose receive buffer
// is 2 KiB (4 KiB after the kernel doubles it). Zero-copy segments of 1 KiB (half the peer's
// window) each charge a page or two to the peer's receive buffer, its window clamp falls
// below the sender's MSS for good, and the stream crawls at one segment per persist timer
// (about 4 KiB/s, copied sends included once it happened: 1 MiB in some 4 minutes). The
// adaptive policy must not try zero-copy there (Send.ZCSmallWindow says it refused), and every
// path must deliver the stream whole. To a peer with a normal window it still tries.
func TestZCSmallPeerWindow(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"io_uring/adaptive", Config{Backend: BackendIOUring}},
		{"io_uring/copy", Config{Backend: BackendIOUring, SendPath: SendCopy}},
		{"plain", Config{Backend: BackendPlain}},
	} {
		for _, accepted := range []bool{false, true} {
			name := tc.name + "/dialed"
			if accepted {
				name = tc.name + "/accepted"
			}
			t.Run(name, func(t *testing.T) {
				e := newEngine(t, tc.cfg)
				st := streamToPeer(t, e, 2048, accepted)
				if tc.cfg.Backend == BackendIOUring && tc.cfg.SendPath == SendAdaptive {
					if st.Send.ZCSmallWindow == 0 || st.Send.ZCOps != 0 {
						t.Fatalf("to a 2 KiB window: %d zero-copy refusals, %d zero-copy sends (want some, and none)", st.Send.ZCSmallWindow, st.Send.ZCOps)
					}
				} else if st.Send.ZCSmallWindow != 0 || st.Send.ZCOps != 0 {
					t.Fatalf("%d zero-copy refusals, %d zero-copy sends (want none)", st.Send.ZCSmallWindow, st.Send.ZCOps)
				}
			})
		}
	}
	for _, accepted := range []bool{false, true} {
		t.Run(fmt.Sprintf("io_uring/adaptive/normal-window/accepted=%v", accepted), func(t *testing.T) {
			e := newEngine(t, Config{Backend: BackendIOUring})
			st := streamToPeer(t, e, 0, accepted)
			if st.Send.ZCSmallWindow != 0 || st.Send.ZCOps == 0 {
				t.Fatalf("to a normal window: %d zero-copy refusals, %d zero-copy sends (want none, and a probe)", st.Send.ZCSmallWindow, st.Send.ZCOps)
			}
		})
	}
}

// streamToPeer sends 1 MiB from a connection of e to a plain loopback peer whose socket has
// SO_RCVBUF rcvbuf (0: the default) from before the handshake: the peer listens and e dials,
// or, accepted, e listens and the peer dials. It checks what the peer read and returns e's
// stats; it fails, instead of hanging, when the peer has not read everything in 60 s.
func streamToPeer(t *testing.T, e *Engine, rcvbuf int, accepted bool) Stats {
	t.Helper()
	control := func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			if rcvbuf > 0 {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf)
			}
		}); err != nil {
			return err
		}
		return serr
	}
	const total, chunk = 1 << 20, 64 << 10
	want := make([]byte, total)
	for i := range want {
		want[i] = byte(i*7 + i>>16)
	}
	got := make(chan []byte, 1)
	read := func(nc net.Conn) {
		var b []byte
		defer func() { got <- b }()
		defer nc.Close()
		buf := make([]byte, 64<<10)
		for len(b) < total {
			n, err := nc.Read(buf)
			b = append(b, buf[:n]...)
			if err != nil {
				return
			}
		}
	}
	var c *Conn
	if accepted {
		l, ev := listenEvents(t, e)
		d := net.Dialer{Control: control}
		nc, err := d.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		go read(nc)
		c = recvEvent(t, ev.conn, "accept")
	} else {
		lc := net.ListenConfig{Control: control}
		ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			nc, err := ln.Accept()
			if err != nil {
				got <- nil
				return
			}
			read(nc)
		}()
		if c, err = e.Dial(context.Background(), "tcp", ln.Addr().String(), HandlerFuncs{}); err != nil {
			t.Fatal(err)
		}
	}
	defer c.Close()
	for off := 0; off < total; off += chunk {
		b, err := c.BufferWait(60 * time.Second)
		if err != nil {
			t.Fatalf("after %d bytes: %v", off, err)
		}
		if len(b.Bytes()) < chunk {
			t.Fatalf("send buffer of %d bytes", len(b.Bytes()))
		}
		copy(b.Bytes(), want[off:off+chunk])
		if err := c.Send(b, chunk); err != nil {
			t.Fatalf("after %d bytes: %v", off, err)
		}
	}
	select {
	case b := <-got:
		if !bytes.Equal(b, want) {
			t.Fatalf("peer read %d bytes, want %d (equal: %v)", len(b), total, bytes.Equal(b, want[:len(b)]))
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("peer has not read 1 MiB in 60 s: %+v\n%s", c.Stats(), engineDump(e))
	}
	return e.Stats()
}

// TestZCSegmentsSmall: which TCP_INFO (send MSS, path MTU) pairs count as a window too small
// for zero-copy.
func TestZCSegmentsSmall(t *testing.T) {
	for _, tc := range []struct {
		mss, pmtu uint32
		small     bool
	}{
		{1448, 1500, false},   // Ethernet, timestamps: cut by the path
		{1460, 1500, false},   // Ethernet, no options
		{1428, 1500, false},   // IPv6
		{8948, 9000, false},   // jumbo frames
		{32741, 65535, false}, // loopback, 64 KiB window: half of it
		{4096, 65535, false},  // loopback, 8 KiB window
		{2048, 65535, true},   // loopback, 4 KiB window
		{1024, 65535, true},   // loopback, 2 KiB window
		{576, 1500, true},     // Ethernet, 1 KiB window
		{0, 0, false},         // TCP_INFO without them
	} {
		if got := becontract.ZCSegmentsSmall(tc.mss, tc.pmtu); got != tc.small {
			t.Errorf("ZCSegmentsSmall(%d, %d) = %v, want %v", tc.mss, tc.pmtu, got, tc.small)
		}
	}
}
