package ztls

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"io"
	"strings"
	"testing"
)

// TestKeysAgainstCryptoTLS checks ztls's key derivation and record sequence numbers
// against crypto/tls itself, without kernel TLS: ztls runs the handshake and derives the
// state the kernel would get; a user-space record layer built only from that state
// (AES-GCM from the standard library) then talks to a crypto/tls peer, both ways, with
// data the peer sent right after its handshake already waiting (it must not be lost, and
// a TLS 1.3 server's session ticket comes first). Every byte is compared.
func TestKeysAgainstCryptoTLS(t *testing.T) {
	for _, cc := range allCiphers {
		if !cc.aes {
			continue // ChaCha20-Poly1305: the guests' kernel test covers it
		}
		for _, v := range []struct {
			name                  string
			ztlsClient            bool
			clientAuth, resumeRun bool
		}{
			{"ztls-server", false, false, false},
			{"ztls-client", true, false, false},
			{"ztls-server/client-cert", false, true, false},
			{"ztls-client/resumed", true, false, true},
			{"ztls-server/resumed", false, false, true},
			{"ztls-server/hello-retry", false, false, false},
			{"ztls-client/hello-retry", true, false, false},
		} {
			t.Run(cc.name+"/"+v.name, func(t *testing.T) {
				scfg, ccfg := configs(t, cc)
				if v.clientAuth {
					scfg.ClientAuth = tls.RequireAnyClientCert
					ccfg.Certificates = scfg.Certificates
				}
				if strings.HasSuffix(v.name, "hello-retry") {
					// The client's first key share is one the server does not take:
					// TLS 1.3 sends a HelloRetryRequest (TLS 1.2 just picks P-256).
					ccfg.CurvePreferences = []tls.CurveID{tls.X25519, tls.CurveP256}
					scfg.CurvePreferences = []tls.CurveID{tls.CurveP256}
				}
				runs := 1
				if v.resumeRun {
					ccfg.ClientSessionCache = tls.NewLRUClientSessionCache(4)
					runs = 2
				}
				// One server config for every run, so a ticket of run 1 opens in run 2.
				zscfg := serverConfig(scfg)
				for run := 1; run <= runs; run++ {
					resumed, tickets := keysRun(t, cc, v.ztlsClient, zscfg, scfg, ccfg)
					switch {
					case v.resumeRun && v.ztlsClient && cc.version == tls.VersionTLS13 && tickets == 0:
						// A Go client asks for tickets only with a session cache.
						t.Errorf("run %d: no session ticket reached the soft layer", run)
					case v.resumeRun && !v.ztlsClient && run == 2 && cc.version == tls.VersionTLS13 && !resumed:
						t.Errorf("run 2 did not resume")
					case v.resumeRun && run == 2 && cc.version == tls.VersionTLS12 && resumed:
						// crypto/tls writes no key log line for a resumed TLS 1.2
						// session, so ztls declines TLS 1.2 resumption.
						t.Errorf("run 2 resumed a TLS 1.2 session")
					}
				}
			})
		}
	}
}

// keysRun is one connection of TestKeysAgainstCryptoTLS; it reports whether the
// crypto/tls peer resumed a session and how many session tickets the soft layer saw.
func keysRun(t *testing.T, cc cipherCase, ztlsClient bool, zscfg, scfg, ccfg *tls.Config) (bool, int) {
	a, b := tcpPair(t)
	fromPeer, fromZtls := pattern(200_000, 1), pattern(150_001, 2)
	type peerRes struct {
		got     []byte
		resumed bool
		suite   uint16
		err     error
	}
	done := make(chan peerRes, 1)
	go func() {
		var pc *tls.Conn
		if ztlsClient {
			pc = tls.Server(b, scfg)
		} else {
			pc = tls.Client(b, ccfg)
		}
		r := peerRes{}
		defer func() { done <- r }()
		if r.err = pc.Handshake(); r.err != nil {
			b.Close()
			return
		}
		st := pc.ConnectionState()
		r.resumed, r.suite = st.DidResume, st.CipherSuite
		// Sent before the other side has switched: it must reach the kernel's (here:
		// the soft layer's) first read, after any session ticket.
		if _, r.err = pc.Write(fromPeer); r.err != nil {
			return
		}
		r.got = make([]byte, len(fromZtls))
		_, r.err = io.ReadFull(pc, r.got)
		pc.Close()
	}()
	var (
		sc  *softConn
		err error
	)
	if ztlsClient {
		sc, err = softHandshake(a, Client(a, ccfg, nil))
	} else {
		sc, err = softHandshake(a, serverConn(a, zscfg))
	}
	if err != nil {
		a.Close()
		<-done
		t.Fatalf("handshake: %v", err)
	}
	werr := make(chan error, 1)
	go func() { werr <- sc.write(fromZtls) }()
	got, rerr := sc.readN(len(fromPeer))
	if err := <-werr; err != nil {
		t.Errorf("soft write: %v", err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("crypto/tls peer: %v", r.err)
	}
	if !checkSuite(t, cc, r.suite) {
		t.Logf("negotiated %s (crypto/tls chose it; the openssl test covers %s)", tls.CipherSuiteName(r.suite), cc.name)
	}
	if rerr != nil {
		t.Fatalf("soft read after %d bytes: %v", len(got), rerr)
	}
	if !bytes.Equal(got, fromPeer) {
		t.Fatalf("ztls side read: %s", firstDiff(got, fromPeer))
	}
	if !bytes.Equal(r.got, fromZtls) {
		t.Fatalf("crypto/tls peer read: %s", firstDiff(r.got, fromZtls))
	}
	return r.resumed, sc.tickets
}

// TestExpandLabelRFC8448 checks HKDF-Expand-Label against RFC 8448's simple 1-RTT trace
// (§3): the server's application traffic secret gives its write key and IV.
func TestExpandLabelRFC8448(t *testing.T) {
	unhex := func(s string) []byte {
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	secret := unhex("a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643")
	if got, want := expandLabel(sha256.New, secret, "key", 16), unhex("9f02283b6c9c07efc26bb9f2ac92e356"); !bytes.Equal(got, want) {
		t.Errorf("key %x, want %x", got, want)
	}
	if got, want := expandLabel(sha256.New, secret, "iv", 12), unhex("cf782b88dd83549aadf1e984"); !bytes.Equal(got, want) {
		t.Errorf("iv %x, want %x", got, want)
	}
}

// TestPRF12 checks the TLS 1.2 PRF (P_SHA256) against a published test vector
// (the IETF TLS list's, used by many implementations' tests).
func TestPRF12(t *testing.T) {
	secret, _ := hex.DecodeString("9bbe436ba940f017b17652849a71db35")
	seed, _ := hex.DecodeString("a0ba9f936cda311827a6f796ffd5198c")
	want, _ := hex.DecodeString("e3f229ba727be17b8d122620557cd453c2aab21d07c3d495329b52d4e61edb5a6b301791e90d35c9c9a46b4e14baf9af0fa022f7077def17abfd3797c0564bab4fbc91666e9def9b97fce34f796789baa48082d122ee42c5a72e5a5110fff70187347b66")
	got := prf12(sha256.New, secret, "test label", seed, len(want))
	if !bytes.Equal(got, want) {
		t.Fatalf("PRF:\n got %x\nwant %x", got, want)
	}
}
