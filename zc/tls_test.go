package zc

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc/ztls"
)

// The TLS tests run wherever the kernel has TLS on the kernel path (the qemu guests of
// make test load the tls module: ZCVM=1 makes any other path a failure), and on this host
// (no CONFIG_TLS) on the user-space path, which they then check is the one taken and why.

var (
	tlsCertOnce sync.Once
	tlsCert     tls.Certificate
	tlsRoots    *x509.CertPool
)

func tlsConfigs(t testing.TB, version uint16) (server, client *tls.Config) {
	t.Helper()
	tlsCertOnce.Do(func() {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "zc tls test"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
			KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			panic(err)
		}
		leaf, _ := x509.ParseCertificate(der)
		tlsRoots = x509.NewCertPool()
		tlsRoots.AddCert(leaf)
		tlsCert = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k, Leaf: leaf}
	})
	server = &tls.Config{Certificates: []tls.Certificate{tlsCert}, MinVersion: version, MaxVersion: version}
	client = &tls.Config{RootCAs: tlsRoots, ServerName: "localhost", MinVersion: version, MaxVersion: version}
	return server, client
}

var tlsProbe = sync.OnceValue(func() error { _, err := tcpglue.ProbeTLS(); return err })

// wantKernelTLS reports whether connections should take the kernel path here: yes where
// the kernel has TLS; no on a kernel without the tls module (ENOENT at the ULP), except in
// the qemu guests (ZCVM=1), where that fails the test.
func wantKernelTLS(t testing.TB) bool {
	t.Helper()
	err := tlsProbe()
	if err == nil {
		return true
	}
	if errors.Is(err, ErrNotSupported) && errors.Is(err, unix.ENOENT) && os.Getenv("ZCVM") != "1" {
		return false
	}
	t.Fatalf("kernel TLS: %v", err)
	return false
}

// checkTLSPath fails unless c took the path this kernel allows (and says why not).
func checkTLSPath(t testing.TB, c *Conn) ConnStats {
	t.Helper()
	st := c.Stats()
	info := st.TLS
	if !info.On {
		t.Fatal("not a TLS connection")
	}
	if want := wantKernelTLS(t); info.Kernel != want {
		t.Fatalf("kernel path %v, want %v (reason %q)", info.Kernel, want, info.Reason)
	}
	if !info.Kernel && !strings.Contains(info.Reason, "CONFIG_TLS") {
		t.Fatalf("user space, reason %q does not name CONFIG_TLS", info.Reason)
	}
	if info.Version == 0 || info.CipherSuite == 0 {
		t.Fatalf("info %+v", info)
	}
	return st
}

var tlsBackends = []Backend{BackendIOUring, BackendPlain}

// tlsEngine starts an engine whose adaptive send policy would try SEND_ZC on every
// send of 4 KiB or more, so that a TLS connection that let it would show it.
func newTLSEngine(t *testing.T, b Backend) *Engine {
	t.Helper()
	return newEngine(t, Config{Backend: b, Queues: 2, ZCThreshold: 4096, NoFallback: true})
}

// randomWrites writes data in writes of random sizes (1 byte to 40 KiB: records of every
// size, and writes that end records early).
func randomWrites(w io.Writer, data []byte, seed uint64) error {
	r := mrand.New(mrand.NewPCG(seed, 1))
	for off := 0; off < len(data); {
		n := min(len(data)-off, 1+r.IntN(40<<10))
		if _, err := w.Write(data[off : off+n]); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// recordTap records the sizes of the TLS records that cross a net.Conn's reads.
type recordTap struct {
	net.Conn
	mu   sync.Mutex
	buf  []byte
	recs []int
	// flip, when set, corrupts the next record's body as it is read.
	flip bool
}

func (r *recordTap) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.mu.Lock()
	if r.flip && len(r.buf) == 0 && n > 5 {
		p[5] ^= 0x80 // the first byte of a record's body
		r.flip = false
	}
	r.buf = append(r.buf, p[:n]...)
	for len(r.buf) >= 5 {
		l := int(binary.BigEndian.Uint16(r.buf[3:]))
		if len(r.buf) < 5+l {
			break
		}
		r.recs = append(r.recs, l)
		r.buf = r.buf[5+l:]
	}
	r.mu.Unlock()
	return n, err
}

func (r *recordTap) last() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.recs) == 0 {
		return -1
	}
	return r.recs[len(r.recs)-1]
}

