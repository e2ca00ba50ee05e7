package ztls

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/zcnet/zcnet/internal/testutil"
)

// softPeer connects a ztls client to a soft record layer server (see softConn) that can
// send what crypto/tls never would. The ztls side is kernel TLS where the kernel has it,
// crypto/tls here: the tests below hold for both.
func softPeer(t *testing.T, cc cipherCase) (*Conn, *softConn) {
	t.Helper()
	scfg, ccfg := configs(t, cc)
	a, b := tcpPair(t)
	z := Client(a, ccfg, nil)
	t.Cleanup(func() { z.Close() })
	type res struct {
		s   *softConn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := softHandshake(b, newConn(b, serverConfig(scfg), false, nil))
		ch <- res{s, err}
	}()
	if err := z.Handshake(); err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("soft peer: %v", r.err)
	}
	checkPath(t, z)
	return z, r.s
}

// TestKeyUpdateReceived: the peer updates its keys (KeyUpdate) between records, with and
// without asking ztls to update too; reading goes on across it and every byte arrives,
// and ztls's own KeyUpdate (when asked) is followed by records under its next keys. In
// the kernel this needs Linux 6.14 (TLS_RX/TLS_TX rekey); older kernels refuse with an
// error matching ErrNotSupported.
func TestKeyUpdateReceived(t *testing.T) {
	for _, request := range []bool{false, true} {
		name := "not-requested"
		if request {
			name = "requested"
		}
		t.Run(name, func(t *testing.T) {
			z, s := softPeer(t, allCiphers[0])
			want := pattern(100_000, 9)
			errc := make(chan error, 1)
			go func() {
				err := s.write(want[:30_000])
				for i := 0; err == nil && i < 3; i++ {
					if err = s.updateTX(request); err == nil {
						err = s.write(want[30_000+i*20_000 : 50_000+i*20_000])
					}
				}
				if err == nil {
					err = s.write(want[90_000:])
				}
				errc <- err
			}()
			got := make([]byte, len(want))
			_, err := io.ReadFull(z, got)
			if err != nil {
				testutil.SkipIfNotSupported(t, err, "6.14")
				t.Fatalf("read: %v", err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("read: %s", firstDiff(got, want))
			}
			if i := z.Info(); i.Kernel && i.KeyUpdates != 3 {
				t.Errorf("Info.KeyUpdates %d, want 3", i.KeyUpdates)
			}
			// ztls's records reach the peer under the keys it expects (its next ones
			// after each KeyUpdate it asked for).
			back := pattern(50_000, 10)
			go func() { _, err := z.Write(back); errc <- err }()
			got2, err := s.readN(len(back))
			if err != nil {
				t.Fatalf("peer read: %v", err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got2, back) {
				t.Fatalf("peer read: %s", firstDiff(got2, back))
			}
		})
	}
}

// TestRenegotiationRefused: a TLS 1.2 HelloRequest gets a no_renegotiation alert and the
// read fails with ErrRenegotiation.
func TestRenegotiationRefused(t *testing.T) {
	z, s := softPeer(t, allCiphers[3])
	if err := s.record(typeHandshake, []byte{msgHelloRequest, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := z.Read(make([]byte, 10)); !errors.Is(err, ErrRenegotiation) {
		t.Fatalf("read: %v, want ErrRenegotiation", err)
	}
	_, err := s.read()
	var ae *AlertError
	if !errors.As(err, &ae) || ae.Alert != 100 {
		t.Fatalf("peer: %v, want alert no_renegotiation (100)", err)
	}
}

// TestTamperedRecord: a record whose ciphertext was changed on the wire is a
// bad_record_mac: ztls sends that alert and the read fails with it; no byte of the
// record is delivered.
func TestTamperedRecord(t *testing.T) {
	for _, cc := range []cipherCase{allCiphers[0], allCiphers[3]} {
		t.Run(cc.name, func(t *testing.T) {
			z, s := softPeer(t, cc)
			if err := s.write([]byte("good")); err != nil {
				t.Fatal(err)
			}
			rec := s.tx.seal(typeApplicationData, []byte("evil bytes"))
			rec[len(rec)-20] ^= 1
			if _, err := s.raw.Write(rec); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 100)
			n, err := io.ReadAtLeast(z, buf, 4)
			if err != nil || string(buf[:n]) != "good" {
				t.Fatalf("read %q %v", buf[:n], err)
			}
			n, err = z.Read(buf)
			var ae *AlertError
			if n != 0 || !errors.As(err, &ae) || ae.Received || ae.Alert != 20 {
				t.Fatalf("read %d %v, want a sent bad_record_mac (20)", n, err)
			}
			if _, err := s.read(); !errors.As(err, &ae) || ae.Alert != 20 {
				t.Fatalf("peer: %v, want alert bad_record_mac", err)
			}
		})
	}
}

// TestAlertFromPeer: a fatal alert record from the peer is a received *AlertError; a
// user_canceled warning is ignored until the close_notify that follows it (io.EOF).
func TestAlertFromPeer(t *testing.T) {
	z, s := softPeer(t, allCiphers[3])
	if err := s.record(typeAlert, []byte{2, 80}); err != nil {
		t.Fatal(err)
	}
	_, err := z.Read(make([]byte, 10))
	var ae *AlertError
	if !errors.As(err, &ae) || !ae.Received || ae.Alert != 80 {
		t.Fatalf("read: %v, want a received internal_error (80)", err)
	}

	z, s = softPeer(t, allCiphers[0])
	for _, a := range [][]byte{{1, 90}, {1, 0}} {
		if err := s.record(typeAlert, a); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := z.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Fatalf("read: %d %v, want io.EOF", n, err)
	}
}
