package zc_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"time"

	"github.com/zcnet/zcnet/zc"
)

// A TLS server on the event-loop API: the handshake runs before the accept function sees
// the connection, the handler receives decrypted Data and its Write is encrypted — by the
// kernel where it has TLS (Linux with the tls module), by crypto/tls in user space where it
// has not (ConnStats.TLS says which and why; TLSOptions.NoFallback forbids the fallback).
func Example_tls() {
	cert, roots := selfSigned()
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()

	// tls:begin
	opts := zc.ListenOptions{TLS: &zc.TLSOptions{Config: &tls.Config{Certificates: []tls.Certificate{cert}}}}
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *zc.Conn) zc.Handler {
		info := c.Stats().TLS // Kernel: the kernel has the records; else Reason says why not
		fmt.Println("TLS 1.3:", info.Version == tls.VersionTLS13, "path known:", info.Kernel || info.Reason != "")
		return zc.HandlerFuncs{
			Data: func(c *zc.Conn, d zc.Data) {
				c.Write(append([]byte("hello, "), d.Bytes()...)) // encrypted by the kernel
				d.Release()
				c.Close() // close_notify, then the TCP close
			},
		}
	}, opts)
	// tls:end
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()

	conn, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "localhost"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	conn.Write([]byte("gopher"))
	reply, err := io.ReadAll(conn) // ends at the server's close_notify
	fmt.Println(string(reply), err)
	// Output:
	// TLS 1.3: true path known: true
	// hello, gopher <nil>
}

// selfSigned makes a certificate for localhost and a pool that trusts it.
func selfSigned() (tls.Certificate, *x509.CertPool) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	leaf, _ := x509.ParseCertificate(der)
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, roots
}