// dialTapped dials addr and runs a crypto/tls client (cfg) over a recordTap of the
// connection, with a deadline d from now. The caller closes the client.
func dialTapped(addr string, cfg *tls.Config, d time.Duration) (*tls.Conn, *recordTap, error) {
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	tap := &recordTap{Conn: raw}
	tc := tls.Client(tap, cfg)
	tc.SetDeadline(time.Now().Add(d))
	return tc, tap, nil
}

// closeNotifyLen is the size of an encrypted TLS 1.3 alert record (AES-GCM or
// ChaCha20-Poly1305): 2 bytes of alert, the content type and the 16-byte tag.
const closeNotifyLen = 2 + 1 + 16

// tlsCloseErrs keeps the servers' close errors, for failure messages.
var tlsCloseErrs sync.Map

func tlsCloseErrsString() string {
	var sb strings.Builder
	tlsCloseErrs.Range(func(k, v any) bool { fmt.Fprintf(&sb, "server conn %v closed: %v\n", k, v); return true })
	return sb.String()
}

// tlsServerEcho listens with TLS on e; each connection echoes with SendData and closes
// after the peer's EOF. conns receives the connections, ends their OnEOF errors.
func tlsServerEcho(t *testing.T, e *Engine, opts *TLSOptions, conns chan *Conn, ends chan error) *Listener {
	t.Helper()
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		conns <- c
		return HandlerFuncs{
			Data: func(c *Conn, d Data) {
				if err := c.SendData(d); err != nil {
					d.Release()
				}
			},
			EOF: func(c *Conn, err error) {
				ends <- err
				c.Close()
			},
			Close: func(c *Conn, err error) {
				if err != nil {
					tlsCloseErrs.Store(c.RemoteAddr().String(), err)
				}
			},
		}
	}, ListenOptions{TLS: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestTLSServerEcho: crypto/tls clients against a TLS listener, TLS 1.2 and 1.3, every
// byte of 3 MiB written in random sizes echoed back through the handler (decrypted Data
// sent again with SendData); the client's close_notify is the handler's io.EOF, and the
// server's Close sends one (the last record the client reads is an encrypted alert). No
// SEND_ZC is ever attempted on the connections.
func TestTLSServerEcho(t *testing.T) {
	for _, b := range tlsBackends {
		for _, v := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
			t.Run(fmt.Sprintf("%v/%s", b, tls.VersionName(v)), func(t *testing.T) {
				e := newTLSEngine(t, b)
				scfg, ccfg := tlsConfigs(t, v)
				conns, ends := make(chan *Conn, 4), make(chan error, 4)
				l := tlsServerEcho(t, e, &TLSOptions{Config: scfg}, conns, ends)
				const clients = 2
				errs := make(chan error, clients)
				for i := range clients {
					go func() { errs <- tlsEchoClient(l.Addr().String(), ccfg, v, 3<<20, uint64(i+1)) }()
				}
				for range clients {
					c := recvEvent(t, conns, "accepted connection")
					checkTLSPath(t, c)
					if c.LocalAddr() == nil || c.LocalAddr().String() != l.Addr().String() || c.RemoteAddr() == nil {
						t.Fatalf("addresses %v %v, want the TCP socket's (listener %v)", c.LocalAddr(), c.RemoteAddr(), l.Addr())
					}
					<-c.Done()
					if st := c.Stats(); st.SendZCOps != 0 || st.BytesSentZC+st.BytesZCCopied != 0 {
						t.Fatalf("SEND_ZC attempted on a TLS connection: %+v", st)
					}
				}
				for range clients {
					if err := recvEvent(t, errs, "client"); err != nil {
						t.Fatalf("%v\n%s", err, engineDump(e)+tlsCloseErrsString())
					}
					if err := recvEvent(t, ends, "server EOF"); err != io.EOF {
						t.Fatalf("server OnEOF: %v, want io.EOF", err)
					}
				}
				st := e.Stats()
				if st.Send.ZCOps != 0 {
					t.Fatalf("engine sent %d SEND_ZC operations", st.Send.ZCOps)
				}
				if st.TLS.Kernel+st.TLS.User != clients {
					t.Fatalf("TLS stats %+v, want %d handshakes", st.TLS, clients)
				}
				if wantKernelTLS(t) && st.TLS.CloseNotifies != clients {
					t.Fatalf("TLS stats %+v: want %d close_notify sent by the kernel path", st.TLS, clients)
				}
				// The kernel's own counters come with Stats once the kernel has records.
				if kc := st.TLS.KernelCounters; wantKernelTLS(t) != (kc != nil) || (kc != nil && (kc["TlsTxSw"] == 0 || kc["TlsRxSw"] == 0)) {
					t.Fatalf("Stats.TLS.KernelCounters %v with the kernel path %v", kc, wantKernelTLS(t))
				}
			})
		}
	}
}

