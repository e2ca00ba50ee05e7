package zc

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"testing"
	"time"

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

// sslDigits is n ASCII digits from a seeded stream (s_server and s_client read letters
// on their input as commands).
func sslDigits(n int, seed uint64) []byte {
	b := make([]byte, n)
	newStreamGen(seed).fill(b)
	return testutil.ASCIIDigits(b)
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
	bin := testutil.OpenSSLBin(t)
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
	cl := testutil.StartSClient(t, bin, l.Addr().String(), sc.flags, toServer)
	errOut := cl.ErrOut
	c := recvEvent(t, conns, "accepted connection")
	checkSuite(t, c, sc)
	if got := h.waitFor(t, len(toServer), errOut.String); !bytes.Equal(got, toServer) {
		t.Fatalf("from s_client: %s", tlsFirstDiff(got, toServer))
	}
	if _, err := c.Write(toClient); err != nil {
		t.Fatal(err)
	}
	c.Close()
	cl.Exited(t) // s_client -quiet ends on close_notify
	if o := cl.Out.String(); o != string(toClient) {
		t.Fatalf("s_client got: %s", tlsFirstDiff([]byte(o), toClient))
	}
	<-c.Done()
}

// startSSLServer runs s_server for one connection and dials it with zc.
func startSSLServer(t *testing.T, bin string, e *Engine, opts *TLSOptions, h Handler, sc sslCase, quiet bool) (*Conn, *testutil.SServer) {
	t.Helper()
	tlsConfigs(t, sc.version)
	srv := testutil.StartSServer(t, bin, tlsCert, sc.flags, quiet)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := e.Dial(ctx, "tcp4", srv.Addr, h, DialOptions{TLS: opts})
	if err != nil {
		t.Fatalf("dial s_server: %v\n%s", err, srv.Out.String())
	}
	checkSuite(t, c, sc)
	return c, srv
}

func sslClientSide(t *testing.T, bin string, b Backend, sc sslCase) {
	e := newTLSEngine(t, b)
	_, ccfg := tlsConfigs(t, sc.version)
	h := newSSLCollector()
	c, srv := startSSLServer(t, bin, e, &TLSOptions{Config: ccfg}, h, sc, true)
	toClient, toServer := sslDigits(200_000, 23), sslDigits(200_007, 24)
	go srv.Stdin.Write(toClient)
	if got := h.waitFor(t, len(toClient), srv.Out.String); !bytes.Equal(got[:len(toClient)], toClient) {
		t.Fatalf("from s_server: %s", tlsFirstDiff(got, toClient))
	}
	if _, err := c.Write(toServer); err != nil {
		t.Fatal(err)
	}
	srv.Out.Wait(t, string(toServer), 1)
	c.Close()
	<-c.Done()
}

// TestTLSOpenSSLKeyUpdate: s_server sends KeyUpdates between lines of data ("k": not
// requested, "K": update_requested). The zc client reads on across them (new RX keys) and
// answers each request with a KeyUpdate of its own and new TX keys, sent by the engine
// before its next data; s_server then decrypts what zc sends. On the kernel path it needs
// Linux 6.14 (new keys on a socket).
func TestTLSOpenSSLKeyUpdate(t *testing.T) {
	bin := testutil.OpenSSLBin(t)
	if wantKernelTLS(t) {
		testutil.SkipIfNotSupported(t, tcpglue.ProbeTLSRekey(), "6.14")
	}
	for i, sc := range sslCases[:3] {
		b := tlsBackends[i%len(tlsBackends)]
		t.Run(sc.name+"/"+b.String(), func(t *testing.T) {
			e := newTLSEngine(t, b)
			_, ccfg := tlsConfigs(t, sc.version)
			h := newSSLCollector()
			c, srv := startSSLServer(t, bin, e, &TLSOptions{Config: ccfg}, h, sc, false)
			stdin, out := srv.Stdin, srv.Out
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
				srv.Drained(t) // s_server takes a command only as a line read alone
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
			out.Wait(t, "from-zc-after-rekey", 1)
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
