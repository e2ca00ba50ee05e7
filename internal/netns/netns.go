// Package netns runs code inside a Linux network namespace and, for tests, creates and
// removes named namespaces.
//
// A socket belongs to the namespace its creating thread was in when it was created, for its
// whole life. Do gives a function a thread that has entered a namespace: sockets it creates
// (ioctl sockets for SIOCETHTOOL, TCP sockets for port reservations) stay in that namespace
// after Do returns. Netlink sockets do not need Do: github.com/mdlayher/netlink's
// Config.NetNS opens them in a namespace directly.
//
// The thread that entered the namespace is never reused: its goroutine exits while still
// locked to it, so the Go runtime terminates the thread instead of returning it to the pool
// in the wrong namespace.
package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Do runs fn on a fresh OS thread that has entered the network namespace ns (an open
// descriptor of /run/netns/NAME or /proc/PID/ns/net). With ns < 0, fn runs in the current
// goroutine, in the caller's namespace.
func Do(ns int, fn func() error) error {
	if ns < 0 {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread dies with this goroutine.
		runtime.LockOSThread()
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns: %w", os.NewSyscallError("setns", err))
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// NS is a named network namespace created by Create (for tests and tools: it uses
// iproute2's ip(8)).
type NS struct {
	Name string
	File *os.File // open descriptor of /run/netns/Name
}

var seq atomic.Int64

// Create makes a new named namespace "PREFIX-PID-N" and brings its loopback up. Close
// removes it. It needs root and ip(8).
func Create(prefix string) (*NS, error) {
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1))
	if err := IP("netns", "add", name); err != nil {
		return nil, err
	}
	ns := &NS{Name: name}
	f, err := os.Open(filepath.Join("/run/netns", name))
	if err != nil {
		ns.Close()
		return nil, err
	}
	ns.File = f
	if err := ns.IP("link", "set", "lo", "up"); err != nil {
		ns.Close()
		return nil, err
	}
	return ns, nil
}

// Fd is the namespace's descriptor, for Do and netlink.Config.NetNS.
func (n *NS) Fd() int { return int(n.File.Fd()) }

// IP runs "ip -n NAME args...".
func (n *NS) IP(args ...string) error {
	return IP(append([]string{"-n", n.Name}, args...)...)
}

// Close deletes the namespace (its links go with it). It is idempotent.
func (n *NS) Close() error {
	if n == nil || n.Name == "" {
		return nil
	}
	if n.File != nil {
		n.File.Close()
		n.File = nil
	}
	err := IP("netns", "del", n.Name)
	n.Name = ""
	return err
}

// IP runs ip(8) with args and returns its output in the error when it fails.
func IP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// RemoveStale deletes namespaces named PREFIX-PID-N whose process PID is gone (left
// behind by a killed test run). Namespaces of live processes are left alone.
func RemoveStale(prefix string) {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix+"-")
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := unix.Kill(pid, 0); err == nil || errors.Is(err, unix.EPERM) {
			continue // alive
		}
		IP("netns", "del", e.Name())
	}
}

// Own lists the namespaces named PREFIX-PID-N that this process created and has not
// removed: a test binary's TestMain checks it is empty at the end.
func Own(prefix string) []string {
	left, _ := filepath.Glob(filepath.Join("/run/netns", fmt.Sprintf("%s-%d-*", prefix, os.Getpid())))
	return left
}