// tlsEchoClient writes n bytes through crypto/tls, half-closes (close_notify), reads the
// echo and checks every byte and that the stream ended with an encrypted alert record.
func tlsEchoClient(addr string, cfg *tls.Config, v uint16, n int, seed uint64) error {
	tc, tap, err := dialTapped(addr, cfg, 2*time.Minute)
	if err != nil {
		return err
	}
	defer tc.Close()
	data := make([]byte, n)
	newStreamGen(seed).fill(data)
	werr := make(chan error, 1)
	go func() {
		err := randomWrites(tc, data, seed)
		if err == nil {
			err = tc.CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(tc)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("echo differs: %s", tlsFirstDiff(got, data))
	}
	if want := closeNotifyLen; v == tls.VersionTLS13 && tap.last() != want {
		return fmt.Errorf("the last record was %d bytes, want an encrypted alert (%d): no close_notify", tap.last(), want)
	}
	if v == tls.VersionTLS12 && tap.last() != 2+8+16 {
		return fmt.Errorf("the last record was %d bytes, want an encrypted alert (26): no close_notify", tap.last())
	}
	return nil
}

func tlsFirstDiff(a, b []byte) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("first difference at byte %d of %d/%d", i, len(a), len(b))
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(a), len(b))
}

// tlsCollector is a client handler that keeps what it receives.
// endEcho half-closes c (a client of tlsPeerServer's echo), waits for the server's
// close_notify (OnEOF io.EOF) and the server's end, checks that h got data back, and
// closes c.
func endEcho(t *testing.T, c *Conn, h *tlsCollector, sres chan error, data []byte) {
	t.Helper()
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := recvEvent(t, h.eof, "EOF"); err != io.EOF {
		t.Fatalf("OnEOF %v, want io.EOF (the server's close_notify)", err)
	}
	if err := recvEvent(t, sres, "server"); err != nil {
		t.Fatalf("the crypto/tls server: %v", err)
	}
	if got := h.bytes(); !bytes.Equal(got, data) {
		t.Fatalf("echo differs: %s", tlsFirstDiff(got, data))
	}
	c.Close()
	<-c.Done()
}

type tlsCollector struct {
	mu   sync.Mutex
	got  []byte
	eof  chan error
	done chan error
}

func newTLSCollector() *tlsCollector {
	return &tlsCollector{eof: make(chan error, 1), done: make(chan error, 1)}
}

