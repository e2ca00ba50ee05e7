package services

import (
	"cmp"
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
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/zc/ztls"
)

// The TLS modes (issue 28): one server program, three record layers.
const (
	// NetTLS is Go net + crypto/tls as Go users write it: tls.NewListener over the TCP
	// listener, net/http's server on it, io.CopyN(tlsConn, file) for a file.
	NetTLS = "net-tls"
	// NetTLSAA is NetTLS run again as a variant of its own: the TLS scenarios' A/A pair.
	NetTLSAA = "net-tls-aa"
	// ZTLS is zc/ztls with the records in the kernel (Options.NoFallback: a connection
	// kernel TLS cannot serve fails, it never falls back to user space unseen).
	ZTLS = "ztls"
	// ZTLSUser is zc/ztls with its user-space path forced (Options.UserSpace): what the
	// fallback costs against crypto/tls.
	ZTLSUser = "ztls-user"
)

// TLSMode is one server of the TLS scenarios (harness.HTTPSWrk, harness.FilesTLS). The
// servers differ only in the listener that wraps the TCP listener; everything above it
// (net/http, the file loop) is the same code. The clients are the same for every mode:
// wrk over https (it does not verify certificates) and crypto/tls clients with
// InsecureSkipVerify (the server's certificate is a self-signed one it made at start).
type TLSMode struct{ name string }

// TLSModes lists the TLS modes.
func TLSModes() []harness.Mode {
	return []harness.Mode{TLSMode{NetTLS}, TLSMode{NetTLSAA}, TLSMode{ZTLS}, TLSMode{ZTLSUser}}
}

// Name implements harness.Mode.
func (m TLSMode) Name() string { return m.name }

// Supports implements harness.ScenarioSupporter.
func (m TLSMode) Supports(s harness.Scenario) bool {
	return slices.Contains(harness.TLSScenarios, s)
}

// ServiceMode marks a harness.ServiceMode.
func (TLSMode) ServiceMode() {}

// Available implements harness.Mode: ztls needs kernel TLS (it never falls back
// silently; ztls-user is the fallback measured on its own).
func (m TLSMode) Available() error {
	if m.name != ZTLS {
		return nil
	}
	return KernelTLSAvailable()
}

// KernelTLSAvailable says whether the ztls mode can run here: nil, or "not available
// here: kernel TLS (CONFIG_TLS not set): <what ztls.Probe found>".
func KernelTLSAvailable() error {
	err := ztls.Probe()
	if err == nil {
		return nil
	}
	what := "kernel TLS"
	if strings.Contains(err.Error(), "CONFIG_TLS") {
		what = "kernel TLS (CONFIG_TLS not set)"
	}
	return fmt.Errorf("not available here: %s: %w", what, err)
}

// listener wraps the plain TCP listener in the mode's TLS.
func (m TLSMode) listener(ln net.Listener, cfg *tls.Config) net.Listener {
	switch m.name {
	case ZTLS:
		return ztls.NewListener(ln, cfg, &ztls.Options{NoFallback: true})
	case ZTLSUser:
		return ztls.NewListener(ln, cfg, &ztls.Options{UserSpace: true})
	}
	return tls.NewListener(ln, cfg)
}

