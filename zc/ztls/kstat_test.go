package ztls

import (
	"crypto/tls"
	"errors"
	"testing"
)

func TestParseTLSStat(t *testing.T) {
	m := parseTLSStat([]byte("TlsCurrTxSw                     \t2\nTlsTxSw 17\nbogus\nTlsRxSw x\n"))
	if len(m) != 2 || m["TlsCurrTxSw"] != 2 || m["TlsTxSw"] != 17 {
		t.Fatalf("%v", m)
	}
}

// TestKernelStats: where the kernel has TLS, a connection ztls moved into it shows in the
// kernel's own counters (TlsTxSw, TlsRxSw); where it has not, KernelStats says so with an
// error matching ErrNotSupported.
func TestKernelStats(t *testing.T) {
	before, err := KernelStats()
	if !kernelTLS(t) {
		if !errors.Is(err, ErrNotSupported) {
			t.Fatalf("KernelStats: %v, want ErrNotSupported", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	scfg, ccfg := configs(t, allCiphers[0])
	a, b := tcpPair(t)
	z, p := Server(a, scfg, nil), tls.Client(b, ccfg)
	defer p.Close()
	go p.Handshake()
	if err := z.Handshake(); err != nil {
		t.Fatal(err)
	}
	checkPath(t, z)
	exchange(t, z, p, []byte("ping"), []byte("pong"))
	after, err := KernelStats()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"TlsTxSw", "TlsRxSw"} {
		if after[k] <= before[k] {
			t.Errorf("%s %d -> %d: the kernel did not count the connection", k, before[k], after[k])
		}
	}
	if d := after["TlsDecryptError"] - before["TlsDecryptError"]; d != 0 {
		t.Errorf("%d records failed to decrypt in a clean exchange", d)
	}
}