func (h *tlsCollector) OnData(c *Conn, d Data) {
	h.mu.Lock()
	h.got = append(h.got, d.Bytes()...)
	h.mu.Unlock()
	d.Release()
}
func (h *tlsCollector) OnEOF(c *Conn, err error)   { h.eof <- err }
func (h *tlsCollector) OnClose(c *Conn, err error) { h.done <- err }

func (h *tlsCollector) bytes() []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.got
}

// tlsListen starts a TLS listener (scfg) on e at 127.0.0.1; conns receives each
// connection, which accept then serves.
func tlsListen(e *Engine, scfg *tls.Config, conns chan *Conn, accept func(*Conn) Handler) (*Listener, error) {
	return e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		conns <- c
		return accept(c)
	}, ListenOptions{TLS: &TLSOptions{Config: scfg}})
}

// listen is tlsListen with h collecting every connection.
func (h *tlsCollector) listen(e *Engine, scfg *tls.Config, conns chan *Conn) (*Listener, error) {
	return tlsListen(e, scfg, conns, func(*Conn) Handler { return h })
}

// handshakeTLSClient runs a crypto/tls client (ccfg) over raw, a minute's deadline on it,
// through its handshake, and returns it with the server's connection from conns, whose
// record path it checks (checkTLSPath). The caller closes the client.
func handshakeTLSClient(t *testing.T, raw net.Conn, ccfg *tls.Config, conns chan *Conn) (*tls.Conn, *Conn) {
	t.Helper()
	tc := tls.Client(raw, ccfg)
	tc.SetDeadline(time.Now().Add(time.Minute))
	if err := tc.Handshake(); err != nil {
		tc.Close()
		t.Fatal(err)
	}
	c := recvEvent(t, conns, "conn")
	checkTLSPath(t, c)
	return tc, c
}

// tlsPeerServer runs a crypto/tls echo server for one connection: it echoes until the
// client's close_notify, then closes (its close_notify). It reports the server's end.
func tlsPeerServer(t *testing.T, cfg *tls.Config, serve func(tc *tls.Conn) error) (string, chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	res := make(chan error, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			res <- err
			return
		}
		tc := tls.Server(raw, cfg)
		defer tc.Close()
		tc.SetDeadline(time.Now().Add(2 * time.Minute))
		res <- serve(tc)
	}()
	return ln.Addr().String(), res
}

// TestTLSClientEcho: the dial side, against a crypto/tls echo server: 3 MiB written with
// Write (random sizes) come back through the handler, every byte checked; CloseWrite sends
// close_notify (the server's Read ends with io.EOF), and the server's close_notify is the
// handler's io.EOF.
func TestTLSClientEcho(t *testing.T) {
	for _, b := range tlsBackends {
		for _, v := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
			t.Run(fmt.Sprintf("%v/%s", b, tls.VersionName(v)), func(t *testing.T) {
				e := newTLSEngine(t, b)
				scfg, ccfg := tlsConfigs(t, v)
				addr, sres := tlsPeerServer(t, scfg, func(tc *tls.Conn) error {
					if _, err := io.Copy(tc, tc); err != nil {
						return err
					}
					return tc.Close()
				})
				h := newTLSCollector()
				c, err := e.Dial(context.Background(), "tcp", addr, h, DialOptions{TLS: &TLSOptions{Config: ccfg}})
				if err != nil {
					t.Fatal(err)
				}
				checkTLSPath(t, c)
				data := make([]byte, 3<<20)
				newStreamGen(7).fill(data)
				if err := randomWrites(c, data, 7); err != nil {
					t.Fatal(err)
				}
				endEcho(t, c, h, sres, data)
				if st := c.Stats(); st.SendZCOps != 0 {
					t.Fatalf("SEND_ZC attempted: %+v", st)
				}
			})
		}
	}
}

