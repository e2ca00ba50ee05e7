package netconn

import (
	"github.com/zcnet/zcnet/zc"

	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/nettest"
)

func netPipe(t *testing.T, cfg zc.Config, o Options) nettest.MakePipe {
	return func() (c1, c2 net.Conn, stop func(), err error) {
		srv, err := zc.New(cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		cli, err := zc.New(cfg)
		if err != nil {
			srv.Close()
			return nil, nil, nil, err
		}
		ln, err := o.Listen(srv, "tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, nil, err
		}
		done := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				done <- nil
				return
			}
			done <- c
		}()
		c1, err = o.Dial(context.Background(), cli, "tcp", ln.Addr().String())
		if err != nil {
			return nil, nil, nil, err
		}
		c2 = <-done
		engines.Store(c1, cli)
		stop = func() {
			engines.Delete(c1)
			c1.Close()
			c2.Close()
			ln.Close()
			cli.Close()
			srv.Close()
		}
		return c1, c2, stop, nil
	}
}

// engines holds the engine of each dialed side netPipe made (for tests that read its
// counters).
var engines sync.Map

func smallCfg(b zc.Backend) zc.Config {
	return zc.Config{Queues: 2, SendBufs: 64, RecvBufs: 64, Backend: b, NoPin: true, MaxQueuedBytes: 1 << 20}
}

func TestNettestConn(t *testing.T) {
	for _, b := range []zc.Backend{zc.BackendIOUring, zc.BackendPlain} {
		t.Run(b.String(), func(t *testing.T) {
			nettest.TestConn(t, netPipe(t, smallCfg(b), Options{}))
		})
		t.Run(b.String()+"/Ring", func(t *testing.T) {
			nettest.TestConn(t, netPipe(t, smallCfg(b), Options{Ring: true}))
		})
	}
}

func TestHTTPServer(t *testing.T) {
	for _, b := range []zc.Backend{zc.BackendIOUring, zc.BackendPlain} {
		t.Run(b.String(), func(t *testing.T) {
			e := newEngine(t, smallCfg(b))
			ln, err := Listen(e, "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			body := strings.Repeat("zcnet ", 50000)
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				data, _ := io.ReadAll(r.Body)
				w.Header().Set("X-Len", itoa(len(data)))
				io.WriteString(w, body)
			})}
			go srv.Serve(ln)
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: false}}
			defer client.CloseIdleConnections()
			for i := 0; i < 20; i++ {
				resp, err := client.Post("http://"+ln.Addr().String()+"/x", "text/plain", strings.NewReader(strings.Repeat("q", i*1000)))
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != body || resp.Header.Get("X-Len") != itoa(i*1000) {
					t.Fatalf("request %d: bad response (%d bytes, X-Len %s)", i, len(got), resp.Header.Get("X-Len"))
				}
			}
		})
	}
}

func itoa(n int) string { return big.NewInt(int64(n)).String() }

func selfSigned(t *testing.T) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "zcnet test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestTLS(t *testing.T) {
	e := newEngine(t, smallCfg(zc.BackendIOUring))
	cert := selfSigned(t)
	ln, err := Listen(e, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tln := tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
	go func() {
		for {
			c, err := tln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	pool := x509.NewCertPool()
	leaf, _ := x509.ParseCertificate(cert.Certificate[0])
	pool.AddCert(leaf)
	raw, err := Dial(context.Background(), e, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	defer c.Close()
	msg := make([]byte, 1<<20)
	rand.Read(msg)
	go c.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(msg) {
		t.Fatal("TLS echo differs")
	}
}
