package testutil

import (
	"fmt"
	"net"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// PrivateLoopback runs fn on an OS thread of its own inside a fresh, unnamed network
// namespace whose loopback is up: sockets (and BPF links on its "lo") made in fn live
// there, so a test's traffic and faults touch nothing of the host's. The thread is never
// unlocked: it exits with fn's goroutine, and the namespace goes with the last socket or
// link that holds it. No ip(8) needed (it runs in the guests' initramfs too). It fails the
// test when fn fails, and skips without root.
func PrivateLoopback(tb testing.TB, fn func() error) {
	tb.Helper()
	RequireRoot(tb)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		if err := loopbackUp(); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	if err := <-errc; err != nil {
		tb.Fatal(err)
	}
}

// loopbackUp sets IFF_UP on the calling thread's namespace's "lo".
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS lo up: %w", err)
	}
	return nil
}

// FaultLoopback sets up a TCP connection on a private loopback (PrivateLoopback) with a
// fault injector on its "lo", for the tests that alter segments on the wire. In the
// namespace it runs listen (a server on 127.0.0.1:0; it returns the server's address),
// then attach with lo's interface index (bpf.NewFault: testutil cannot import bpf, whose
// own tests use this), then dials the server. It returns the client's end and the server's
// port (what the fault injector matches). The caller closes what listen and attach made
// and the client's end; the test fails when any step does.
func FaultLoopback(tb testing.TB, listen func() (net.Addr, error), attach func(lo int) error) (client net.Conn, port uint16) {
	tb.Helper()
	PrivateLoopback(tb, func() error {
		addr, err := listen()
		if err != nil {
			return err
		}
		port = uint16(addr.(*net.TCPAddr).Port)
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			return err
		}
		if err := attach(lo.Index); err != nil {
			return err
		}
		client, err = net.Dial("tcp4", addr.String())
		return err
	})
	return client, port
}

// FaultPair is FaultLoopback with a plain TCP listener (net.Listen "tcp4"): it returns both
// ends of the connection, which the caller closes; the listener is closed.
func FaultPair(tb testing.TB, attach func(lo int) error) (client, server net.Conn, port uint16) {
	tb.Helper()
	var ln net.Listener
	defer func() {
		if ln != nil {
			ln.Close()
		}
	}()
	client, port = FaultLoopback(tb, func() (net.Addr, error) {
		var err error
		if ln, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
			return nil, err
		}
		return ln.Addr(), nil
	}, attach)
	server, err := ln.Accept()
	if err != nil {
		client.Close()
		tb.Fatal(err)
	}
	return client, server, port
}
