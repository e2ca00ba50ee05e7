package zc

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
)

// TestTLSTamperedOnTheWire: a record of the crypto/tls client altered on the wire — the
// project's BPF fault injector flips bits of the last byte of a TCP segment after TCP's
// checksum, on the loopback of a namespace of the test's own — ends the zc TLS server's
// connection with a typed error (a bad_record_mac *tcpglue.TLSAlertError, sent), and no
// byte of the altered record reaches the handler: it saw exactly the records before. The
// kernel's AEAD check on the kernel path (the 6.12 and 7.3 guests), crypto/tls's here.
func TestTLSTamperedOnTheWire(t *testing.T) {
	testutil.RequireFeature(t, testutil.KernelAtLeast("6.6"), "tcx links for the fault injector", "6.6")
	for _, b := range tlsBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := newTLSEngine(t, b)
			scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
			h := newTLSCollector()
			conns := make(chan *Conn, 1)
			var (
				f *bpf.Fault
				l *Listener
			)
			raw, port := testutil.FaultLoopback(t, func() (_ net.Addr, err error) {
				if l, err = h.listen(e, scfg, conns); err != nil {
					return nil, err
				}
				return l.Addr(), nil
			}, func(lo int) (err error) {
				f, err = bpf.NewFault(lo, false)
				return err
			})
			defer l.Close()
			defer f.Close()
			tc, c := handshakeTLSClient(t, raw, ccfg, conns)
			defer tc.Close()

			good := bytes.Repeat([]byte("intact "), 500)
			if _, err := tc.Write(good); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(time.Minute); len(h.bytes()) < len(good); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the handler got %d of %d bytes before the tampering", len(h.bytes()), len(good))
				}
			}
			if err := f.Corrupt(1, port); err != nil {
				t.Fatal(err)
			}
			if _, err := tc.Write(bytes.Repeat([]byte("altered "), 100)); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
				if n, err := f.Corrupted(); err != nil || n > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the fault injector corrupted no segment of the client's record")
				}
			}
			if err := f.Corrupt(0, port); err != nil {
				t.Fatal(err)
			}
			err := recvEvent(t, h.done, "OnClose")
			var ae *tcpglue.TLSAlertError
			if !errors.As(err, &ae) || ae.Alert != 20 || ae.Received {
				t.Fatalf("OnClose %v, want a sent bad_record_mac *tcpglue.TLSAlertError", err)
			}
			if got := h.bytes(); !bytes.Equal(got, good) {
				t.Fatalf("the handler got %d bytes (%d before the tampering): bytes of the altered record were delivered", len(got), len(good))
			}
			t.Logf("OnClose: %v (kernel path %v)", err, c.Stats().TLS.Kernel)
		})
	}
}
