package testutil

import (
	"fmt"
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
