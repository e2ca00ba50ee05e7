// Package netns builds the two-namespace topology of zcbench -netns: namespaces
// "zcbench-<pid>-srv" and "zcbench-<pid>-cli", joined by a veth pair with one queue
// per CPU, addressed 10.77.0.1/24 (server) and 10.77.0.2/24 (client). The addresses
// exist only inside those namespaces. It uses iproute2's ip(8) and needs root.
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
	"syscall"
)

// Addresses of the two ends.
const (
	ServerIP = "10.77.0.1"
	ClientIP = "10.77.0.2"
	prefix   = "zcbench-"
)

// Pair is a created topology. Close removes it.
type Pair struct {
	Server, Client     string // namespace names
	ServerNS, ClientNS *os.File
	Queues             int
	created            []string
}

// Create builds the namespaces and the veth pair. On failure it removes whatever it
// created.
func Create() (p *Pair, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("-netns needs root (it creates network namespaces and a veth pair)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("-netns needs ip(8) from iproute2")
	}
	RemoveStale()
	pid := strconv.Itoa(os.Getpid())
	p = &Pair{Server: prefix + pid + "-srv", Client: prefix + pid + "-cli", Queues: max(1, runtime.NumCPU())}
	defer func() {
		if err != nil {
			p.Close()
			p = nil
		}
	}()
	q := strconv.Itoa(p.Queues)
	for _, ns := range []string{p.Server, p.Client} {
		if err := ip("netns", "add", ns); err != nil {
			return nil, err
		}
		p.created = append(p.created, ns)
	}
	// Both ends are created inside the server namespace, then one moves: nothing of
	// this ever exists in the root namespace.
	if err := ip("-n", p.Server, "link", "add", "zcb0", "numtxqueues", q, "numrxqueues", q,
		"type", "veth", "peer", "name", "zcb1", "numtxqueues", q, "numrxqueues", q, "netns", p.Client); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"-n", p.Server, "addr", "add", ServerIP + "/24", "dev", "zcb0"},
		{"-n", p.Client, "addr", "add", ClientIP + "/24", "dev", "zcb1"},
		{"-n", p.Server, "link", "set", "lo", "up"},
		{"-n", p.Client, "link", "set", "lo", "up"},
		{"-n", p.Server, "link", "set", "zcb0", "up"},
		{"-n", p.Client, "link", "set", "zcb1", "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return nil, err
		}
	}
	if p.ServerNS, err = os.Open(filepath.Join("/run/netns", p.Server)); err != nil {
		return nil, err
	}
	if p.ClientNS, err = os.Open(filepath.Join("/run/netns", p.Client)); err != nil {
		return nil, err
	}
	return p, nil
}

// Close deletes the namespaces (the veth pair goes with them). It is idempotent.
func (p *Pair) Close() error {
	if p == nil {
		return nil
	}
	for _, f := range []*os.File{p.ServerNS, p.ClientNS} {
		if f != nil {
			f.Close()
		}
	}
	p.ServerNS, p.ClientNS = nil, nil
	var errs []error
	for _, ns := range p.created {
		if err := ip("netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	p.created = nil
	return errors.Join(errs...)
}

// RemoveStale deletes namespaces left by zcbench runs whose process is gone (killed
// with SIGKILL, which no cleanup survives).
func RemoveStale() {
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = ip("netns", "del", e.Name())
		}
	}
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
