package zc

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
)

// OpenSSL interop of the event-loop API: a zc TLS listener against `openssl s_client` and
// a zc TLS dial against `openssl s_server`, each cipher suite of TLS 1.3 and 1.2 that
// kernel TLS carries (OpenSSL lets the test pick each one; crypto/tls against itself
// always picks AES-128-GCM on a CPU with AES). In the guests the records are the kernel's.

type sslCase struct {
	name    string
	version uint16
	suite   uint16
	flags   []string
}

var sslCases = []sslCase{
	{"1.3-AES128", tls.VersionTLS13, tls.TLS_AES_128_GCM_SHA256, []string{"-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"}},
	{"1.3-AES256", tls.VersionTLS13, tls.TLS_AES_256_GCM_SHA384, []string{"-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384"}},
	{"1.3-CHACHA20", tls.VersionTLS13, tls.TLS_CHACHA20_POLY1305_SHA256, []string{"-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"}},
	{"1.2-AES128", tls.VersionTLS12, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, []string{"-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"}},
	{"1.2-AES256", tls.VersionTLS12, tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, []string{"-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"}},
	{"1.2-CHACHA20", tls.VersionTLS12, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, []string{"-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"}},
}

func sslBin(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("openssl")
	if err != nil {
		t.Fatalf("openssl: %v (Debian's openssl package; the guests carry the host's)", err)
	}
	return p
}

