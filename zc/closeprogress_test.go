package zc

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/zcnet/zcnet/tcpglue"
)

// TestCloseSlowReaderGetsEverything: a graceful Close whose peer keeps reading, slowly, for
// longer in all than CloseTimeout is not reset: CloseTimeout counts from the last byte that
// left, so a peer that reads gets everything, as from Go's net. (It counted from Close: a
// file server's SendFile + Close to a client slower than 5 s in all lost the tail.)
func TestCloseSlowReaderGetsEverything(t *testing.T) {
	for _, be := range []Backend{BackendIOUring, BackendPlain} {
		t.Run(be.String(), func(t *testing.T) {
			cfg := Config{Backend: be, CloseTimeout: 300 * time.Millisecond, MaxQueuedBytes: 8 << 20}
			e := newEngine(t, cfg)
			l, ev := listenEvents(t, e)
			s := smallRecvBuf(t, l.Addr().String()) // its 4 KiB window paces the sender
			c := recvEvent(t, ev.conn, "accept")
			if err := c.Socket(func(s *tcpglue.Socket) error { _, err := s.SetSendBuffer(4096); return err }); err != nil {
				t.Fatal(err)
			}
			const total = 4 << 20
			src := make([]byte, total)
			for i := range src {
				src[i] = byte(i*13 + i>>11)
			}
			if n, err := c.Write(src); n != total || err != nil {
				t.Fatalf("Write = %d, %v", n, err)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			// The peer reads a few KiB a millisecond: about a second in all, longer than
			// CloseTimeout, with bytes leaving the whole time.
			got := make([]byte, 0, total)
			buf := make([]byte, 16<<10)
			for {
				n, err := s.Read(buf)
				got = append(got, buf[:n]...)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("the slow reader's Read after %d of %d bytes: %v", len(got), total, err)
				}
				time.Sleep(time.Millisecond)
			}
			if !bytes.Equal(got, src) {
				t.Fatalf("the slow reader got %d of %d bytes, or different ones", len(got), total)
			}
			if err := recvEvent(t, ev.closed, "close"); err != nil {
				t.Fatalf("OnClose of a close whose peer read everything = %v, want nil", err)
			}
			if st := e.Stats(); st.Faults.CloseTimeouts != 0 {
				t.Errorf("Faults.CloseTimeouts = %d, want 0", st.Faults.CloseTimeouts)
			}
		})
	}
}
