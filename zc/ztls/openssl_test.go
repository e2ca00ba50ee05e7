package ztls

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"

	"github.com/zcnet/zcnet/internal/testutil"
)

// OpenSSL interop: s_client and s_server (Debian's openssl package; make test installs
// it, and the guests need it for these tests) against ztls, every cipher of both
// versions, both roles. OpenSSL, unlike crypto/tls, lets a test pick each TLS 1.3
// cipher suite, and sends KeyUpdates on request.

type opensslCase struct {
	cc    cipherCase
	flags []string
}

var opensslCases = []opensslCase{
	{allCiphers[0], []string{"-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"}},
	{allCiphers[1], []string{"-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384"}},
	{allCiphers[2], []string{"-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"}},
	{allCiphers[3], []string{"-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"}},
	{allCiphers[4], []string{"-tls1_2", "-cipher", "ECDHE-RSA-AES256-GCM-SHA384"}},
	{allCiphers[5], []string{"-tls1_2", "-cipher", "ECDHE-RSA-CHACHA20-POLY1305"}},
}

// digits is a pattern of ASCII digits (s_server reads some letters on stdin as commands).
func digits(n int, seed byte) []byte { return testutil.ASCIIDigits(pattern(n, seed)) }

// TestOpenSSL: ztls server against s_client and ztls client against s_server, 200 KB each
// way checked byte for byte, close_notify at the end.
func TestOpenSSL(t *testing.T) {
	bin := testutil.OpenSSLBin(t)
	for _, oc := range opensslCases {
		t.Run(oc.cc.name+"/ztls-server", func(t *testing.T) { opensslServerSide(t, bin, oc) })
		t.Run(oc.cc.name+"/ztls-client", func(t *testing.T) { opensslClientSide(t, bin, oc) })
	}
}

