package ztls

import (
	"bytes"
	"crypto/tls"
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
		s, err := softHandshake(b, serverConn(b, serverConfig(scfg)))
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
			// The peer gets the alert, or, from the kernel, the end of the connection:
			// after a record fails authentication the kernel sends nothing more.
			_, err = s.read()
			gotAlert := errors.As(err, &ae) && ae.Alert == 20
			ended := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
			if !gotAlert && !(z.Info().Kernel && ended) {
				t.Fatalf("peer: %v, want alert bad_record_mac (or the end, from the kernel)", err)
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

// TestTxRekey: with a low Options.RekeyRecords the kernel path updates its own TX keys
// as it sends (Linux 6.14: elsewhere it cannot, and the data still flows), and the
// crypto/tls peer reads every byte across the updates. In user space crypto/tls keeps its
// keys (it never updates them on its own).
func TestTxRekey(t *testing.T) {
	scfg, ccfg := configs(t, allCiphers[0])
	a, b := tcpPair(t)
	z, p := Client(a, ccfg, &Options{RekeyRecords: 8}), tls.Server(b, scfg)
	defer p.Close()
	defer z.Close()
	go p.Handshake()
	if err := z.Handshake(); err != nil {
		t.Fatal(err)
	}
	checkPath(t, z)
	want := pattern(64*16384+5, 14)
	errc := make(chan error, 1)
	go func() {
		var err error
		for off := 0; off < len(want) && err == nil; off += 16384 {
			_, err = z.Write(want[off:min(off+16384, len(want))])
		}
		errc <- err
	}()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(p, got); err != nil {
		t.Fatalf("peer read: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("peer read: %s", firstDiff(got, want))
	}
	i := z.Info()
	switch {
	case i.Kernel && rekeyOK() && i.TxRekeys < 4:
		t.Errorf("Info.TxRekeys %d after 65 writes at 8 records a key", i.TxRekeys)
	case (!i.Kernel || !rekeyOK()) && i.TxRekeys != 0:
		t.Errorf("Info.TxRekeys %d without kernel rekey", i.TxRekeys)
	}
}

// TestOneByteReads: reads of one byte across data, a session ticket (200 bytes: the
// kernel hands a non-data record over in as many pieces as the reads ask for) and a
// close_notify (two pieces): every data byte arrives, in order, then io.EOF.
func TestOneByteReads(t *testing.T) {
	z, s := softPeer(t, allCiphers[0])
	ticket := []byte{msgNewSessionTicket, 0, 0, 196, 0, 0, 0x0e, 0x10, 0, 0, 0, 0, 0, 0, 183}
	ticket = append(ticket, bytes.Repeat([]byte{7}, 183)...)
	ticket = append(ticket, 0, 0) // no extensions
	if len(ticket) != 200 {
		t.Fatalf("ticket is %d bytes", len(ticket))
	}
	for _, step := range []func() error{
		func() error { return s.write([]byte("abc")) },
		func() error { return s.record(typeHandshake, ticket) },
		func() error { return s.write([]byte("defgh")) },
		func() error { return s.record(typeAlert, []byte{1, 0}) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	var got []byte
	b := make([]byte, 1)
	for {
		n, err := z.Read(b)
		got = append(got, b[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read after %q: %v", got, err)
		}
	}
	if string(got) != "abcdefgh" {
		t.Fatalf("read %q", got)
	}
	if i := z.Info(); i.Kernel && i.Tickets != 1 {
		t.Errorf("Info.Tickets %d, want 1", i.Tickets)
	}
}
