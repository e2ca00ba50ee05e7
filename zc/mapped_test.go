package zc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
)

// TestMappedReceive: a receiver with RecvMapped gets every byte intact; with a zero-copy
// sender and a 4 KiB-multiple MSS (4108 with timestamps) the kernel maps pages, and the
// counters say how many.
func TestMappedReceive(t *testing.T) {
	testutil.SkipIfNotSupported(t, tcpglue.ProbeZeroCopyReceive(), "4.18")
	for _, tc := range []struct {
		name      string
		mss       int
		path      SendPath
		wantPages bool
	}{
		{"copying-sender", 0, SendCopy, false},
		{"zerocopy-sender-mss4108", 4108, SendZeroCopy, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := func(s *tcpglue.Socket) error {
				if tc.mss == 0 {
					return nil
				}
				return s.SetMaxSeg(tc.mss)
			}
			srv := newEngine(t, Config{RecvPath: RecvMapped, SocketOptions: opts})
			cli := newEngine(t, Config{SendPath: tc.path, SocketOptions: opts})
			const total = 32 << 20
			k := newCollector(total)
			var held int
			l, err := srv.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
				h := k.handler().(HandlerFuncs)
				inner := h.Data
				h.Data = func(c *Conn, d Data) {
					if d.mapped() {
						held++
					}
					inner(c, d)
				}
				return h
			})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
			if err != nil {
				t.Fatal(err)
			}
			want := sha256.New()
			for sent := 0; sent < total; {
				b, err := c.BufferWait(10 * time.Second)
				if err != nil {
					t.Fatal(err)
				}
				p := b.Bytes()
				for i := range p {
					p[i] = byte((sent + i) * 7)
				}
				want.Write(p)
				c.Send(b, len(p))
				sent += len(p)
			}
			select {
			case <-k.done:
			case <-time.After(30 * time.Second):
				t.Fatalf("timeout: %d of %d", k.n, total)
			}
			if k.n != total || !bytes.Equal(k.sum.h.Sum(nil), want.Sum(nil)) {
				t.Fatal("received data differs")
			}
			st := srv.Stats()
			t.Logf("mapped %d, copied %d, fallbacks %d", st.Recv.BytesMapped, st.Recv.BytesMappedCopied, st.Recv.MappedFallbacks)
			if st.Recv.MappedFallbacks != 0 {
				t.Fatal("mapped window could not be set up")
			}
			if st.Recv.BytesMapped+st.Recv.BytesMappedCopied != total {
				t.Fatalf("mapped+copied = %d, want %d", st.Recv.BytesMapped+st.Recv.BytesMappedCopied, total)
			}
			if tc.wantPages && st.Recv.BytesMapped == 0 {
				t.Fatal("no page was mapped although the sender sent page-aligned zero-copy frags")
			}
			c.Close()
			<-c.Done()
		})
	}
}
