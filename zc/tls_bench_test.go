package zc

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
)

// BenchmarkTLSRecv: a crypto/tls client writes 64 KiB records' worth per op to a server
// that only counts what it receives: zc's TLS listener (the kernel path where the kernel
// has TLS, the user-space pump where not) against Go's net + crypto/tls.
func BenchmarkTLSRecv(b *testing.B) {
	scfg, ccfg := tlsConfigs(b, tls.VersionTLS13)
	const chunk = 64 << 10
	run := func(b *testing.B, addr string, done chan int64) {
		tc, err := tls.Dial("tcp", addr, ccfg)
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, chunk)
		b.SetBytes(chunk)
		b.ResetTimer()
		for range b.N {
			if _, err := tc.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		tc.CloseWrite()
		if n := <-done; n != int64(b.N)*chunk {
			b.Fatalf("server got %d bytes, want %d", n, int64(b.N)*chunk)
		}
		b.StopTimer()
		tc.Close()
	}
	b.Run("zc", func(b *testing.B) {
		e := newEngine(b, Config{Queues: 1})
		done := make(chan int64, 1)
		l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
			var n int64
			return HandlerFuncs{
				Data: func(c *Conn, d Data) { n += int64(d.Len()); d.Release() },
				EOF:  func(c *Conn, err error) { done <- n; c.Close() },
			}
		}, ListenOptions{TLS: &TLSOptions{Config: scfg}})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		run(b, l.Addr().String(), done)
	})
	b.Run("net", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		done := make(chan int64, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := tls.Server(c, scfg)
			n, _ := io.Copy(io.Discard, tc)
			done <- n
			tc.Close()
		}()
		run(b, ln.Addr().String(), done)
	})
}
