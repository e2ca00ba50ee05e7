package testutil

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The OpenSSL interop tests of zc (the event-loop API) and zc/ztls drive `openssl
// s_client` and `openssl s_server` (Debian's openssl package: make test installs it and the
// guests carry the host's) the same way; these are their shared drivers.

// Waits below poll every 10 ms up to this many times: generous, because the guests run
// under an emulator (TCG) where an s_server takes seconds to start. A bound on giving up,
// never a time a test asserts.
const sslPolls = 6000

// OpenSSLBin returns the openssl command's path, failing tb when it is not installed.
func OpenSSLBin(tb testing.TB) string {
	tb.Helper()
	p, err := exec.LookPath("openssl")
	if err != nil {
		tb.Fatalf("openssl: %v (Debian's openssl package: make test installs it)", err)
	}
	return p
}

// Output collects a command's output while the test reads it.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Wait polls (a bounded number of times) until the output holds n copies of s, failing tb
// when it does not or when OpenSSL printed an error.
func (o *Output) Wait(tb testing.TB, s string, n int) {
	tb.Helper()
	for i := 0; strings.Count(o.String(), s) < n; i++ {
		if i == sslPolls || strings.Contains(o.String(), ":error:") {
			tb.Fatalf("openssl did not print %d bytes (%.40q...) %d times:\n%.2000s", len(s), s, n, o.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ASCIIDigits turns b into ASCII digits in place and returns it (s_server and s_client
// read some letters on their input as commands).
func ASCIIDigits(b []byte) []byte {
	for i := range b {
		b[i] = '0' + b[i]%10
	}
	return b
}

// PEMFiles writes cert's chain and private key as PEM files for s_server.
func PEMFiles(tb testing.TB, cert tls.Certificate) (certFile, keyFile string) {
	tb.Helper()
	dir := tb.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	var cb bytes.Buffer
	for _, der := range cert.Certificate {
		pem.Encode(&cb, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	kder, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(certFile, cb.Bytes(), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return certFile, keyFile
}

// SServer is an `openssl s_server` serving one connection on a loopback port.
type SServer struct {
	Addr  string   // "127.0.0.1:port", listening when StartSServer returns
	Stdin *os.File // what s_server sends (and, alone on a line, its commands: "k", "K")
	Out   *Output  // its stdout and stderr together
	Cmd   *exec.Cmd

	exited chan struct{} // closed when Cmd has ended (its Wait runs in a goroutine)
}

// StartSServer starts s_server for one connection with the given certificate, flags and
// -quiet, and returns once it listens — seen in /proc/net/tcp, so that no probing connect
// takes s_server's only accept. A port taken between choosing it and s_server binding it
// (s_server exits) is retried with another. The process is ended at the test's end.
func StartSServer(tb testing.TB, bin string, cert tls.Certificate, flags []string, quiet bool) *SServer {
	tb.Helper()
	certFile, keyFile := PEMFiles(tb, cert)
	for try := 0; ; try++ {
		s, err := startSServer(tb, bin, certFile, keyFile, flags, quiet)
		if err == nil {
			return s
		}
		if try == 5 {
			tb.Fatalf("s_server: %v", err)
		}
	}
}

func startSServer(tb testing.TB, bin, certFile, keyFile string, flags []string, quiet bool) (*SServer, error) {
	tb.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	args := append([]string{"s_server", "-accept", addr, "-naccept", "1", "-cert", certFile, "-key", keyFile}, flags...)
	if quiet {
		args = append(args, "-quiet")
	}
	cmd := exec.Command(bin, args...)
	pr, stdin, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	out := &Output{}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pr, out, out
	err = cmd.Start()
	pr.Close()
	if err != nil {
		stdin.Close()
		tb.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop := func() { stdin.Close(); cmd.Process.Kill(); <-exited }
	for i := 0; ; i++ {
		up, err := listening(port)
		if err != nil {
			stop()
			tb.Fatal(err)
		}
		if up {
			break
		}
		select {
		case <-exited:
			stdin.Close()
			return nil, fmt.Errorf("exited before listening on %s:\n%.2000s", addr, out.String())
		default:
		}
		if i == sslPolls {
			stop()
			tb.Fatalf("s_server did not listen on %s:\n%.2000s", addr, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	tb.Cleanup(stop)
	return &SServer{Addr: addr, Stdin: stdin, Out: out, Cmd: cmd, exited: exited}, nil
}

// listening reports whether /proc/net/tcp shows a socket listening on 127.0.0.1:port.
func listening(port int) (bool, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return false, err
	}
	defer f.Close()
	want := "0100007F:" + strings.ToUpper(strconv.FormatInt(int64(port)|0x10000, 16)[1:])
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "  sl  local_address rem_address   st ..."
		fs := strings.Fields(sc.Text())
		if len(fs) > 3 && fs[1] == want && fs[3] == "0A" {
			return true, nil
		}
	}
	return false, sc.Err()
}

// Exited waits (bounded) until s_server has ended, as it does after its one connection.
func (s *SServer) Exited(tb testing.TB) {
	tb.Helper()
	select {
	case <-s.exited:
	case <-time.After(sslPolls * 10 * time.Millisecond):
		tb.Fatalf("s_server did not end after its connection:\n%.2000s", s.Out.String())
	}
}

// Drained waits (bounded) until s_server has read everything written to its input: it
// takes a command only as a line read alone.
func (s *SServer) Drained(tb testing.TB) {
	tb.Helper()
	for i := 0; ; i++ {
		n, err := unix.IoctlGetInt(int(s.Stdin.Fd()), unix.TIOCINQ)
		if err != nil {
			tb.Fatal(err)
		}
		if n == 0 {
			return
		}
		if i == sslPolls {
			tb.Fatalf("s_server left %d bytes of its input unread", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SClient is an `openssl s_client -quiet` connected to a TLS server under test.
type SClient struct {
	Out    *Output // what it received (stdout)
	ErrOut *Output // its messages (stderr)
	Cmd    *exec.Cmd

	done chan error // Cmd.Wait's result
}

// StartSClient runs s_client against addr with flags, sending in (then its input ends).
// The process is ended at the test's end.
func StartSClient(tb testing.TB, bin, addr string, flags []string, in []byte) *SClient {
	tb.Helper()
	args := append([]string{"s_client", "-connect", addr, "-quiet", "-servername", "localhost"}, flags...)
	c := &SClient{Out: &Output{}, ErrOut: &Output{}, Cmd: exec.Command(bin, args...), done: make(chan error, 1)}
	c.Cmd.Stdin = bytes.NewReader(in)
	c.Cmd.Stdout, c.Cmd.Stderr = c.Out, c.ErrOut
	if err := c.Cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { c.done <- c.Cmd.Wait() }()
	tb.Cleanup(func() {
		c.Cmd.Process.Kill()
		<-c.done
		c.done <- nil
	})
	return c
}

// Exited waits (bounded) until s_client has ended (-quiet: it ends on the server's
// close_notify) and fails tb when it ended with an error.
func (c *SClient) Exited(tb testing.TB) {
	tb.Helper()
	select {
	case err := <-c.done:
		c.done <- err
		if err != nil {
			tb.Fatalf("s_client: %v\n%.2000s", err, c.ErrOut.String())
		}
	case <-time.After(sslPolls * 10 * time.Millisecond):
		tb.Fatalf("s_client did not end:\n%.2000s", c.ErrOut.String())
	}
}