// TestTLSSendFile: SendFile under TLS (sendfile, the kernel encrypting on the kernel
// path), between Writes, to a crypto/tls client: every byte in order.
func TestTLSSendFile(t *testing.T) {
	for _, b := range tlsBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := newTLSEngine(t, b)
			scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
			f, fdata := streamFile(t, 11, 3<<20+123)
			var want []byte
			want = append(want, "head:"...)
			want = append(want, fdata[1000:]...)
			want = append(want, ":mid:"...)
			want = append(want, fdata[:1000]...)
			want = append(want, ":tail"...)
			conns := make(chan *Conn, 1)
			l, err := tlsListen(e, scfg, conns, func(c *Conn) Handler {
				c.Write([]byte("head:"))
				if err := c.SendFile(f, 1000, int64(len(fdata)-1000)); err != nil {
					t.Error(err)
				}
				c.Write([]byte(":mid:"))
				if err := c.SendFile(f, 0, 1000); err != nil {
					t.Error(err)
				}
				c.Write([]byte(":tail"))
				c.Close()
				return HandlerFuncs{}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			tc, tap, err := dialTapped(l.Addr().String(), ccfg, 2*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer tc.Close()
			got, err := io.ReadAll(tc)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("differs: %s", tlsFirstDiff(got, want))
			}
			if tap.last() != closeNotifyLen {
				t.Fatalf("last record %d bytes: no close_notify", tap.last())
			}
			c := recvEvent(t, conns, "conn")
			checkTLSPath(t, c)
			<-c.Done()
			if st := c.Stats(); st.SendZCOps != 0 {
				t.Fatalf("SEND_ZC attempted: %+v", st)
			}
		})
	}
}

