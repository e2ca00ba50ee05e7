// Package leakcheck is the TestMain of zcnet's packages that touch the kernel: it runs the
// tests and fails the run when file descriptors or counted kernel objects (rings, regions,
// buffer rings, ...) are left behind.
package leakcheck

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// Check counts one kind of object that must be gone after the tests.
type Check struct {
	Name string
	Open func() int64
}

func countFDs() int {
	e, _ := os.ReadDir("/proc/self/fd")
	return len(e)
}

func listFDs() {
	e, _ := os.ReadDir("/proc/self/fd")
	for _, f := range e {
		t, _ := os.Readlink("/proc/self/fd/" + f.Name())
		fmt.Fprintf(os.Stderr, "  fd %s -> %s\n", f.Name(), t)
	}
}

// Main runs m and returns the exit code, 1 when something leaked. Objects that close
// asynchronously get up to grace to go away.
func Main(m *testing.M, grace time.Duration, checks ...Check) int {
	// Let the runtime create its netpoller fds first, so they are not counted as leaks.
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	before := countFDs()
	code := m.Run()
	if code != 0 {
		return code
	}
	leaked := func() bool {
		for _, c := range checks {
			if c.Open() != 0 {
				return true
			}
		}
		return countFDs() > before
	}
	for deadline := time.Now().Add(grace); leaked() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range checks {
		if n := c.Open(); n != 0 {
			fmt.Fprintf(os.Stderr, "leak: %d %s still open\n", n, c.Name)
			code = 1
		}
	}
	if after := countFDs(); after > before {
		fmt.Fprintf(os.Stderr, "leak: %d fds before the tests, %d after\n", before, after)
		listFDs()
		code = 1
	}
	return code
}
