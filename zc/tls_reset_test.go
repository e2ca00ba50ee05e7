package zc

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/zcnet/zcnet/internal/testutil"
)

// TestTLSPeerResetMidRecord: a client that resets in the middle of a record (its header
// and half its body arrived) ends the zc TLS server's connection with the reset (OnClose: an
// error matching ECONNRESET, or the unexpected end), after exactly the whole records before
// it reached the handler: no byte of the cut record, nothing left waiting. Kernel path in
// the guests, user space here.
func TestTLSPeerResetMidRecord(t *testing.T) {
	for _, b := range tlsBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := newTLSEngine(t, b)
			scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
			h := newTLSCollector()
			conns := make(chan *Conn, 1)
			l, err := h.listen(e, scfg, conns)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			raw, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			cut := &testutil.CutConn{TCPConn: raw.(*net.TCPConn)}
			tc, c := handshakeTLSClient(t, cut, ccfg, conns)
			defer tc.Close()
			whole := bytes.Repeat([]byte("whole record bytes "), 1000)
			if _, err := tc.Write(whole); err != nil {
				t.Fatal(err)
			}
			cut.Cut()
			tc.Write(bytes.Repeat([]byte("cut "), 800)) // half of it, then the reset

			err = recvEvent(t, h.done, "OnClose")
			if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("OnClose after the reset: %v, want an error matching ECONNRESET (or io.ErrUnexpectedEOF)", err)
			}
			if got := h.bytes(); !bytes.Equal(got, whole) {
				t.Fatalf("the handler got %d bytes, want exactly the %d of the whole records", len(got), len(whole))
			}
			t.Logf("OnClose: %v (kernel path %v)", err, c.Stats().TLS.Kernel)
		})
	}
}