// TestTLSAlert: the peer's fatal alert ends the connection with a *tcpglue.TLSAlertError
// (Received) on both paths: the client corrupts a record it receives, so crypto/tls sends
// bad_record_mac (encrypted) and the handler's OnEOF gets it.
func TestTLSAlert(t *testing.T) {
	for _, b := range tlsBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := newTLSEngine(t, b)
			scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
			ends := make(chan error, 1)
			conns := make(chan *Conn, 1)
			l, err := tlsListen(e, scfg, conns, func(c *Conn) Handler {
				return HandlerFuncs{
					Data: func(c *Conn, d Data) {
						d.Release()
						c.Write([]byte("answer"))
					},
					EOF: func(c *Conn, err error) { ends <- err },
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			tc, tap, err := dialTapped(l.Addr().String(), ccfg, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer tc.Close()
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			tap.mu.Lock()
			tap.flip = true
			tap.mu.Unlock()
			if _, err := tc.Write([]byte("ask")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			if _, err := tc.Read(buf); err == nil {
				t.Fatal("read a corrupted record without an error")
			}
			c := recvEvent(t, conns, "conn")
			checkTLSPath(t, c)
			err = recvEvent(t, ends, "OnEOF")
			var ae *tcpglue.TLSAlertError
			if !errors.As(err, &ae) || ae.Alert != 20 || !ae.Received {
				t.Fatalf("OnEOF %v, want a received bad_record_mac *tcpglue.TLSAlertError", err)
			}
			<-c.Done()
		})
	}
}

// TestTLSNoFallback: where the kernel has no TLS, NoFallback refuses Listen and Dial with
// a typed error matching ErrNotSupported; where it has, the connections take the kernel
// path. UserSpace keeps the records in crypto/tls, and says so.
func TestTLSNoFallback(t *testing.T) {
	e := newTLSEngine(t, BackendIOUring)
	scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
	_, lerr := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler { return HandlerFuncs{} }, ListenOptions{TLS: &TLSOptions{Config: scfg, NoFallback: true}})
	_, derr := e.Dial(context.Background(), "tcp", "127.0.0.1:1", HandlerFuncs{}, DialOptions{TLS: &TLSOptions{Config: ccfg, NoFallback: true}})
	if !wantKernelTLS(t) {
		var nse *NotSupportedError
		for _, err := range []error{lerr, derr} {
			if !errors.Is(err, ErrNotSupported) || !errors.As(err, &nse) || !strings.Contains(err.Error(), "CONFIG_TLS") {
				t.Fatalf("NoFallback: %v, want a *NotSupportedError naming CONFIG_TLS", err)
			}
		}
	} else if lerr != nil {
		t.Fatalf("NoFallback on a kernel with TLS: %v", lerr)
	}
	conns, ends := make(chan *Conn, 1), make(chan error, 1)
	l := tlsServerEcho(t, e, &TLSOptions{Config: scfg, UserSpace: true}, conns, ends)
	if err := tlsEchoClient(l.Addr().String(), ccfg, tls.VersionTLS13, 100<<10, 3); err != nil {
		t.Fatal(err)
	}
	c := recvEvent(t, conns, "conn")
	if info := c.Stats().TLS; info.Kernel || !strings.Contains(info.Reason, "UserSpace") {
		t.Fatalf("UserSpace: %+v", info)
	}
	if st := e.Stats().TLS; st.User != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTLSMisuse: bad options are typed errors that change nothing; a failed handshake is
// Dial's error; a peer that never speaks does not hold Engine.Close up (the handshake's
// wait is woken) and leaks nothing.
func TestTLSMisuse(t *testing.T) {
	e := newTLSEngine(t, BackendIOUring)
	scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
	accept := func(c *Conn) Handler { return HandlerFuncs{} }
	var ce *ConfigError
	if _, err := e.Listen("tcp", "127.0.0.1:0", accept, ListenOptions{TLS: &TLSOptions{}}); !errors.As(err, &ce) {
		t.Fatalf("nil Config: %v", err)
	}
	if _, err := e.Listen("tcp", "127.0.0.1:0", accept, ListenOptions{TLS: &TLSOptions{Config: scfg, NoFallback: true, UserSpace: true}}); !errors.As(err, &ce) {
		t.Fatalf("NoFallback+UserSpace: %v", err)
	}
	if _, err := e.Listen("tcp", "127.0.0.1:0", accept, ListenOptions{TLS: &TLSOptions{Config: scfg}, ReadSelf: true}); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("ReadSelf+TLS: %v", err)
	}
	em := newEngine(t, Config{Backend: BackendIOUring, RecvPath: RecvMapped})
	if _, err := em.Dial(context.Background(), "tcp", "127.0.0.1:1", HandlerFuncs{}, DialOptions{TLS: &TLSOptions{Config: ccfg}}); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("RecvMapped+TLS: %v", err)
	}
	// A client that does not trust the server: the dial fails with the handshake's error.
	l, err := e.Listen("tcp", "127.0.0.1:0", accept, ListenOptions{TLS: &TLSOptions{Config: scfg}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	bad := ccfg.Clone()
	bad.RootCAs = x509.NewCertPool()
	if _, err := e.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{}, DialOptions{TLS: &TLSOptions{Config: bad}}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted server: %v", err)
	}
	// A handshake that never ends: the context ends the dial.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := e.Dial(ctx, "tcp", silent.Addr().String(), HandlerFuncs{}, DialOptions{TLS: &TLSOptions{Config: ccfg}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("silent server: %v, want the context's error", err)
	}
	// A client that never sends its ClientHello: Engine.Close wakes the handshake.
	e2 := newTLSEngine(t, BackendPlain)
	l2, err := e2.Listen("tcp", "127.0.0.1:0", accept, ListenOptions{TLS: &TLSOptions{Config: scfg}})
	if err != nil {
		t.Fatal(err)
	}
	s := dialPlain(t, l2.Addr().String())
	defer s.Close()
	for l2.Stats().Accepted == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := e2.Close(); err != nil {
		t.Fatal(err)
	}
	if st := e2.Stats().TLS; st.HandshakeErrors != 1 {
		t.Fatalf("stats %+v, want the handshake Close ended counted", st)
	}
}