// Server implements harness.Mode.
func (m TLSMode) Server(ctx context.Context, c harness.Case, mt *harness.Meter, ready func(string)) error {
	cfg, err := serverTLSConfig(mt)
	if err != nil {
		return err
	}
	ln, err := listenNet(ctx, c.Addr)
	if err != nil {
		return err
	}
	before := ztls.ReadStats()
	tl := m.listener(ln, cfg)
	var kept *keptConns
	if m.name == ZTLS {
		kept = &keptConns{Listener: tl}
		tl = kept
	}
	switch c.Scenario {
	case harness.HTTPSWrk:
		err = harness.ServeHTTP(c, mt, tl, ready)
	case harness.FilesTLS:
		err = filesTLS(c, mt, tl, ready)
	case harness.RelayTLS:
		err = serveTLS(c, mt, tl, ready, func(front net.Conn) error { return relayFront(ctx, c, front) })
	default:
		ln.Close()
		return fmt.Errorf("services: no %s server for %s", m.name, c.Scenario)
	}
	if m.name == ZTLS || m.name == ZTLSUser {
		after := ztls.ReadStats()
		kern, user, refused := after.Kernel-before.Kernel, after.User-before.User, after.Refused-before.Refused
		mt.Note("ztls_handshakes", fmt.Sprintf("kernel %d, user %d, refused %d", kern, user, refused))
		if kept != nil && refused > 0 {
			mt.Note("ztls_refused", kept.refusal())
		}
		// A refusal the client saw fails the case on the client's side (wrk counts a socket
		// error, a file client misses its bytes); one it did not is a connection the client
		// gave up on before its handshake (wrk closing at the end of its time: the kernel
		// refuses the ULP on a socket that is no longer established), noted above.
		if err == nil && m.name == ZTLS && (user > 0 || kern == 0) {
			err = fmt.Errorf("ztls: %d connections in the kernel, %d stayed in user space, %d refused (%s): not kernel TLS",
				kern, user, refused, kept.refusal())
		}
		if err == nil && m.name == ZTLSUser && kern > 0 {
			err = fmt.Errorf("ztls-user: %d connections went to the kernel", kern)
		}
	}
	return err
}

// Client implements harness.Mode: files-tls's (https's client is wrk, the harness's).
func (m TLSMode) Client(ctx context.Context, c harness.Case, mt *harness.Meter) error {
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13} // the server's certificate is self-signed
	if c.Scenario == harness.RelayTLS {
		return relayClientDial(ctx, c, mt, func(ctx context.Context) (halfCloser, error) {
			raw, err := dialNet(ctx, c.Addr)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(raw, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, fmt.Errorf("handshake: %w", err)
			}
			return tc, nil
		})
	}
	if c.Scenario != harness.FilesTLS {
		return fmt.Errorf("services: no %s client for %s", m.name, c.Scenario)
	}
	return filesClientDial(ctx, c, mt, func(ctx context.Context) (net.Conn, error) {
		raw, err := dialNet(ctx, c.Addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, fmt.Errorf("handshake: %w", err)
		}
		return tc, nil
	})
}

// serverTLSConfig is the server's configuration: a self-signed ECDSA P-256 certificate
// made now (before the server is ready: outside every measured window), TLS 1.3 only
// (crypto/tls then picks TLS_AES_128_GCM_SHA256 on a CPU with AES instructions). The
// first handshake notes the version and suite it negotiated.
func serverTLSConfig(m *harness.Meter) (*tls.Config, error) {
	cert, err := selfSigned()
	if err != nil {
		return nil, err
	}
	var once sync.Once
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS13,
		VerifyConnection: func(st tls.ConnectionState) error {
			once.Do(func() {
				m.Note("tls", tls.VersionName(st.Version)+" "+tls.CipherSuiteName(st.CipherSuite))
			})
			return nil
		},
	}, nil
}

// selfSigned makes a certificate for 127.0.0.1 and localhost, valid for a day.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "zcbench"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// filesTLS is the file server of files-tls, the same code for every TLS mode (only ln
// differs): accept c.Conns connections, a goroutine per connection that reads the
// client's request through TLS (the first read runs the handshake), opens the file and
// sends the slice with io.CopyN(conn, file, n), as Go users write it. crypto/tls's Conn
// has no ReadFrom, so that is io.Copy's loop (32 KiB reads of the file, records of up to
// 16 KiB); ztls's ReadFrom gives the file to the socket's sendfile under kernel TLS and
// runs the same io.Copy loop in user space.
func filesTLS(c harness.Case, m *harness.Meter, ln net.Listener, ready func(string)) error {
	return serveTLS(c, m, ln, ready, func(conn net.Conn) error { return sendSlice(conn, c.File) })
}