// sslOutput is a command's output, read while it runs.
type sslOutput struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *sslOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *sslOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// wait polls (a bounded number of times) until out holds s.
func (o *sslOutput) wait(t *testing.T, s string) {
	t.Helper()
	for i := 0; !strings.Contains(o.String(), s); i++ {
		if i == 3000 || strings.Contains(o.String(), ":error:") {
			t.Fatalf("openssl did not print %d bytes (%.40q...):\n%.2000s", len(s), s, o.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sslDigits is n ASCII digits from a seeded stream (s_server and s_client read letters
// on their input as commands).
func sslDigits(n int, seed uint64) []byte {
	b := make([]byte, n)
	newStreamGen(seed).fill(b)
	for i := range b {
		b[i] = '0' + b[i]%10
	}
	return b
}

// sslCertFiles writes the test certificate and its key as PEM files for s_server.
func sslCertFiles(t *testing.T) (cert, key string) {
	t.Helper()
	tlsConfigs(t, tls.VersionTLS13)
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	kder, err := x509.MarshalPKCS8PrivateKey(tlsCert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsCert.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// sslCollector is a zc handler that keeps what it receives and signals each arrival.
type sslCollector struct {
	mu   sync.Mutex
	got  []byte
	more chan struct{}
	end  chan error
}

func newSSLCollector() *sslCollector {
	return &sslCollector{more: make(chan struct{}, 1), end: make(chan error, 1)}
}

func (h *sslCollector) OnData(c *Conn, d Data) {
	h.mu.Lock()
	h.got = append(h.got, d.Bytes()...)
	h.mu.Unlock()
	d.Release()
	select {
	case h.more <- struct{}{}:
	default:
	}
}
func (h *sslCollector) OnEOF(c *Conn, err error) {}
func (h *sslCollector) OnClose(c *Conn, err error) {
	h.end <- err
	select {
	case h.more <- struct{}{}:
	default:
	}
}

// waitFor waits until the collector holds n bytes (or the connection ended) and returns them.
func (h *sslCollector) waitFor(t *testing.T, n int, what func() string) []byte {
	t.Helper()
	for {
		h.mu.Lock()
		got := h.got
		h.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case err := <-h.end:
			t.Fatalf("the connection ended (%v) after %d of %d bytes\n%s", err, len(got), n, what())
		default:
		}
		recvEvent(t, h.more, fmt.Sprintf("data (%d of %d bytes)", len(got), n))
	}
}

// TestTLSOpenSSL: a zc TLS server against s_client and a zc TLS client against s_server,
// every cipher suite of both versions kernel TLS takes: 200 KB each way, every byte
// checked, the suite negotiated as asked, and the end by zc's close_notify (s_client
// -quiet exits on it). The backends take turns.
func TestTLSOpenSSL(t *testing.T) {
	bin := sslBin(t)
	for i, sc := range sslCases {
		b := tlsBackends[i%len(tlsBackends)]
		t.Run(sc.name+"/server", func(t *testing.T) { sslServerSide(t, bin, b, sc) })
		t.Run(sc.name+"/client", func(t *testing.T) { sslClientSide(t, bin, b, sc) })
	}
}

func checkSuite(t *testing.T, c *Conn, sc sslCase) {
	t.Helper()
	st := checkTLSPath(t, c)
	if st.TLS.Version != sc.version || st.TLS.CipherSuite != sc.suite {
		t.Fatalf("negotiated %s %s, want %s", tls.VersionName(st.TLS.Version), tls.CipherSuiteName(st.TLS.CipherSuite), tls.CipherSuiteName(sc.suite))
	}
}

func sslServerSide(t *testing.T, bin string, b Backend, sc sslCase) {
	e := newTLSEngine(t, b)
	scfg, _ := tlsConfigs(t, sc.version)
	h := newSSLCollector()
	conns := make(chan *Conn, 1)
	l, err := e.Listen("tcp4", "127.0.0.1:0", func(c *Conn) Handler { conns <- c; return h },
		ListenOptions{TLS: &TLSOptions{Config: scfg}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	toServer, toClient := sslDigits(200_000, 21), sslDigits(200_003, 22)
	cmd := exec.Command(bin, append([]string{"s_client", "-connect", l.Addr().String(), "-quiet", "-servername", "localhost"}, sc.flags...)...)
	cmd.Stdin = bytes.NewReader(toServer)
	var out, errOut sslOutput
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	c := recvEvent(t, conns, "accepted connection")
	checkSuite(t, c, sc)
	if got := h.waitFor(t, len(toServer), errOut.String); !bytes.Equal(got, toServer) {
		t.Fatalf("from s_client: %s", tlsFirstDiff(got, toServer))
	}
	if _, err := c.Write(toClient); err != nil {
		t.Fatal(err)
	}
	c.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if err := recvEvent(t, done, "s_client's exit (after close_notify)"); err != nil {
		t.Fatalf("s_client: %v\n%s", err, errOut.String())
	}
	if o := out.String(); o != string(toClient) {
		t.Fatalf("s_client got: %s", tlsFirstDiff([]byte(o), toClient))
	}
	<-c.Done()
}

// startSSLServer runs s_server for one connection and dials it with zc once it listens.
func startSSLServer(t *testing.T, bin string, e *Engine, opts *TLSOptions, h Handler, sc sslCase, quiet bool) (*Conn, *os.File, *sslOutput) {
	t.Helper()
	certFile, keyFile := sslCertFiles(t)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	args := append([]string{"s_server", "-accept", addr, "-naccept", "1", "-cert", certFile, "-key", keyFile}, sc.flags...)
	if quiet {
		args = append(args, "-quiet")
	}
	cmd := exec.Command(bin, args...)
	pr, stdin, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &sslOutput{}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pr, out, out
	err = cmd.Start()
	pr.Close()
	if err != nil {
		stdin.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	// Until s_server listens: a bounded number of tries, each refused at connect (before
	// any handshake) while nothing listens.
	var c *Conn
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		c, err = e.Dial(ctx, "tcp4", addr, h, DialOptions{TLS: opts})
		cancel()
		if err == nil || !errors.Is(err, unix.ECONNREFUSED) || i == 1000 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("dial s_server: %v\n%s", err, out.String())
	}
	checkSuite(t, c, sc)
	return c, stdin, out
}

func sslClientSide(t *testing.T, bin string, b Backend, sc sslCase) {
	e := newTLSEngine(t, b)
	_, ccfg := tlsConfigs(t, sc.version)
	h := newSSLCollector()
	c, stdin, out := startSSLServer(t, bin, e, &TLSOptions{Config: ccfg}, h, sc, true)
	toClient, toServer := sslDigits(200_000, 23), sslDigits(200_007, 24)
	go stdin.Write(toClient)
	if got := h.waitFor(t, len(toClient), out.String); !bytes.Equal(got[:len(toClient)], toClient) {
		t.Fatalf("from s_server: %s", tlsFirstDiff(got, toClient))
	}
	if _, err := c.Write(toServer); err != nil {
		t.Fatal(err)
	}
	out.wait(t, string(toServer))
	c.Close()
	<-c.Done()
}

// TestTLSOpenSSLKeyUpdate: s_server sends KeyUpdates between lines of data ("k": not
// requested, "K": update_requested). The zc client reads on across them (new RX keys) and
// answers each request with a KeyUpdate of its own and new TX keys, sent by the engine
// before its next data; s_server then decrypts what zc sends. On the kernel path it needs
// Linux 6.14 (new keys on a socket).
func TestTLSOpenSSLKeyUpdate(t *testing.T) {
	bin := sslBin(t)
	if wantKernelTLS(t) {
		testutil.SkipIfNotSupported(t, tcpglue.ProbeTLSRekey(), "6.14")
	}
	for i, sc := range sslCases[:3] {
		b := tlsBackends[i%len(tlsBackends)]
		t.Run(sc.name+"/"+b.String(), func(t *testing.T) {
			e := newTLSEngine(t, b)
			_, ccfg := tlsConfigs(t, sc.version)
			h := newSSLCollector()
			c, stdin, out := startSSLServer(t, bin, e, &TLSOptions{Config: ccfg}, h, sc, false)
			var want bytes.Buffer
			for i, cmd := range []string{"k", "K", "K", "k"} {
				line := fmt.Sprintf("line-%d\n", i)
				want.WriteString(line)
				if _, err := stdin.WriteString(line); err != nil {
					t.Fatal(err)
				}
				if got := h.waitFor(t, want.Len(), out.String); !bytes.Equal(got, want.Bytes()) {
					t.Fatalf("read %q, want %q", got, want.Bytes())
				}
				if _, err := stdin.WriteString(cmd + "\n"); err != nil {
					t.Fatal(err)
				}
				sslDrained(t, stdin) // s_server takes a command only as a line read alone
			}
			want.WriteString("last\n")
			stdin.WriteString("last\n")
			if got := h.waitFor(t, want.Len(), out.String); !bytes.Equal(got, want.Bytes()) {
				t.Fatalf("read %q, want %q", got, want.Bytes())
			}
			// s_server decrypts what zc sends after its own KeyUpdates.
			if _, err := c.Write([]byte("from-zc-after-rekey\n")); err != nil {
				t.Fatal(err)
			}
			out.wait(t, "from-zc-after-rekey")
			st := c.Stats().TLS
			if st.Kernel {
				es := e.Stats().TLS
				if st.KeyUpdates != 4 || st.TxRekeys != 2 || es.KeyUpdatesSent != 2 || es.TxRekeys != 2 || es.KeyUpdates != 4 {
					t.Fatalf("connection %+v, engine %+v: want 4 KeyUpdates received, 2 asked for and answered", st, es)
				}
			}
			c.Close()
			<-c.Done()
		})
	}
}

// sslDrained waits until the reader of the pipe w took everything written to it.
func sslDrained(t *testing.T, w *os.File) {
	t.Helper()
	for i := 0; ; i++ {
		n, err := unix.IoctlGetInt(int(w.Fd()), unix.TIOCINQ)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if i == 3000 {
			t.Fatalf("s_server left %d bytes of its input unread", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
