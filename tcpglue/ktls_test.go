package tcpglue

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

// TestKTLSLayout checks the kernel TLS uapi of ktls.go against <linux/tls.h>.
func TestKTLSLayout(t *testing.T) {
	if _, err := os.Stat("/usr/include/linux/tls.h"); err != nil {
		t.Fatalf("linux/tls.h: %v (install linux-libc-dev)", err)
	}
	checks := map[string]uint64{
		"SOL_TLS":                        solTLS,
		"TLS_TX":                         tlsTX,
		"TLS_RX":                         tlsRX,
		"TLS_TX_ZEROCOPY_RO":             tlsTXZeroCopyRO,
		"TLS_RX_EXPECT_NO_PAD":           tlsRXExpectNoPad,
		"TLS_SET_RECORD_TYPE":            tlsSetRecordType,
		"TLS_GET_RECORD_TYPE":            tlsGetRecordType,
		"TLS_1_2_VERSION":                uint64(TLSVersion12),
		"TLS_1_3_VERSION":                uint64(TLSVersion13),
		"TLS_CIPHER_AES_GCM_128":         uint64(TLSCipherAESGCM128),
		"TLS_CIPHER_AES_GCM_256":         uint64(TLSCipherAESGCM256),
		"TLS_CIPHER_CHACHA20_POLY1305":   uint64(TLSCipherChaCha20Poly1305),
		"sizeof(struct tls_crypto_info)": uint64(unsafe.Sizeof(tlsCryptoInfo{})),
		"offsetof(struct tls_crypto_info, cipher_type)": uint64(unsafe.Offsetof(tlsCryptoInfo{}.CipherType)),
	}
	add := func(cname string, size, iv, key, salt, seq uintptr) {
		checks["sizeof(struct "+cname+")"] = uint64(size)
		checks["offsetof(struct "+cname+", iv)"] = uint64(iv)
		checks["offsetof(struct "+cname+", key)"] = uint64(key)
		checks["offsetof(struct "+cname+", salt)"] = uint64(salt)
		checks["offsetof(struct "+cname+", rec_seq)"] = uint64(seq)
	}
	var a tlsCryptoAESGCM128
	add("tls12_crypto_info_aes_gcm_128", unsafe.Sizeof(a), unsafe.Offsetof(a.IV), unsafe.Offsetof(a.Key), unsafe.Offsetof(a.Salt), unsafe.Offsetof(a.RecSeq))
	var b tlsCryptoAESGCM256
	add("tls12_crypto_info_aes_gcm_256", unsafe.Sizeof(b), unsafe.Offsetof(b.IV), unsafe.Offsetof(b.Key), unsafe.Offsetof(b.Salt), unsafe.Offsetof(b.RecSeq))
	var c tlsCryptoChaCha20Poly1305
	// salt has size 0: it sits where rec_seq starts.
	add("tls12_crypto_info_chacha20_poly1305", unsafe.Sizeof(c), unsafe.Offsetof(c.IV), unsafe.Offsetof(c.Key), unsafe.Offsetof(c.RecSeq), unsafe.Offsetof(c.RecSeq))
	checks["sizeof(((struct tls12_crypto_info_chacha20_poly1305 *)0)->salt)"] = 0
	testutil.CompareWithC(t, []string{"sys/socket.h", "linux/tls.h"}, nil, checks)
}

// TestKTLSBadCrypto: a crypto state the kernel would refuse is refused before any system
// call, with a *ValueError.
func TestKTLSBadCrypto(t *testing.T) {
	good := ZeroTLSCrypto(TLSVersion13, TLSCipherAESGCM128)
	cases := map[string]*TLSCrypto{
		"nil":         nil,
		"version":     {Version: 0x0301, Cipher: TLSCipherAESGCM128, Key: good.Key, IV: good.IV, Salt: good.Salt},
		"cipher":      {Version: TLSVersion13, Cipher: 53, Key: good.Key, IV: good.IV, Salt: good.Salt},
		"short key":   {Version: TLSVersion13, Cipher: TLSCipherAESGCM256, Key: good.Key, IV: good.IV, Salt: good.Salt},
		"chacha salt": {Version: TLSVersion13, Cipher: TLSCipherChaCha20Poly1305, Key: make([]byte, 32), IV: make([]byte, 12), Salt: good.Salt},
		"iv":          {Version: TLSVersion12, Cipher: TLSCipherAESGCM128, Key: good.Key, IV: make([]byte, 12), Salt: good.Salt},
	}
	for name, k := range cases {
		for _, set := range []func(int, *TLSCrypto) error{SetTLSTx, SetTLSRx} {
			err := set(-1, k)
			var ve *ValueError
			if !errors.As(err, &ve) {
				t.Errorf("%s: got %v, want a *ValueError", name, err)
			}
		}
	}
	for _, v := range []uint16{TLSVersion12, TLSVersion13} {
		for _, c := range []uint16{TLSCipherAESGCM128, TLSCipherAESGCM256, TLSCipherChaCha20Poly1305} {
			if _, err := ZeroTLSCrypto(v, c).marshal("test"); err != nil {
				t.Errorf("%#x %s: %v", v, TLSCipherName(c), err)
			}
		}
	}
}