// relayFront is the TLS-terminating relay as Go users write it (relayNet's shape): dial
// the backend, a goroutine per direction, io.Copy, CloseWrite when a direction ends.
// Towards the client, io.Copy(front, back) is the TLS connection's ReadFrom where it has
// one (ztls: splice from the backend socket into the kernel-TLS socket, the kernel
// encrypts) and io.Copy's 32 KiB loop otherwise (crypto/tls); from the client,
// io.Copy(back, front) is the backend socket's ReadFrom, which copies through a buffer
// from a TLS connection (decrypted by crypto/tls, or by the kernel in ztls's Read).
func relayFront(ctx context.Context, c harness.Case, front net.Conn) error {
	defer front.Close()
	back, err := dialNet(ctx, c.Backend)
	if err != nil {
		return err
	}
	defer back.Close()
	fw, ok := front.(interface{ CloseWrite() error })
	if !ok {
		return fmt.Errorf("relay-tls: %T cannot half-close", front)
	}
	errs := make(chan error, 2)
	go func() {
		_, err := io.Copy(back, front)
		back.CloseWrite()
		errs <- err
	}()
	go func() {
		_, err := io.Copy(front, back)
		fw.CloseWrite()
		errs <- err
	}()
	return cmp.Or(<-errs, <-errs)
}

// serveTLS accepts c.Conns connections from the TLS listener and serves each with serve
// on a goroutine of its own, as Go servers do; the meter runs from the first accept to
// the end of the last connection.
func serveTLS(c harness.Case, m *harness.Meter, ln net.Listener, ready func(string), serve func(net.Conn) error) error {
	defer ln.Close()
	ready(ln.Addr().String())
	fail := newFirstErr()
	// The first failure (ztls refusing a connection it cannot move into the kernel) ends
	// the case now: no waiting for clients that will not come.
	fail.onErr = func() { ln.Close() }
	var wg sync.WaitGroup
	for range c.Conns {
		conn, err := ln.Accept()
		if err != nil {
			wg.Wait()
			if ferr := fail.get(); ferr != nil {
				return ferr
			}
			return err
		}
		m.Start()
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail.set(serve(conn))
		}()
	}
	wg.Wait()
	m.Stop()
	return fail.get()
}

// sendSlice serves one files-tls client and closes the connection (close_notify).
func sendSlice(conn net.Conn, file string) error {
	defer conn.Close()
	var req [fileReq]byte
	if _, err := io.ReadFull(conn, req[:]); err != nil {
		return fmt.Errorf("request: %w", err)
	}
	off, n := int64(binary.LittleEndian.Uint64(req[:])), int64(binary.LittleEndian.Uint64(req[8:]))
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return err
	}
	if _, err := io.CopyN(conn, f, n); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// keptConns keeps the connections a ztls listener accepted, to tell afterwards why any
// was refused (its handshake error: a *ztls.NoKernelError with the reason).
type keptConns struct {
	net.Listener
	mu    sync.Mutex
	conns []*ztls.Conn
}

func (k *keptConns) Accept() (net.Conn, error) {
	c, err := k.Listener.Accept()
	if zc, ok := c.(*ztls.Conn); ok {
		k.mu.Lock()
		k.conns = append(k.conns, zc)
		k.mu.Unlock()
	}
	return c, err
}

// refusal is the reason of the first refused connection, after the run ("" if none).
func (k *keptConns) refusal() string {
	if k == nil {
		return ""
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range k.conns {
		var nk *ztls.NoKernelError
		// Handshake returns the first call's result; the deadline in the past ends at
		// once one that never ran (the servers have closed every connection by now).
		c.SetDeadline(time.Unix(1, 0))
		if err := c.Handshake(); errors.As(err, &nk) {
			return nk.Reason
		}
	}
	return ""
}