// TestTLSKeyUpdate: a peer that updates its keys every 8 records (zc/ztls on the kernel
// path, RekeyRecords) sends 1 MiB through the echo: each KeyUpdate ends a receive with
// EKEYEXPIRED or EIO, the queue reads the record, gives the kernel the next RX keys and
// receives on; every byte comes back. It needs kernel TLS on both sides (the qemu guests)
// and a kernel that takes new keys (Linux 6.14).
func TestTLSKeyUpdate(t *testing.T) {
	if !wantKernelTLS(t) {
		t.Skip("no kernel TLS here (CONFIG_TLS is not set): the qemu guests run it")
	}
	testutil.SkipIfNotSupported(t, tcpglue.ProbeTLSRekey(), "6.14")
	for _, b := range tlsBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := newTLSEngine(t, b)
			scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
			conns, ends := make(chan *Conn, 1), make(chan error, 1)
			l := tlsServerEcho(t, e, &TLSOptions{Config: scfg}, conns, ends)
			zt := rekeyingEcho(t, e, l.Addr().String(), ccfg, 5, time.Minute)
			c := recvEvent(t, conns, "conn")
			checkTLSPath(t, c)
			<-c.Done()
			info := c.Stats().TLS
			if info.KeyUpdates == 0 || zt.Info().TxRekeys == 0 {
				t.Fatalf("the peer rekeyed %d times, the server applied %d KeyUpdates", zt.Info().TxRekeys, info.KeyUpdates)
			}
			if st := e.Stats().TLS; st.KeyUpdates != info.KeyUpdates || st.ControlRecords < st.KeyUpdates {
				t.Fatalf("stats %+v, conn %+v", st, info)
			}
		})
	}
}

// rekeyingEcho dials addr (an echo) with a zc/ztls client that updates its keys every 8
// records on the kernel path, writes 1 MiB of seed's stream in random writes, half-closes,
// and checks that every byte comes back; it returns the client (closed at the test's end).
func rekeyingEcho(t *testing.T, e *Engine, addr string, ccfg *tls.Config, seed uint64, limit time.Duration) *ztls.Conn {
	t.Helper()
	var d net.Dialer
	d.SetMultipathTCP(false)
	raw, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	zt := ztls.Client(raw, ccfg, &ztls.Options{RekeyRecords: 8, NoFallback: true})
	t.Cleanup(func() { zt.Close() })
	zt.SetDeadline(time.Now().Add(limit))
	if err := zt.Handshake(); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 1<<20)
	newStreamGen(seed).fill(data)
	werr := make(chan error, 1)
	go func() {
		err := randomWrites(zt, data, seed)
		if err == nil {
			err = zt.CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(zt)
	if err != nil {
		t.Fatalf("%v (read %d of %d bytes, the client rekeyed %d times)\n%s", err, len(got), len(data), zt.Info().TxRekeys, engineDump(e)+tlsCloseErrsString())
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("echo differs: %s", tlsFirstDiff(got, data))
	}
	return zt
}

// echoBackend is a plain TCP server on 127.0.0.1 that echoes every connection until its
// EOF, then closes it; the test's end closes the listener.
func echoBackend(t *testing.T) net.Listener {
	t.Helper()
	backend, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				// Through a buffer: Go's own splice would keep pipes in its
				// pool, which the leak check counts.
				io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, make([]byte, 32<<10))
			}()
		}
	}()
	return backend
}

