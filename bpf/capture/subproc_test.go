package capture

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func runHelper(mode string) int {
	var err error
	switch mode {
	case "nopriv":
		err = helperNoPriv()
	default:
		err = fmt.Errorf("unknown helper %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	return 0
}

// helperNoPriv runs without CAP_BPF/CAP_SYS_ADMIN/CAP_NET_ADMIN/CAP_PERFMON:
// New must fail with ErrPermission, name what is missing, and leave no fd.
func helperNoPriv() error {
	before := bpfFDs()
	c, err := New(io.Discard, Options{Interfaces: []int{1}, Snap: 128},
		Flow(bpfFlowKey(netip.MustParseAddrPort("127.0.0.1:1"), netip.MustParseAddrPort("127.0.0.1:2"))))
	if err == nil {
		c.Close()
		return errors.New("New succeeded without privileges")
	}
	var oe *OpError
	if !errors.Is(err, ErrPermission) || !errors.As(err, &oe) {
		return fmt.Errorf("New: %v (%T), want an *OpError matching ErrPermission", err, err)
	}
	if after := bpfFDs(); after != before {
		return fmt.Errorf("%d BPF fds before, %d after the failed New", before, after)
	}
	fmt.Println("new:", err)
	return nil
}

func TestNoPrivileges(t *testing.T) {
	requireRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	// Dropping the capabilities from the bounding set means the exec'd
	// test binary, though uid 0, starts without them.
	cmd := exec.Command(setpriv, "--bounding-set", "-bpf,-sys_admin,-net_admin,-perfmon", "--inh-caps", "-all",
		"--", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=nopriv")
	out, err := cmd.CombinedOutput()
	t.Logf("helper:\n%s", out)
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	if !strings.Contains(string(out), "missing CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON") {
		t.Errorf("the error does not name the missing capabilities")
	}
}
