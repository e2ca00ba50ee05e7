package ztls

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkHandshake compares a ztls handshake (record-exact reads, key log, key
// derivation, and on a kernel with TLS the socket options) with crypto/tls's alone, on
// loopback, TLS 1.3, ztls on the server side.
func BenchmarkHandshake(b *testing.B) {
	for _, mode := range []string{"crypto-tls", "ztls"} {
		b.Run(mode, func(b *testing.B) {
			scfg, ccfg := configs(b, allCiphers[0])
			zcfg := serverConfig(scfg)
			for b.Loop() {
				a, c := tcpPair(b)
				p := tls.Client(c, ccfg)
				go p.Handshake()
				var err error
				if mode == "ztls" {
					err = serverConn(a, zcfg).Handshake()
				} else {
					err = tls.Server(a, scfg).Handshake()
				}
				if err != nil {
					b.Fatal(err)
				}
				a.Close()
				c.Close()
			}
		})
	}
}

// BenchmarkBulk sends 64 KiB writes from a ztls server (kernel TLS where the kernel has
// it, crypto/tls here) or a plain crypto/tls server to a crypto/tls client.
func BenchmarkBulk(b *testing.B) {
	for _, mode := range []string{"crypto-tls", "ztls"} {
		b.Run(mode, func(b *testing.B) {
			scfg, ccfg := configs(b, allCiphers[0])
			a, c := tcpPair(b)
			p := tls.Client(c, ccfg)
			go p.Handshake()
			var w net.Conn
			if mode == "ztls" {
				w = Server(a, scfg, nil)
			} else {
				w = tls.Server(a, scfg)
			}
			defer w.Close()
			go io.Copy(io.Discard, p)
			buf := pattern(64<<10, 1)
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				if _, err := w.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSendFile sends an 8 MiB file per op: ztls's ReadFrom (sendfile with the kernel
// encrypting, where it has TLS) or io.Copy into a crypto/tls server conn; a crypto/tls
// client reads and discards.
func BenchmarkSendFile(b *testing.B) {
	path := filepath.Join(b.TempDir(), "f")
	if err := os.WriteFile(path, pattern(8<<20, 3), 0o600); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"crypto-tls", "ztls"} {
		b.Run(mode, func(b *testing.B) {
			scfg, ccfg := configs(b, allCiphers[0])
			a, c := tcpPair(b)
			p := tls.Client(c, ccfg)
			go p.Handshake()
			var w net.Conn
			if mode == "ztls" {
				w = Server(a, scfg, nil)
			} else {
				w = tls.Server(a, scfg)
			}
			defer w.Close()
			go io.Copy(io.Discard, p)
			f, err := os.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			b.SetBytes(8 << 20)
			for b.Loop() {
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(w, f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
