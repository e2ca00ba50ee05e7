package zc

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
)

func TestMain(m *testing.M) {
	if os.Getenv(seccompChildEnv) != "" {
		os.Exit(seccompChild())
	}
	if os.Getenv(steerChildEnv) != "" {
		os.Exit(steerChild())
	}
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	before := countFDs()
	code := m.Run()
	if code == 0 {
		// Connections finish closing asynchronously; give stragglers a moment.
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) && (uring.OpenRings() != 0 || memreg.OpenRegions() != 0 || countFDs() > before) {
			time.Sleep(20 * time.Millisecond)
		}
		if n := uring.OpenRings(); n != 0 {
			fmt.Fprintf(os.Stderr, "leak: %d rings open\n", n)
			code = 1
		}
		if n := memreg.OpenRegions(); n != 0 {
			fmt.Fprintf(os.Stderr, "leak: %d regions mapped\n", n)
			code = 1
		}
		if n := uring.OpenBufRings(); n != 0 {
			fmt.Fprintf(os.Stderr, "leak: %d buffer rings\n", n)
			code = 1
		}
		if after := countFDs(); after > before {
			fmt.Fprintf(os.Stderr, "leak: %d fds before, %d after\n", before, after)
			listFDs()
			code = 1
		}
	}
	os.Exit(code)
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
