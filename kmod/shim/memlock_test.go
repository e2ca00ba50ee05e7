package shim

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMemlockLimit: registrations are charged to RLIMIT_MEMLOCK for a user
// without CAP_IPC_LOCK, refused with ENOMEM past it (with the fix in the
// message), and uncharged when the region is released.
func TestMemlockLimit(t *testing.T) {
	open(t, Config{Entries: 1}).Close() // probe
	if os.Getuid() != 0 {
		t.Skip("needs root to run the helper as another user")
	}
	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), "ZCSHIM_HELPER=memlock")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	t.Logf("helper (uid 65534): %s", strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("helper failed: %v", err)
	}
}

func helperMemlock() {
	fail := func(f string, a ...any) { fmt.Printf("FAIL: "+f+"\n", a...); os.Exit(4) }
	lim := unix.Rlimit{Cur: 64 << 10, Max: 64 << 10}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		fail("setrlimit: %v", err)
	}
	q, err := Open(Config{Entries: 4})
	if err != nil {
		fail("open: %v", err)
	}
	defer q.Close()
	mem, err := Mmap(1 << 20)
	if err != nil {
		fail("mmap: %v", err)
	}
	k, err := q.RegisterBytes(mem[:16<<10], 0)
	if err != nil {
		fail("16 KiB under a 64 KiB limit: %v", err)
	}
	_, err = q.RegisterBytes(mem, 0)
	if !errors.Is(err, unix.ENOMEM) || !strings.Contains(err.Error(), "RLIMIT_MEMLOCK") {
		fail("1 MiB over a 64 KiB limit: %v, want ENOMEM naming RLIMIT_MEMLOCK", err)
	}
	fmt.Printf("over the limit: %v\n", err)
	if _, err := q.RegisterBytes(mem[64<<10:112<<10], 0); !errors.Is(err, unix.ENOMEM) {
		fail("16+48 KiB (+slack) over 64 KiB: %v, want ENOMEM", err)
	}
	if err := q.Unregister(k); err != nil {
		fail("unregister: %v", err)
	}
	// The charge is returned when the region is freed (asynchronously).
	deadline := time.Now().Add(5 * time.Second)
	for {
		k2, err := q.RegisterBytes(mem[64<<10:112<<10], 0)
		if err == nil {
			q.Unregister(k2)
			break
		}
		if time.Now().After(deadline) {
			fail("48 KiB after releasing 16 KiB: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("OK: limit enforced and released")
}
