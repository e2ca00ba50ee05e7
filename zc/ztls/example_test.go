package ztls_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"time"

	"github.com/zcnet/zcnet/zc/ztls"
)

// An echo server and a client over TLS: crypto/tls runs the handshakes, the kernel
// carries the records where it has TLS (Info().Kernel), crypto/tls where it has not
// (Info().Reason says why). The code is the same either way.
func Example() {
	serverCfg, clientCfg := exampleConfigs()
	ln, err := ztls.Listen("tcp", "127.0.0.1:0", serverCfg, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close() // sends close_notify
		io.Copy(c, c)   // echo until the client's close_notify
	}()

	c, err := ztls.Dial("tcp", ln.Addr().String(), clientCfg, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello, kernel TLS")); err != nil {
		log.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil { // close_notify, then shutdown(SHUT_WR)
		log.Fatal(err)
	}
	reply, err := io.ReadAll(c)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(reply))
	info := c.Info()
	fmt.Println(info.Kernel || info.Reason != "") // either the kernel or a reason
	// Output:
	// hello, kernel TLS
	// true
}

// exampleConfigs makes a self-signed certificate for 127.0.0.1 and the two configs.
func exampleConfigs() (server, client *tls.Config) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		log.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		log.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		log.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	server = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	client = &tls.Config{RootCAs: pool}
	return server, client
}
