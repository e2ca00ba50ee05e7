package zc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// These run everywhere: without the module (this host) the shim must be refused with
// ErrNotSupported and the automatic fallback must pick plain sockets; with it (the VM) the
// shim must be picked.

func TestShimDemanded(t *testing.T) {
	probe := shimAvailable()
	e, err := New(Config{Backend: BackendShim, Queues: 1, SendBufs: 16, RecvBufs: 16})
	if probe != nil {
		if !errors.Is(probe, ErrNotSupported) {
			t.Fatalf("shimAvailable: %v, want an error matching ErrNotSupported", probe)
		}
		if err == nil {
			e.Close()
			t.Fatal("New(BackendShim) succeeded without a usable /dev/zcshim")
		}
		var oe *OpError
		if !errors.Is(err, ErrNotSupported) || !errors.As(err, &oe) {
			t.Fatalf("New(BackendShim): %v, want an *OpError matching ErrNotSupported", err)
		}
		t.Logf("no module here, as expected: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("the module is usable but New(BackendShim): %v", err)
	}
	defer e.Close()
	if e.Config().Backend != BackendShim || e.Stats().Backend != "shim" {
		t.Fatalf("backend %v, stats %+v", e.Config().Backend, e.Stats())
	}
}

const shimChildEnv = "ZC_SHIM_SECCOMP_CHILD"

// TestShimAutoFallback blocks io_uring with seccomp in a child process (as container
// runtimes do): New must fall back to the shim when the module is loaded, else to plain
// sockets, say so in Stats, and move checksummed bytes.
func TestShimAutoFallback(t *testing.T) {
	want := "plain"
	if shimAvailable() == nil {
		want = "shim"
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestShimSeccompHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), shimChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SHIM-FALLBACK-OK backend="+want+"\n") {
		t.Fatalf("child (want backend %s): %v\n%s", want, err, out)
	}
	t.Logf("%s", out)
}

// TestShimSeccompHelper is TestShimAutoFallback's child process; run directly it does nothing.
func TestShimSeccompHelper(t *testing.T) {
	if os.Getenv(shimChildEnv) == "" {
		t.Log("helper process of TestShimAutoFallback")
		return
	}
	if err := shimFallbackChild(); err != nil {
		t.Fatal(err)
	}
}

func shimFallbackChild() error {
	if err := blockIOUring(); err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	var reported error
	cfg := Config{Queues: 2, SendBufs: 64, RecvBufs: 64, NoPin: true, OnFallback: func(e error) { reported = e }}
	srv, err := New(cfg)
	if err != nil {
		return fmt.Errorf("New with io_uring blocked: %w", err)
	}
	defer srv.Close()
	cli, err := New(cfg)
	if err != nil {
		return fmt.Errorf("New with io_uring blocked: %w", err)
	}
	defer cli.Close()
	want := BackendPlain
	if shimAvailable() == nil {
		want = BackendShim
	}
	st := cli.Stats()
	if cli.Config().Backend != want || st.Backend != want.String() || st.Fallback == "" || reported == nil {
		return fmt.Errorf("want a visible fallback to %v: backend %v, stats %+v, reported %v", want, cli.Config().Backend, st, reported)
	}
	fmt.Println("fallback reason:", st.Fallback)
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		return err
	}
	defer l.Close()
	const size = 4 << 20
	if err := echoExchange(cli, l.Addr().String(), size, 5); err != nil {
		return fmt.Errorf("echo over the %v fallback: %w", want, err)
	}
	st = cli.Stats()
	switch want {
	case BackendShim:
		if st.Send.ZCOps == 0 || st.Send.BytesZC+st.Send.BytesZCCopied < size || st.Recv.BytesShim < size || st.Send.BytesCopy != 0 {
			return fmt.Errorf("shim counters do not show the traffic: %+v", st)
		}
	default:
		if st.Send.BytesCopy < size || st.Recv.BytesPlain < size {
			return fmt.Errorf("plain counters do not show the traffic: %+v", st)
		}
	}
	fmt.Printf("stats: %+v\n", st)
	fmt.Printf("SHIM-FALLBACK-OK backend=%v\n", want)
	return nil
}