// requireKTLS returns the kernel's TLS support. On a kernel without the tls module it
// skips, except in the qemu guests of make test (ZCVM=1), which load it: there it fails.
func requireKTLS(t *testing.T) TLSSupport {
	t.Helper()
	sup, err := ProbeTLS()
	if err == nil {
		if miss := sup.Missing(); miss != "" {
			t.Fatalf("kernel TLS refuses %s", miss)
		}
		return sup
	}
	if errors.Is(err, ErrNotSupported) && errors.Is(err, unix.ENOENT) && os.Getenv("ZCVM") != "1" {
		t.Skipf("no kernel TLS here (CONFIG_TLS is not set): %v", err)
	}
	t.Fatalf("kernel TLS: %v", err)
	return sup
}

// TestKTLSProbe: ProbeTLS answers nil or ErrNotSupported, never anything else; on this
// host (no CONFIG_TLS) the answer names the missing module.
func TestKTLSProbe(t *testing.T) {
	sup, err := ProbeTLS()
	t.Logf("ProbeTLS: %v %v", sup, err)
	if err != nil && !errors.Is(err, ErrNotSupported) {
		t.Fatalf("ProbeTLS: %v (not a refusal)", err)
	}
	if err != nil && os.Getenv("ZCVM") == "1" {
		t.Fatalf("ProbeTLS in the guest: %v", err)
	}
	if err != nil && errors.Is(err, unix.ENOENT) {
		if want := "CONFIG_TLS"; !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("%v does not say %s", err, want)
		}
	}
}

// TestKTLSLoopback (kernel TLS only): one end's TX keys are the other's RX keys; data,
// an alert and a handshake record cross with their types, for every cipher and version.
func TestKTLSLoopback(t *testing.T) {
	requireKTLS(t)
	for _, v := range []uint16{TLSVersion12, TLSVersion13} {
		for _, ci := range []uint16{TLSCipherAESGCM128, TLSCipherAESGCM256, TLSCipherChaCha20Poly1305} {
			t.Run(fmt.Sprintf("%x/%s", v, TLSCipherName(ci)), func(t *testing.T) {
				c, s, err := loopbackPair()
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				defer s.Close()
				k := ZeroTLSCrypto(v, ci)
				for i := range k.Key {
					k.Key[i] = byte(i + 1)
				}
				k.Seq = 7
				if err := EnableTLS(c.Fd()); err != nil {
					t.Fatal(err)
				}
				if err := EnableTLS(s.Fd()); err != nil {
					t.Fatal(err)
				}
				if err := SetTLSTx(c.Fd(), k); err != nil {
					t.Fatal(err)
				}
				if err := SetTLSRx(s.Fd(), k); err != nil {
					t.Fatal(err)
				}
				// Linux 6.0's flags: sendfile from the page cache, and decryption
				// into the reader's buffer (TLS 1.3 only).
				if err := SetTLSTxZeroCopyRO(c.Fd(), true); err != nil {
					t.Fatal(err)
				}
				if err := SetTLSRxExpectNoPad(s.Fd(), true); (err == nil) != (v == TLSVersion13) {
					t.Fatalf("TLS_RX_EXPECT_NO_PAD on %#x: %v", v, err)
				}
				msg := bytes.Repeat([]byte("0123456789abcdef"), 3000) // three records
				if _, err := c.Write(msg); err != nil {
					t.Fatal(err)
				}
				if _, err := SendTLSRecord(c.Fd(), TLSRecordAlert, []byte{1, 0}, 0); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, 0, len(msg))
				buf := make([]byte, 64<<10)
				for len(got) < len(msg) {
					n, typ, err := RecvTLS(s.Fd(), buf, 0)
					if err != nil || typ != TLSRecordApplicationData || n == 0 {
						t.Fatalf("after %d bytes: n %d type %d err %v", len(got), n, typ, err)
					}
					got = append(got, buf[:n]...)
				}
				if !bytes.Equal(got, msg) {
					t.Fatal("data differs")
				}
				n, typ, err := RecvTLS(s.Fd(), buf, 0)
				if err != nil || typ != TLSRecordAlert || !bytes.Equal(buf[:n], []byte{1, 0}) {
					t.Fatalf("alert: n %d type %d err %v % x", n, typ, err, buf[:n])
				}
			})
		}
	}
}

// TestKTLSRekeyProbe: ProbeTLSRekey answers nil or ErrNotSupported; a kernel of 6.14 or
// newer with TLS must take new keys.
func TestKTLSRekeyProbe(t *testing.T) {
	err := ProbeTLSRekey()
	t.Logf("ProbeTLSRekey: %v", err)
	if err != nil && !errors.Is(err, ErrNotSupported) {
		t.Fatalf("not a refusal: %v", err)
	}
	if _, perr := ProbeTLS(); perr == nil && err != nil && testutil.KernelAtLeast("6.14") {
		t.Fatalf("Linux 6.14+ with kernel TLS refuses a rekey: %v", err)
	}
}
