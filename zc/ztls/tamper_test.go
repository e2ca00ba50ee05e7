package ztls

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/testutil"
)

// TestTamperedRecordOnTheWire: a TLS record altered on the wire — the project's BPF fault
// injector flips bits of the last byte of a TCP segment from the crypto/tls client, after
// TCP's checksum, on the loopback of a namespace of the test's own — is refused by the ztls
// server with a typed error (a sent bad_record_mac alert, *AlertError 20), the connection
// is unusable afterwards, and no byte of the altered record is ever delivered: what Read
// returned before the error is exactly the records sent before the tampering. The records
// are in the kernel where it has TLS (the 6.12 and 7.3 guests: the kernel's AEAD check and
// ztls's handling of its EBADMSG), in crypto/tls here.
func TestTamperedRecordOnTheWire(t *testing.T) {
	testutil.RequireFeature(t, testutil.KernelAtLeast("6.6"), "tcx links for the fault injector", "6.6")
	for _, cc := range []cipherCase{allCiphers[0], allCiphers[3]} {
		t.Run(cc.name, func(t *testing.T) {
			scfg, ccfg := configs(t, cc)
			var f *bpf.Fault
			cli, srv, port := testutil.FaultPair(t, func(lo int) (err error) {
				f, err = bpf.NewFault(lo, false)
				return err
			})
			defer f.Close()
			defer cli.Close()
			defer srv.Close()

			z, p := Server(srv, scfg, nil), tls.Client(cli, ccfg)
			handshake(t, z, p)

			good := pattern(3000, 1)
			if _, err := p.Write(good); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(good))
			if _, err := io.ReadFull(z, got); err != nil || !bytes.Equal(got, good) {
				t.Fatalf("before the tampering: %v, or other bytes", err)
			}

			// Tamper with what the client sends next, one segment.
			if err := f.Corrupt(1, port); err != nil {
				t.Fatal(err)
			}
			if _, err := p.Write(pattern(1000, 2)); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(30 * time.Second); ; {
				n, err := f.Corrupted()
				if err != nil {
					t.Fatal(err)
				}
				if n > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the fault injector corrupted no segment of the client's record")
				}
				time.Sleep(time.Millisecond)
			}
			if err := f.Corrupt(0, port); err != nil {
				t.Fatal(err)
			}

			z.SetReadDeadline(time.Now().Add(30 * time.Second))
			buf := make([]byte, 4096)
			after, rerr := readUntilError(z, buf)
			if len(after) != 0 {
				t.Errorf("Read delivered %d bytes of the tampered record before failing", len(after))
			}
			var ae *AlertError
			if !errors.As(rerr, &ae) || ae.Received || ae.Alert != 20 {
				t.Fatalf("Read of the tampered record: %v, want a sent bad_record_mac (*AlertError 20)", rerr)
			}
			// The connection is done: reading again fails the same way, without a byte.
			if n, err := z.Read(buf); n != 0 || err == nil {
				t.Errorf("Read after the failure: %d, %v; want 0 and an error", n, err)
			}
			// The peer hears of it: the alert, or (from the kernel, which sends nothing
			// after a record fails authentication) the end of the connection.
			p.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, perr := p.Read(buf)
			if perr == nil || errors.Is(perr, os.ErrDeadlineExceeded) {
				t.Errorf("the client after the tampering: %v, want the alert or the end of the connection", perr)
			}
			t.Logf("server: %v; client: %v; kernel path %v", rerr, perr, z.Info().Kernel)
		})
	}
}