// TestTLSRelay: a TLS-terminating relay: crypto/tls clients → a TLS listener → Relay → a
// plain TCP backend that echoes. Every byte of 2 MiB (random writes) comes back through
// both conversions; the client's close_notify reaches the backend as its EOF and the
// backend's FIN comes back as the server's close_notify. The relay splices (on the kernel
// path from Linux 6.14, the control records read between splices; before it SendData), on
// the user-space path the socket pair.
func TestTLSRelay(t *testing.T) {
	for _, b := range tlsBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := newTLSEngine(t, b)
			scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
			backend := echoBackend(t)
			relays := make(chan *RelayStats, 1)
			pair := make(chan *Conn, 2)
			l, err := e.Listen("tcp", "127.0.0.1:0", func(front *Conn) Handler {
				pair <- front
				front.SetReceivePaused(true)
				e.DialAsync(context.Background(), "tcp", backend.Addr().String(), HandlerFuncs{}, func(back *Conn, err error) {
					if err != nil {
						front.Close()
						return
					}
					pair <- back
					r, err := Relay(front, back)
					if err != nil {
						t.Error(err)
					}
					relays <- r
				})
				return HandlerFuncs{}
			}, ListenOptions{TLS: &TLSOptions{Config: scfg}})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if err := tlsEchoClient(l.Addr().String(), ccfg, tls.VersionTLS13, 2<<20, 9); err != nil {
				t.Fatalf("%v\n%s", err, engineDump(e))
			}
			r := recvEvent(t, relays, "relay")
			if r.AtoB.Load() != 2<<20 || r.BtoA.Load() != 2<<20 {
				t.Fatalf("relay forwarded %d and %d bytes", r.AtoB.Load(), r.BtoA.Load())
			}
			if want := tlsRelayPath(t); r.Path != want {
				t.Fatalf("relay path %v (fallback %v), want %v", r.Path, r.Fallback, want)
			}
			for range 2 {
				<-recvEvent(t, pair, "relayed connection").Done() // the relay closes both
			}
		})
	}
}

// TestTLSFanOut: FanOut's shared sends to TLS subscribers: one buffer per message goes to
// three crypto/tls clients (the kernel encrypts it once per connection on the kernel
// path), every byte of 800 KiB arrives at each, and no SEND_ZC is attempted.
func TestTLSFanOut(t *testing.T) {
	for _, b := range tlsBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := newTLSEngine(t, b)
			scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
			ready := make(chan struct{}, 1)
			fan, err := NewFanOut(FanOutOptions{Policy: FanOutPause, MaxQueued: 256 << 10, OnReady: func() {
				select {
				case ready <- struct{}{}:
				default:
				}
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer fan.Close()
			joined := make(chan *Conn, 3)
			l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
				if err := fan.Add(c); err != nil {
					t.Error(err)
				}
				joined <- c
				return HandlerFuncs{}
			}, ListenOptions{TLS: &TLSOptions{Config: scfg}})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			const msgs, size = 200, 4096
			want := make([]byte, msgs*size)
			newStreamGen(21).fill(want)
			got := make(chan error, 3)
			for range 3 {
				tc, err := tls.Dial("tcp", l.Addr().String(), ccfg)
				if err != nil {
					t.Fatal(err)
				}
				defer tc.Close()
				tc.SetDeadline(time.Now().Add(2 * time.Minute))
				go func() {
					p := make([]byte, len(want))
					_, err := io.ReadFull(tc, p)
					if err == nil && !bytes.Equal(p, want) {
						err = fmt.Errorf("differs: %s", tlsFirstDiff(p, want))
					}
					got <- err
				}()
			}
			var c *Conn
			var subs []*Conn
			for range 3 {
				c = recvEvent(t, joined, "subscriber")
				subs = append(subs, c)
			}
			for i := range msgs {
				buf, err := c.BufferWait(time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				n := copy(buf.Bytes(), want[i*size:(i+1)*size])
				for {
					err = fan.Publish(buf, n)
					if !errors.Is(err, ErrWouldBlock) {
						break
					}
					recvEvent(t, ready, "OnReady")
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			for range 3 {
				if err := recvEvent(t, got, "subscriber read"); err != nil {
					t.Fatalf("%v\n%s", err, engineDump(e))
				}
			}
			if st := e.Stats(); st.Send.SharedSends == 0 || st.Send.ZCOps != 0 {
				t.Fatalf("shared sends %d, SEND_ZC %d", st.Send.SharedSends, st.Send.ZCOps)
			}
			for _, s := range subs {
				checkTLSPath(t, s)
			}
		})
	}
}
