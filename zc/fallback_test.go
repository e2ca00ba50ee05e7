package zc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

const seccompChildEnv = "ZC_SECCOMP_CHILD"

// blockIOUring installs a seccomp filter on every thread that makes io_uring_setup fail with
// EPERM, as Docker's and containerd's default profiles do.
func blockIOUring() error {
	const (
		retErrno = 0x00050000
		retAllow = 0x7fff0000
	)
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_IO_URING_SETUP, Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: retErrno | uint32(unix.EPERM)},
		{Code: unix.BPF_RET | unix.BPF_K, K: retAllow},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	const setModeFilter, flagTsync = 1, 1
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, setModeFilter, flagTsync, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("seccomp: %w", e)
	}
	return nil
}

// seccompChild runs in a child process: io_uring is blocked; New must fail with NoFallback and
// fall back visibly without it, and the fallback must move bytes.
func seccompChild() int {
	if err := blockIOUring(); err != nil {
		fmt.Println("setup:", err)
		return 1
	}
	_, err := New(Config{Queues: 1, NoFallback: true})
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, unix.EPERM) {
		fmt.Printf("NoFallback: got %v, want ErrNotSupported/EPERM\n", err)
		return 1
	}
	fmt.Println("nofallback error:", err)
	var reported error
	cfg := Config{Queues: 1, SendBufs: 64, RecvBufs: 64, OnFallback: func(e error) { reported = e }}
	srv, err := New(cfg)
	if err != nil {
		fmt.Println("fallback New:", err)
		return 1
	}
	defer srv.Close()
	cli, err := New(cfg)
	if err != nil {
		fmt.Println("fallback New:", err)
		return 1
	}
	defer cli.Close()
	st := srv.Stats()
	if srv.Config().Backend != BackendPlain || st.Fallback == "" || reported == nil {
		fmt.Printf("fallback not visible: backend %v, stats %+v, reported %v\n", srv.Config().Backend, st, reported)
		return 1
	}
	fmt.Println("fallback reason:", st.Fallback)
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		fmt.Println("listen:", err)
		return 1
	}
	defer l.Close()
	if err := echoExchange(cli, l.Addr().String(), 8<<20, 3); err != nil {
		fmt.Println("echo over the fallback:", err)
		return 1
	}
	if s := cli.Stats(); s.Send.BytesCopy < 8<<20 || s.Recv.BytesPlain < 8<<20 {
		fmt.Printf("plain counters do not show the traffic: %+v\n", s)
		return 1
	}
	fmt.Println("SECCOMP-OK")
	return 0
}

func TestIOUringBlockedBySeccomp(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), seccompChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SECCOMP-OK") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
