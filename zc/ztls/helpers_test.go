package ztls

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/ktls"
	"github.com/zcnet/zcnet/internal/leakcheck"
	"github.com/zcnet/zcnet/tcpglue"
)

func TestMain(m *testing.M) {
	os.Exit(leakcheck.Main(m, 2*time.Second, leakcheck.Check{Name: "key log routes", Open: ktls.OpenRoutes}))
}

// Test certificates: one ECDSA and one RSA (TLS 1.2's ECDHE_ECDSA and ECDHE_RSA suites),
// both for "localhost" and 127.0.0.1, made once.
var (
	certOnce sync.Once
	ecCert   tls.Certificate
	rsaCert  tls.Certificate
	roots    *x509.CertPool
)

func makeCert(t testing.TB, key any, pub any) tls.Certificate {
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "ztls test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots.AddCert(c)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: c}
}

func certs(t testing.TB) {
	certOnce.Do(func() {
		roots = x509.NewCertPool()
		ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		ecCert = makeCert(t, ek, &ek.PublicKey)
		rk, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		rsaCert = makeCert(t, rk, &rk.PublicKey)
	})
}

// cipherCase is one version and cipher suite to negotiate.
type cipherCase struct {
	name    string
	version uint16
	suite   uint16
	aes     bool // the record cipher is AES-GCM (the standard library can encrypt it)
}

var allCiphers = []cipherCase{
	{"1.3/AES-128-GCM", tls.VersionTLS13, tls.TLS_AES_128_GCM_SHA256, true},
	{"1.3/AES-256-GCM", tls.VersionTLS13, tls.TLS_AES_256_GCM_SHA384, true},
	{"1.3/ChaCha20", tls.VersionTLS13, tls.TLS_CHACHA20_POLY1305_SHA256, false},
	{"1.2/ECDHE-ECDSA-AES-128-GCM", tls.VersionTLS12, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, true},
	{"1.2/ECDHE-RSA-AES-256-GCM", tls.VersionTLS12, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, true},
	{"1.2/ECDHE-RSA-ChaCha20", tls.VersionTLS12, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256, false},
}

// configs returns a server and a client config that can only agree on cc.
func configs(t testing.TB, cc cipherCase) (server, client *tls.Config) {
	certs(t)
	server = &tls.Config{MinVersion: cc.version, MaxVersion: cc.version}
	client = &tls.Config{MinVersion: cc.version, MaxVersion: cc.version, RootCAs: roots, ServerName: "localhost"}
	if cc.version == tls.VersionTLS12 {
		server.CipherSuites = []uint16{cc.suite}
		client.CipherSuites = []uint16{cc.suite}
	}
	// TLS 1.3's suites are not configurable in crypto/tls; the test's name says which
	// one it wants, and checkSuite checks that it got it.
	if cc.version == tls.VersionTLS12 && suiteUsesRSA(cc.suite) {
		server.Certificates = []tls.Certificate{rsaCert}
	} else {
		server.Certificates = []tls.Certificate{ecCert}
	}
	return server, client
}

func suiteUsesRSA(s uint16) bool {
	for _, cs := range tls.CipherSuites() {
		if cs.ID == s {
			return len(cs.Name) > 10 && cs.Name[:10] == "TLS_ECDHE_" && cs.Name[10:13] == "RSA"
		}
	}
	return false
}

// checkSuite reports whether the handshake got cc's cipher suite. crypto/tls cannot be
// told which TLS 1.3 suite to use (it picks AES-128-GCM on a CPU with AES, ChaCha20
// without), so for TLS 1.3 a different suite is reported, not fatal: the OpenSSL tests
// pick each suite. For TLS 1.2 it is fatal.
func checkSuite(t testing.TB, cc cipherCase, got uint16) bool {
	t.Helper()
	if got == cc.suite {
		return true
	}
	if cc.version == tls.VersionTLS13 {
		return false
	}
	t.Fatalf("negotiated %s, want %s", tls.CipherSuiteName(got), tls.CipherSuiteName(cc.suite))
	return false
}

// tcpPair returns the two ends of a loopback TCP connection (plain TCP, no MPTCP).
func tcpPair(t testing.TB) (dialed, accepted net.Conn) {
	t.Helper()
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var d net.Dialer
	d.SetMultipathTCP(false)
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	dialed, err = d.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		dialed.Close()
		t.Fatal(r.err)
	}
	t.Cleanup(func() { dialed.Close(); r.c.Close() })
	return dialed, r.c
}

var (
	probeOnce sync.Once
	probeErr  error
)

// kernelTLS reports whether this kernel has TLS. On one without the tls module it is
// false, except in the qemu guests of make test (ZCVM=1), where the test fails.
func kernelTLS(t testing.TB) bool {
	t.Helper()
	probeOnce.Do(func() { _, probeErr = tcpglue.ProbeTLS() })
	err := probeErr
	if err == nil {
		return true
	}
	if errors.Is(err, ErrNotSupported) && errors.Is(err, unix.ENOENT) && os.Getenv("ZCVM") != "1" {
		return false
	}
	t.Fatalf("kernel TLS: %v", err)
	return false
}

// pattern fills n bytes that differ by position and seed, so a lost, repeated or
// reordered byte shows.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

func firstDiff(a, b []byte) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("first difference at byte %d of %d/%d", i, len(a), len(b))
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(a), len(b))
}

// handshake runs the handshakes of z and its crypto/tls peer p at once, fails the test when
// either fails, and checks z's record path (checkPath).
func handshake(t *testing.T, z *Conn, p *tls.Conn) {
	t.Helper()
	hs := make(chan error, 1)
	go func() { hs <- p.Handshake() }()
	if err := z.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-hs; err != nil {
		t.Fatal(err)
	}
	checkPath(t, z)
}

// readUntilError reads z until Read fails, through buf: what it delivered before, and the
// error.
func readUntilError(z *Conn, buf []byte) ([]byte, error) {
	var got []byte
	for {
		n, err := z.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return got, err
		}
	}
}
