package tcpglue

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// openFds lists this process's open descriptors with what they point to.
func openFds() map[string]string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	m := make(map[string]string, len(ents))
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // the directory's own descriptor, closed by now
		}
		m[e.Name()] = target
	}
	return m
}

// countMappings counts the TCP receive windows mapped into this process
// (mappings of a socket, shown as "socket:[inode]" in /proc/self/maps).
func countMappings() int {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return -1
	}
	return strings.Count(string(b), "socket:[")
}

// TestMain fails the run if any test leaks a descriptor or a socket mapping.
func TestMain(m *testing.M) {
	// Start the runtime's netpoller (epoll + eventfd, used by the resolver)
	// so its descriptors are part of the baseline.
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	before := openFds()
	mapsBefore := countMappings()
	code := m.Run()
	var leaked []string
	for i := 0; i < 50; i++ {
		// Descriptors closed by goroutines of the last test settle quickly.
		leaked = leaked[:0]
		for fd, target := range openFds() {
			if _, ok := before[fd]; !ok && !strings.HasPrefix(target, "/proc/") {
				leaked = append(leaked, fd+" -> "+target)
			}
		}
		if len(leaked) == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(leaked) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: leaked file descriptors: %v\n", leaked)
		code = 1
	}
	runtime.GC()
	time.Sleep(10 * time.Millisecond)
	if n := safetyNetCloses.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: %d sockets were dropped without Close\n", n)
		code = 1
	}
	if n := countMappings(); n != mapsBefore {
		fmt.Fprintf(os.Stderr, "FAIL: socket mappings before %d, after %d\n", mapsBefore, n)
		code = 1
	}
	os.Exit(code)
}
