package zc

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/tcpglue"
)

// Accept backs off on EMFILE: in a child process whose RLIMIT_NOFILE is lowered to
// just above its open descriptors (before Listen: io_uring takes the limit when it prepares
// an accept), a listener facing ~50 pending connections must pause
// (Listener.AcceptBackoffs > 0), fail a bounded number of accepts (not millions), and accept
// the rest once the limit is raised again.

const emfileChildEnv = "ZC_EMFILE_CHILD"

func init() {
	// The child runs before TestMain: it only needs the package's code.
	if b := os.Getenv(emfileChildEnv); b != "" {
		os.Exit(emfileChild(b))
	}
}

const emfileConns = 50

func emfileChild(backend string) int {
	fail := func(f string, a ...any) int {
		fmt.Printf("CHILD-ERROR "+f+"\n", a...)
		return 1
	}
	var b Backend
	switch backend {
	case "io_uring":
		b = BackendIOUring
	case "plain":
		b = BackendPlain
	case "shim":
		b = BackendShim
	default:
		return fail("backend %q", backend)
	}
	e, err := New(Config{Backend: b, Queues: 1, NoPin: true})
	if err != nil {
		return fail("New: %v", err)
	}
	defer e.Close()
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return fail("getrlimit: %v", err)
	}
	in := bufio.NewReader(os.Stdin)
	// The runtime makes its netpoller on first use (a timer): before descriptors run out.
	time.Sleep(time.Millisecond)
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	// Room for the listening socket and a couple of accepts, then EMFILE. The limit is lowered
	// before Listen: io_uring reads RLIMIT_NOFILE when an accept is prepared.
	ents, _ := os.ReadDir("/proc/self/fd")
	low := lim
	low.Cur = uint64(len(ents) + 3)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		return fail("setrlimit: %v", err)
	}
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler { return HandlerFuncs{} })
	if err != nil {
		return fail("Listen: %v", err)
	}
	fmt.Printf("ADDR %s\n", l.Addr())
	if _, err := in.ReadString('\n'); err != nil { // the parent dialed
		return fail("stdin: %v", err)
	}
	time.Sleep(1500 * time.Millisecond) // out of descriptors all this time
	errsLow, backoffsLow := l.Stats().AcceptErrors, l.Stats().AcceptBackoffs
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return fail("setrlimit back: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for l.Stats().Accepted < emfileConns && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	st := e.Stats()
	fmt.Printf("RESULT accepted=%d errors=%d backoffs=%d errors_while_low=%d backoffs_while_low=%d stats_backoffs=%d stats_errors=%d\n",
		l.Stats().Accepted, l.Stats().AcceptErrors, l.Stats().AcceptBackoffs, errsLow, backoffsLow, st.Faults.AcceptBackoffs, st.Faults.AcceptErrors)
	return 0
}

func TestAcceptBackoffEMFILE(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testAcceptBackoffEMFILE(t, b) })
}

func testAcceptBackoffEMFILE(t *testing.T, b Backend) {
	if b == BackendShim {
		// The child must see the module the parent loaded (needShim).
		if err := shimAvailable(); err != nil {
			t.Fatalf("shim: %v", err)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), emfileChildEnv+"="+b.String())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	out := bufio.NewReader(stdout)
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		for {
			s, err := out.ReadString('\n')
			if s != "" {
				lines <- strings.TrimSpace(s)
			}
			if err != nil {
				return
			}
		}
	}()
	next := func() string {
		select {
		case s, ok := <-lines:
			if !ok {
				t.Fatal("child exited early")
			}
			if strings.HasPrefix(s, "CHILD-ERROR") {
				t.Fatal(s)
			}
			return s
		case <-time.After(30 * time.Second):
			t.Fatal("child silent")
		}
		return ""
	}
	addr, ok := strings.CutPrefix(next(), "ADDR ")
	if !ok {
		t.Fatalf("child said %q", addr)
	}
	var socks []*tcpglue.Socket
	defer func() {
		for _, s := range socks {
			s.Close()
		}
	}()
	for i := 0; i < emfileConns; i++ {
		s, err := tcpglue.Dial("tcp", addr, tcpglue.DialOptions{})
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		socks = append(socks, s)
	}
	io.WriteString(stdin, "dialed\n")
	res := next()
	t.Log(res)
	var accepted, errs, backoffs, errsLow, backoffsLow, stBackoffs, stErrs uint64
	if _, err := fmt.Sscanf(res, "RESULT accepted=%d errors=%d backoffs=%d errors_while_low=%d backoffs_while_low=%d stats_backoffs=%d stats_errors=%d",
		&accepted, &errs, &backoffs, &errsLow, &backoffsLow, &stBackoffs, &stErrs); err != nil {
		t.Fatalf("child result %q: %v", res, err)
	}
	if backoffsLow == 0 || stBackoffs == 0 {
		t.Errorf("no accept backoff while out of descriptors (listener %d, stats %d)", backoffsLow, stBackoffs)
	}
	// 1.5 s out of descriptors: backing off (5 ms doubling to 1 s) fails a handful of accepts;
	// re-arming at once fails millions.
	if errs == 0 || errs > 300 {
		t.Errorf("%d failed accepts (%d while out of descriptors): want some, and at most hundreds", errs, errsLow)
	}
	if accepted != emfileConns {
		t.Errorf("accepted %d of %d once the limit was raised", accepted, emfileConns)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("child: %v", err)
	}
}
