package ktls

import (
	"bytes"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"

	"github.com/zcnet/zcnet/tcpglue"
)

// Suite is what the record layer needs to know of a negotiated cipher suite.
type Suite struct {
	cipher uint16           // tcpglue.TLSCipher*
	keyLen int              // AEAD key bytes
	hash   func() hash.Hash // TLS 1.3 HKDF hash, TLS 1.2 PRF hash
}

// ChaCha reports whether the suite is ChaCha20-Poly1305.
func (s Suite) ChaCha() bool { return s.cipher == tcpglue.TLSCipherChaCha20Poly1305 }

// ivLen is the length of the static IV: 12 in TLS 1.3 and for ChaCha20-Poly1305, and the
// 4-byte implicit salt of TLS 1.2 AES-GCM.
func (s Suite) ivLen(version uint16) int {
	if version == tls.VersionTLS12 && !s.ChaCha() {
		return 4
	}
	return 12
}

var (
	aes128 = Suite{tcpglue.TLSCipherAESGCM128, 16, sha256.New}
	aes256 = Suite{tcpglue.TLSCipherAESGCM256, 32, sha512.New384}
	chacha = Suite{tcpglue.TLSCipherChaCha20Poly1305, 32, sha256.New}
)

// Suites maps the crypto/tls cipher suites kernel TLS can carry to their record layer.
var Suites = map[uint16]Suite{
	tls.TLS_AES_128_GCM_SHA256:                        aes128,
	tls.TLS_AES_256_GCM_SHA384:                        aes256,
	tls.TLS_CHACHA20_POLY1305_SHA256:                  chacha,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256:         aes128,
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256:       aes128,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384:         aes256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384:       aes256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256:   chacha,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256: chacha,
	tls.TLS_RSA_WITH_AES_128_GCM_SHA256:               aes128,
	tls.TLS_RSA_WITH_AES_256_GCM_SHA384:               aes256,
}

// ExpandLabel is TLS 1.3's HKDF-Expand-Label (RFC 8446 §7.1) with an empty context.
func ExpandLabel(h func() hash.Hash, secret []byte, label string, n int) []byte {
	full := "tls13 " + label
	info := make([]byte, 0, 4+len(full))
	info = binary.BigEndian.AppendUint16(info, uint16(n))
	info = append(info, byte(len(full)))
	info = append(info, full...)
	info = append(info, 0) // context: empty
	out, err := hkdf.Expand(h, secret, string(info), n)
	if err != nil {
		panic("ktls: HKDF-Expand-Label: " + err.Error()) // only for n > 255 hash lengths: never here
	}
	return out
}

// PRF12 is the TLS 1.2 PRF (RFC 5246 §5): P_hash(secret, label + seed).
func PRF12(h func() hash.Hash, secret []byte, label string, seed []byte, n int) []byte {
	ls := append([]byte(label), seed...)
	out := make([]byte, 0, n)
	mac := hmac.New(h, secret)
	mac.Write(ls)
	a := mac.Sum(nil) // A(1)
	for len(out) < n {
		mac.Reset()
		mac.Write(a)
		mac.Write(ls)
		out = mac.Sum(out)
		mac.Reset()
		mac.Write(a)
		a = mac.Sum(a[:0])
	}
	return out[:n]
}

// DirKeys is one direction's traffic state: the kernel's TLSCrypto plus, in TLS 1.3,
// the traffic secret the next KeyUpdate derives from.
type DirKeys struct {
	Crypto *tcpglue.TLSCrypto
	Secret []byte // TLS 1.3 application traffic secret (nil for 1.2)
}

// TrafficKeys13 derives a TLS 1.3 direction's key and IV from its traffic secret.
func TrafficKeys13(s Suite, secret []byte, seq uint64) *tcpglue.TLSCrypto {
	key := ExpandLabel(s.hash, secret, "key", s.keyLen)
	iv := ExpandLabel(s.hash, secret, "iv", 12)
	c := &tcpglue.TLSCrypto{Version: tcpglue.TLSVersion13, Cipher: s.cipher, Key: key, Seq: seq}
	if s.ChaCha() {
		c.IV = iv
	} else {
		c.Salt, c.IV = iv[:4], iv[4:]
	}
	return c
}

// NextSecret13 is the traffic secret after a KeyUpdate (RFC 8446 §7.2).
func NextSecret13(s Suite, secret []byte) []byte {
	return ExpandLabel(s.hash, secret, "traffic upd", s.hash().Size())
}

// keys12 derives both directions of TLS 1.2 from the master secret and the two randoms
// (RFC 5246 §6.3; AEAD suites have no MAC keys; RFC 5288 §3: AES-GCM's IV is the 4-byte
// salt; RFC 7905: ChaCha20-Poly1305's is 12 bytes, XORed with the sequence number).
// seqC and seqS are the next sequence numbers of what the client and the server send.
func keys12(s Suite, master, clientRandom, serverRandom []byte, seqC, seqS uint64) (client, server *tcpglue.TLSCrypto) {
	ivLen := s.ivLen(tls.VersionTLS12)
	seed := append(append([]byte{}, serverRandom...), clientRandom...)
	kb := PRF12(s.hash, master, "key expansion", seed, 2*s.keyLen+2*ivLen)
	ck, sk := kb[:s.keyLen], kb[s.keyLen:2*s.keyLen]
	civ, siv := kb[2*s.keyLen:2*s.keyLen+ivLen], kb[2*s.keyLen+ivLen:]
	mk := func(key, iv []byte, seq uint64) *tcpglue.TLSCrypto {
		c := &tcpglue.TLSCrypto{Version: tcpglue.TLSVersion12, Cipher: s.cipher, Key: key, Seq: seq}
		if s.ChaCha() {
			c.IV = iv
		} else {
			// The explicit nonce the kernel puts on the wire starts at the sequence
			// number, as crypto/tls does.
			c.Salt, c.IV = iv, binary.BigEndian.AppendUint64(nil, seq)
		}
		return c
	}
	return mk(ck, civ, seqC), mk(sk, siv, seqS)
}