func opensslServerSide(t *testing.T, bin string, oc opensslCase) {
	scfg, _ := configs(t, oc.cc)
	ln, err := Listen("tcp4", "127.0.0.1:0", scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	toServer, toClient := digits(200_000, 21), digits(200_003, 22)
	cl := testutil.StartSClient(t, bin, ln.Addr().String(), oc.flags, toServer)
	errOut := cl.ErrOut
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	z := nc.(*Conn)
	defer z.Close()
	if err := z.Handshake(); err != nil {
		t.Fatalf("handshake: %v\n%s", err, errOut.String())
	}
	if got := z.ConnectionState().CipherSuite; got != oc.cc.suite {
		t.Fatalf("negotiated %s", tls.CipherSuiteName(got))
	}
	checkPath(t, z)
	got := make([]byte, len(toServer))
	if _, err := io.ReadFull(z, got); err != nil {
		t.Fatalf("read: %v\n%s", err, errOut.String())
	}
	if !bytes.Equal(got, toServer) {
		t.Fatalf("read: %s", firstDiff(got, toServer))
	}
	if _, err := z.Write(toClient); err != nil {
		t.Fatal(err)
	}
	z.Close() // s_client -quiet exits on close_notify
	cl.Exited(t)
	if o := cl.Out.String(); o != string(toClient) {
		t.Fatalf("s_client got: %s", firstDiff([]byte(o), toClient))
	}
}

// startSServer runs s_server for one connection and dials it with ztls.
func startSServer(t *testing.T, bin string, oc opensslCase, quiet bool) (*Conn, *testutil.SServer) {
	t.Helper()
	scfg, ccfg := configs(t, oc.cc)
	srv := testutil.StartSServer(t, bin, scfg.Certificates[0], oc.flags, quiet)
	var d net.Dialer
	d.SetMultipathTCP(false)
	raw, err := d.Dial("tcp4", srv.Addr)
	if err != nil {
		t.Fatalf("dial s_server: %v\n%s", err, srv.Out.String())
	}
	z := Client(raw, ccfg, nil)
	t.Cleanup(func() { z.Close() })
	if err := z.Handshake(); err != nil {
		t.Fatalf("handshake: %v\n%s", err, srv.Out.String())
	}
	if got := z.ConnectionState().CipherSuite; got != oc.cc.suite {
		t.Fatalf("negotiated %s", tls.CipherSuiteName(got))
	}
	checkPath(t, z)
	return z, srv
}

func opensslClientSide(t *testing.T, bin string, oc opensslCase) {
	z, srv := startSServer(t, bin, oc, true)
	toClient, toServer := digits(200_000, 23), digits(200_007, 24)
	errc := make(chan error, 1)
	go func() {
		_, err := srv.Stdin.Write(toClient)
		errc <- err
	}()
	got := make([]byte, len(toClient))
	if _, err := io.ReadFull(z, got); err != nil {
		t.Fatalf("read: %v\n%s", err, srv.Out.String())
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, toClient) {
		t.Fatalf("read: %s", firstDiff(got, toClient))
	}
	if _, err := z.Write(toServer); err != nil {
		t.Fatal(err)
	}
	srv.Out.Wait(t, string(toServer), 1)
	z.Close()
	srv.Exited(t) // s_server ends after its one connection
}

// TestOpenSSLKeyUpdate: s_server sends KeyUpdates ("k": not requested, "K": requested)
// between data; ztls reads on across them and, when asked, updates its own keys, after
// which s_server still reads what ztls sends. The kernel path needs Linux 6.14.
func TestOpenSSLKeyUpdate(t *testing.T) {
	bin := testutil.OpenSSLBin(t)
	for _, oc := range opensslCases[:3] {
		t.Run(oc.cc.name, func(t *testing.T) {
			z, srv := startSServer(t, bin, oc, false)
			stdin, out := srv.Stdin, srv.Out
			r := bufio.NewReader(z)
			for i, cmd := range []string{"k", "K", "K", "k"} {
				line := "line-" + strconv.Itoa(i) + "\n"
				if _, err := io.WriteString(stdin, line); err != nil {
					t.Fatal(err)
				}
				got, err := r.ReadString('\n')
				if errors.Is(err, ErrNotSupported) {
					testutil.SkipIfNotSupported(t, err, "6.14")
				}
				if err != nil {
					t.Fatalf("read: %v\n%s", err, out.String())
				}
				if got != line {
					t.Fatalf("read %q, want %q", got, line)
				}
				if _, err := io.WriteString(stdin, cmd+"\n"); err != nil {
					t.Fatal(err)
				}
				// s_server takes a command only as a line read alone: wait until it
				// has read the pipe empty before the next line.
				srv.Drained(t)
			}
			if _, err := io.WriteString(stdin, "last\n"); err != nil {
				t.Fatal(err)
			}
			got, err := r.ReadString('\n')
			if errors.Is(err, ErrNotSupported) {
				testutil.SkipIfNotSupported(t, err, "6.14")
			}
			if err != nil || got != "last\n" {
				t.Fatalf("read %q %v\n%s", got, err, out.String())
			}
			if i := z.Info(); i.Kernel && i.KeyUpdates != 4 {
				t.Errorf("Info.KeyUpdates %d, want 4", i.KeyUpdates)
			}
			// s_server decrypts what ztls sends after its own KeyUpdates.
			if _, err := io.WriteString(z, "from-ztls-after-rekey\n"); err != nil {
				t.Fatal(err)
			}
			out.Wait(t, "from-ztls-after-rekey", 1)
		})
	}
}

// TestKeysAgainstOpenSSL is TestKeysAgainstCryptoTLS with OpenSSL as the peer, for the
// AES-GCM suites crypto/tls will not pick against itself (TLS 1.3 AES-256-GCM: HKDF with
// SHA-384, a 69-byte Finished): ztls's handshake and key derivation, a user-space record
// layer built from the derived state, s_client or s_server on the other end (s_server
// sends two session tickets first).
func TestKeysAgainstOpenSSL(t *testing.T) {
	bin := testutil.OpenSSLBin(t)
	for _, oc := range []opensslCase{opensslCases[0], opensslCases[1], opensslCases[3], opensslCases[4]} {
		t.Run(oc.cc.name+"/ztls-server", func(t *testing.T) {
			scfg, _ := configs(t, oc.cc)
			var lc net.ListenConfig
			lc.SetMultipathTCP(false)
			ln, err := lc.Listen(t.Context(), "tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			toServer, toClient := digits(50_000, 31), digits(70_001, 32)
			cl := testutil.StartSClient(t, bin, ln.Addr().String(), oc.flags, toServer)
			errOut := cl.ErrOut
			raw, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			sc, err := softHandshake(raw, serverConn(raw, serverConfig(scfg)))
			if err != nil {
				t.Fatalf("handshake: %v\n%s", err, errOut.String())
			}
			got, err := sc.readN(len(toServer))
			if err != nil || !bytes.Equal(got, toServer) {
				t.Fatalf("soft read: %v %s\n%s", err, firstDiff(got, toServer), errOut.String())
			}
			if err := sc.write(toClient); err != nil {
				t.Fatal(err)
			}
			if err := sc.record(typeAlert, []byte{1, 0}); err != nil { // close_notify
				t.Fatal(err)
			}
			cl.Exited(t)
			if o := cl.Out.String(); o != string(toClient) {
				t.Fatalf("s_client got: %s\n%s", firstDiff([]byte(o), toClient), errOut.String())
			}
		})
		t.Run(oc.cc.name+"/ztls-client", func(t *testing.T) {
			scfg, ccfg := configs(t, oc.cc)
			srv := testutil.StartSServer(t, bin, scfg.Certificates[0], oc.flags, true)
			stdin, out := srv.Stdin, srv.Out
			var d net.Dialer
			d.SetMultipathTCP(false)
			raw, err := d.Dial("tcp4", srv.Addr)
			if err != nil {
				t.Fatalf("dial s_server: %v\n%s", err, out.String())
			}
			defer raw.Close()
			sc, err := softHandshake(raw, Client(raw, ccfg, nil))
			if err != nil {
				t.Fatalf("handshake: %v\n%s", err, out.String())
			}
			toClient, toServer := digits(60_000, 33), digits(40_003, 34)
			go stdin.Write(toClient)
			got, err := sc.readN(len(toClient))
			if err != nil || !bytes.Equal(got, toClient) {
				t.Fatalf("soft read: %v %s\n%s", err, firstDiff(got, toClient), out.String())
			}
			if oc.cc.version == tls.VersionTLS13 && sc.tickets != 2 {
				t.Errorf("%d session tickets before the data, want OpenSSL's 2", sc.tickets)
			}
			if err := sc.write(toServer); err != nil {
				t.Fatal(err)
			}
			out.Wait(t, string(toServer), 1)
		})
	}
}
