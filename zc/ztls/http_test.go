package ztls

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// TestReadFromFile: io.Copy from an *os.File goes through Conn.ReadFrom (sendfile(2) with
// the kernel encrypting, where the kernel has TLS); the crypto/tls peer gets every byte.
func TestReadFromFile(t *testing.T) {
	for _, cc := range []cipherCase{allCiphers[0], allCiphers[4]} {
		t.Run(cc.name, func(t *testing.T) {
			want := pattern(3<<20+5, 11)
			path := filepath.Join(t.TempDir(), "f")
			if err := os.WriteFile(path, want, 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			scfg, ccfg := configs(t, cc)
			a, b := tcpPair(t)
			z, p := Server(a, scfg, nil), tls.Client(b, ccfg)
			defer p.Close()
			got := make(chan []byte, 1)
			go func() {
				buf, _ := io.ReadAll(p)
				got <- buf
			}()
			n, err := io.Copy(z, f)
			if err != nil || n != int64(len(want)) {
				t.Fatalf("copy: %d %v", n, err)
			}
			checkPath(t, z)
			z.Close()
			if g := <-got; !bytes.Equal(g, want) {
				t.Fatalf("peer read: %s", firstDiff(g, want))
			}
		})
	}
}

// TestHTTP: net/http's Server.Serve over a ztls listener and an http.Transport dialing
// with ztls, unchanged: a file served with sendfile under TLS and a request body echoed.
func TestHTTP(t *testing.T) {
	scfg, ccfg := configs(t, allCiphers[0])
	want := pattern(1<<20+17, 12)
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen("tcp4", "127.0.0.1:0", scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/file", func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(path)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer f.Close()
		io.Copy(w, f)
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) { io.Copy(w, r.Body) })
	mux.HandleFunc("/state", func(w http.ResponseWriter, r *http.Request) {
		c, ok := FromContext(r.Context())
		if !ok {
			http.Error(w, "no ztls connection in the context", 500)
			return
		}
		io.WriteString(w, tls.VersionName(c.ConnectionState().Version))
	})
	srv := &http.Server{Handler: mux, ConnContext: ConnContext}
	go srv.Serve(ln)
	defer srv.Close()
	tr := &http.Transport{DialTLSContext: (&Dialer{Config: ccfg}).DialContext}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	url := "https://127.0.0.1:" + port // no resolver in the guests; the config names "localhost"
	resp, err := cl.Get(url + "/file")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(body, want) {
		t.Fatalf("GET /file: %v, %s", err, firstDiff(body, want))
	}
	resp, err = cl.Get(url + "/state")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "TLS 1.3" {
		t.Fatalf("GET /state: %q", body)
	}
	post := pattern(300_001, 13)
	resp, err = cl.Post(url+"/echo", "application/octet-stream", bytes.NewReader(post))
	if err != nil {
		t.Fatal(err)
	}
	body, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(body, post) {
		t.Fatalf("POST /echo: %v, %s", err, firstDiff(body, post))
	}
}