// Key log labels (NSS key log format, which crypto/tls's Config.KeyLogWriter writes).
const (
	labelTLS12         = "CLIENT_RANDOM"
	labelClientTraffic = "CLIENT_TRAFFIC_SECRET_0"
	labelServerTraffic = "SERVER_TRAFFIC_SECRET_0"
)

// secrets collects one handshake's key log lines.
type secrets struct {
	mu       sync.Mutex
	m        map[string][]byte
	poisoned bool // another server handshake in this process used the same client random
}

func (s *secrets) get(label string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.poisoned {
		return nil
	}
	return s.m[label]
}

func (s *secrets) set(label string, v []byte) {
	s.mu.Lock()
	s.m[label] = v
	s.mu.Unlock()
}

// routes sends the key log lines of a server config (shared by a listener's
// connections) to the connection whose handshake wrote them, by client random (32 bytes,
// as a string). A server connection registers when the ClientHello crosses its hsConn
// and unregisters when its handshake ends. Two server handshakes in one process with one
// client random (a replayed ClientHello) poison the route: neither gets secrets, and both
// stay in user space. Client configs are per connection and need no route.
var routes sync.Map

// route registers a server connection's secrets under its client random.
func route(id string, sec *secrets) (registered bool) {
	if v, loaded := routes.LoadOrStore(id, sec); loaded {
		other := v.(*secrets)
		other.mu.Lock()
		other.poisoned = true
		other.mu.Unlock()
		sec.mu.Lock()
		sec.poisoned = true
		sec.mu.Unlock()
		return false
	}
	return true
}

// keyLog is the KeyLogWriter ztls puts in every tls.Config it uses: it passes each line
// on to the user's writer, if any, and keeps the secrets of connections being switched
// to kernel TLS: in sec (a client's config is its own) or through routes (a server's).
type keyLog struct {
	user io.Writer
	sec  *secrets
}

func (k *keyLog) Write(line []byte) (int, error) {
	if k.user != nil {
		if _, err := k.user.Write(line); err != nil {
			return 0, err
		}
	}
	f := bytes.Fields(line)
	if len(f) != 3 {
		return len(line), nil
	}
	cr, err1 := hex.DecodeString(string(f[1]))
	sec, err2 := hex.DecodeString(string(f[2]))
	if err1 != nil || err2 != nil {
		return len(line), nil
	}
	if k.sec != nil {
		k.sec.set(string(f[0]), sec)
	} else if v, ok := routes.Load(string(cr)); ok {
		v.(*secrets).set(string(f[0]), sec)
	}
	return len(line), nil
}

// errNoSecret: the handshake's key log did not reach ztls.
var errNoSecret = errors.New("the handshake's secrets did not reach the key log (a GetConfigForClient config without ztls's KeyLogWriter, Encrypted Client Hello, or a ClientHello seen twice in this process)")

// deriveKeys computes the kernel's TX and RX state from a finished handshake.
func deriveKeys(isClient bool, st tls.ConnectionState, sec *secrets, obs *observed) (tx, rx DirKeys, err error) {
	s, ok := Suites[st.CipherSuite]
	if !ok {
		return tx, rx, fmt.Errorf("cipher suite %s has no kernel TLS (want AES-GCM or ChaCha20-Poly1305)", tls.CipherSuiteName(st.CipherSuite))
	}
	switch st.Version {
	case tls.VersionTLS13:
		cs, ss := sec.get(labelClientTraffic), sec.get(labelServerTraffic)
		if cs == nil || ss == nil {
			return tx, rx, errNoSecret
		}
		txSeq, err := obs.txSeq13(s)
		if err != nil {
			return tx, rx, err
		}
		mine, theirs := cs, ss
		if !isClient {
			mine, theirs = ss, cs
		}
		// RX starts at 0: hsConn handed crypto/tls no byte past the peer's Finished.
		tx = DirKeys{TrafficKeys13(s, mine, txSeq), mine}
		rx = DirKeys{TrafficKeys13(s, theirs, 0), theirs}
		return tx, rx, nil
	case tls.VersionTLS12:
		ms := sec.get(labelTLS12)
		if ms == nil && st.DidResume {
			return tx, rx, errors.New("a resumed TLS 1.2 session: crypto/tls writes no key log line for it")
		}
		if ms == nil {
			return tx, rx, errNoSecret
		}
		if obs.clientRandom == nil || obs.serverRandom == nil {
			return tx, rx, errors.New("the hello messages' randoms were not seen")
		}
		txSeq, rxSeq := obs.afterCCS(true), obs.afterCCS(false)
		seqC, seqS := txSeq, rxSeq
		if !isClient {
			seqC, seqS = rxSeq, txSeq
		}
		c, sv := keys12(s, ms, obs.clientRandom, obs.serverRandom, seqC, seqS)
		if isClient {
			return DirKeys{Crypto: c}, DirKeys{Crypto: sv}, nil
		}
		return DirKeys{Crypto: sv}, DirKeys{Crypto: c}, nil
	}
	return tx, rx, fmt.Errorf("TLS version %#04x has no kernel TLS (want TLS 1.2 or 1.3)", st.Version)
}

// OpenRoutes counts the server handshakes whose key log route is registered (a leak
// check: every handshake's route ends with it).
func OpenRoutes() int64 {
	n := int64(0)
	routes.Range(func(any, any) bool { n++; return true })
	return n
}
