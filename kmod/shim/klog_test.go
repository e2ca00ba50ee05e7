package shim

import (
	"regexp"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// The kernel log is checked after every test that opened a queue (in the
// VM, where this process owns the machine): any BUG, WARNING, Oops, leak
// report or refcount/list corruption fails that test.
var (
	klogMu   sync.Mutex
	klogSeen = map[string]bool{}
	klogBad  = regexp.MustCompile(`BUG:|WARNING:|Oops|general protection|Call Trace|zcshim: LEAK|refcount_t:|list_(add|del) corruption`)
)

func readKlog() []string {
	buf := make([]byte, 1<<20)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil || n <= 0 {
		return nil
	}
	return strings.Split(string(buf[:n]), "\n")
}

// markKlog remembers the lines already in the log (they belong to earlier
// tests or to boot).
func markKlog() {
	klogMu.Lock()
	defer klogMu.Unlock()
	for _, l := range readKlog() {
		klogSeen[l] = true
	}
}

// checkKlog fails t on bad lines that appeared since the last mark.
func checkKlog(t testing.TB) {
	klogMu.Lock()
	defer klogMu.Unlock()
	var bad []string
	for _, l := range readKlog() {
		if klogSeen[l] {
			continue
		}
		klogSeen[l] = true
		if klogBad.MatchString(l) {
			bad = append(bad, l)
		}
	}
	if len(bad) > 0 {
		t.Errorf("kernel log after %s:\n%s", t.Name(), strings.Join(bad, "\n"))
	}
}

// TestKlogReadable: the per-test kernel-log check can see the log (in the
// VM it must find the module's load message).
func TestKlogReadable(t *testing.T) {
	if !inVM {
		t.Skip("the kernel-log check runs in the VM only")
	}
	for _, l := range readKlog() {
		if strings.Contains(l, "zcshim: loaded") {
			return
		}
	}
	t.Fatal("kernel log unreadable or without the module's load message: the per-test check would be blind")
}
