package zc

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/tcpglue"
)

// TCP keep-alive is on by default for accepted and dialed connections, as in Go's
// net: idle and interval 15 s, 9 probes; ListenOptions / DialOptions KeepAlive: -1 turn it
// off, a positive value (or Config.KeepAlive) sets it.

type keepAliveState struct {
	on               bool
	idle, intvl, cnt int
}

func keepAliveOf(t *testing.T, c *Conn) keepAliveState {
	t.Helper()
	var k keepAliveState
	err := c.Socket(func(s *tcpglue.Socket) error {
		return s.Control(func(fd int) error {
			on, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE)
			if err != nil {
				return err
			}
			k.on = on != 0
			if k.idle, err = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE); err != nil {
				return err
			}
			if k.intvl, err = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL); err != nil {
				return err
			}
			k.cnt, err = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestKeepAlive(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testKeepAlive(t, b) })
}

func testKeepAlive(t *testing.T, b Backend) {
	on := func(d time.Duration) keepAliveState {
		s := int(d / time.Second)
		return keepAliveState{on: true, idle: s, intvl: s, cnt: 9}
	}
	for _, tc := range []struct {
		name             string
		cfg              Config
		lopts            ListenOptions
		dopts            DialOptions
		accepted, dialed keepAliveState
	}{
		{name: "default", accepted: on(15 * time.Second), dialed: on(15 * time.Second)},
		{name: "off", lopts: ListenOptions{KeepAlive: -1}, dopts: DialOptions{KeepAlive: -1}},
		{name: "config-30s", cfg: Config{KeepAlive: 30 * time.Second}, accepted: on(30 * time.Second), dialed: on(30 * time.Second)},
		{name: "config-off", cfg: Config{KeepAlive: -1}},
		{name: "per-listener-and-dial", cfg: Config{KeepAlive: 30 * time.Second}, lopts: ListenOptions{KeepAlive: 45 * time.Second},
			dopts: DialOptions{KeepAlive: -1}, accepted: on(45 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Backend, cfg.Queues, cfg.NoPin = b, 1, true
			e := newEngine(t, cfg)
			acc := make(chan *Conn, 1)
			l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
				acc <- c
				return HandlerFuncs{}
			}, tc.lopts)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			d, err := e.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{}, tc.dopts)
			if err != nil {
				t.Fatal(err)
			}
			a := recvEvent(t, acc, "accept")
			check := func(what string, got, want keepAliveState) {
				t.Helper()
				if got.on != want.on || want.on && got != want {
					t.Errorf("%s connection: keep-alive %+v, want %+v", what, got, want)
				}
			}
			check("accepted", keepAliveOf(t, a), tc.accepted)
			check("dialed", keepAliveOf(t, d), tc.dialed)
			d.Close()
			a.Close()
		})
	}
}
