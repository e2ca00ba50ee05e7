package ztls

import (
	"crypto/tls"
	"syscall"
	"testing"

	"github.com/zcnet/zcnet/internal/ktls"
)

// FuzzControl feeds non-data records, as the kernel would hand them over, to the kernel
// path's parser: any bytes, any type, in pieces. It must return (an error or nil), never
// panic, and never keep more than it bounds. The socket under it is a plain TCP pair:
// the alerts it sends go out as bytes and key changes fail, as on a kernel that refuses.
func FuzzControl(f *testing.F) {
	f.Add(uint8(21), []byte{1, 0}, uint8(1))
	f.Add(uint8(21), []byte{2, 20, 1, 0}, uint8(1))
	f.Add(uint8(22), []byte{4, 0, 0, 3, 1, 2, 3}, uint8(2))
	f.Add(uint8(22), []byte{24, 0, 0, 1, 1}, uint8(5))
	f.Add(uint8(22), []byte{24, 0, 0, 1, 7}, uint8(5))
	f.Add(uint8(22), []byte{0, 0, 0, 0}, uint8(4))
	f.Add(uint8(22), []byte{4, 0xff, 0xff, 0xff}, uint8(4))
	f.Add(uint8(20), []byte{1}, uint8(1))
	a, b := tcpPair(f)
	go func() { // drain what the parser sends
		buf := make([]byte, 4096)
		for {
			if _, err := b.Read(buf); err != nil {
				return
			}
		}
	}()
	rc, err := a.(syscall.Conn).SyscallConn()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, typ uint8, data []byte, piece uint8) {
		for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
			c := &Conn{raw: a}
			s := suites[tls.TLS_AES_128_GCM_SHA256]
			k := &kernel{rc: rc, version: v, s: s, tx: ktls.DirKeys{Secret: make([]byte, 32)}}
			k.ctl.Version, k.ctl.Suite, k.ctl.RX = v, s, make([]byte, 32)
			step := int(piece%16) + 1
			for i := 0; i < len(data); i += step {
				if err := k.ctl.Feed(typ, data[i:min(i+step, len(data))], ops{c, k}); err != nil {
					break
				}
				if k.ctl.Held() > 1<<16 {
					t.Fatalf("kept %d bytes", k.ctl.Held())
				}
			}
		}
	})
}
