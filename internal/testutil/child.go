package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// RunAsNobody runs the test binary again as user nobody (uid and gid 65534: no capabilities,
// so RLIMIT_MEMLOCK applies to it) with env added to the environment and no test selected:
// the package's TestMain sees env and runs its child part. The binary is copied to a
// directory nobody may enter (go test builds it where only root may). It returns the child's
// combined output and exit error. Skips without root (CI runs as root).
func RunAsNobody(tb testing.TB, env string) (string, error) {
	tb.Helper()
	RequireRoot(tb)
	dir, err := os.MkdirTemp("", "zcnet-nobody-")
	if err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	bin := filepath.Join(dir, filepath.Base(os.Args[0]))
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), env)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Eventually polls cond every 2 ms until it holds, and fails the test after a minute: a
// liveness wait (something must happen), never a timing assertion.
func Eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("never happened: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
