package ztls

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/testutil"
)

// TestPeerResetMidRecord: a peer that resets in the middle of a record (its header and half
// of its body arrived) makes ztls's Read fail with the reset (an error matching
// ECONNRESET, or the unexpected end), after exactly the whole records before it: no byte of
// the cut record is delivered, nothing hangs. Kernel path in the guests, crypto/tls here.
func TestPeerResetMidRecord(t *testing.T) {
	for _, cc := range []cipherCase{allCiphers[0], allCiphers[3]} {
		t.Run(cc.name, func(t *testing.T) {
			scfg, ccfg := configs(t, cc)
			a, b := tcpPair(t)
			cut := &testutil.CutConn{TCPConn: b.(*net.TCPConn)}
			z, p := Server(a, scfg, nil), tls.Client(cut, ccfg)
			defer z.Close()
			handshake(t, z, p)
			whole := pattern(20000, 3)
			if _, err := p.Write(whole); err != nil {
				t.Fatal(err)
			}
			cut.Cut()
			p.Write(pattern(3000, 4)) // half of it, then the reset

			z.SetReadDeadline(time.Now().Add(time.Minute))
			buf := make([]byte, 4096)
			got, err := readUntilError(z, buf)
			if !bytes.Equal(got, whole) {
				t.Fatalf("Read delivered %d bytes, want exactly the %d of the whole records (%s)", len(got), len(whole), firstDiff(got, whole))
			}
			if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("Read after the reset: %v, want an error matching ECONNRESET (or io.ErrUnexpectedEOF)", err)
			}
			if n, err2 := z.Read(buf); n != 0 || err2 == nil {
				t.Errorf("Read again: %d, %v; want 0 and an error", n, err2)
			}
			t.Logf("%v (kernel path %v)", err, z.Info().Kernel)
		})
	}
}
