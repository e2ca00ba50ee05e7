package ztls

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/zcnet/zcnet/tcpglue"
)

// softDir is a test's user-space record layer for one direction, built from the same
// *tcpglue.TLSCrypto the kernel would be given (AES-GCM only: the standard library has
// no ChaCha20-Poly1305). Records it seals must open in crypto/tls, and records crypto/tls
// seals must open here: that checks ztls's keys, IVs and sequence numbers on a host
// without kernel TLS.
type softDir struct {
	version uint16
	aead    cipher.AEAD
	iv      [12]byte // TLS 1.3: the static IV; TLS 1.2: salt in the first 4 bytes
	seq     uint64
}

func newSoftDir(k *tcpglue.TLSCrypto) (*softDir, error) {
	if k.Cipher == tcpglue.TLSCipherChaCha20Poly1305 {
		return nil, errors.New("no ChaCha20-Poly1305 in the standard library")
	}
	b, err := aes.NewCipher(k.Key)
	if err != nil {
		return nil, err
	}
	a, err := cipher.NewGCM(b)
	if err != nil {
		return nil, err
	}
	d := &softDir{version: k.Version, aead: a, seq: k.Seq}
	copy(d.iv[:4], k.Salt)
	copy(d.iv[4:], k.IV)
	return d, nil
}

func (d *softDir) nonce13() []byte {
	n := d.iv
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], d.seq)
	for i := range s {
		n[4+i] ^= s[i]
	}
	return n[:]
}

// seal returns one record of type typ carrying p.
func (d *softDir) seal(typ uint8, p []byte) []byte {
	defer func() { d.seq++ }()
	if d.version == tls.VersionTLS13 {
		inner := append(append([]byte{}, p...), typ)
		hdr := []byte{typeApplicationData, 3, 3, 0, 0}
		binary.BigEndian.PutUint16(hdr[3:], uint16(len(inner)+16))
		return d.aead.Seal(hdr, d.nonce13(), inner, hdr)
	}
	nonce := d.iv
	binary.BigEndian.PutUint64(nonce[4:], d.seq) // the explicit nonce: the sequence number
	aad := binary.BigEndian.AppendUint64(nil, d.seq)
	aad = append(aad, typ, 3, 3, byte(len(p)>>8), byte(len(p)))
	rec := []byte{typ, 3, 3, 0, 0}
	binary.BigEndian.PutUint16(rec[3:], uint16(8+len(p)+16))
	rec = append(rec, nonce[4:]...)
	return d.aead.Seal(rec, nonce[:], p, aad)
}

// open reads one record from r and returns its type and plaintext.
func (d *softDir) open(r io.Reader) (uint8, []byte, error) {
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return 0, nil, err
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	defer func() { d.seq++ }()
	if d.version == tls.VersionTLS13 {
		pt, err := d.aead.Open(nil, d.nonce13(), body, hdr)
		if err != nil {
			return 0, nil, fmt.Errorf("record %d: %w", d.seq, err)
		}
		for len(pt) > 0 && pt[len(pt)-1] == 0 {
			pt = pt[:len(pt)-1]
		}
		if len(pt) == 0 {
			return 0, nil, errors.New("record without content type")
		}
		return pt[len(pt)-1], pt[:len(pt)-1], nil
	}
	if len(body) < 8+16 {
		return 0, nil, errors.New("short record")
	}
	nonce := d.iv
	copy(nonce[4:], body[:8])
	n := len(body) - 8 - 16
	aad := binary.BigEndian.AppendUint64(nil, d.seq)
	aad = append(aad, hdr[0], 3, 3, byte(n>>8), byte(n))
	pt, err := d.aead.Open(nil, nonce[:], body[8:], aad)
	if err != nil {
		return 0, nil, fmt.Errorf("record %d: %w", d.seq, err)
	}
	return hdr[0], pt, nil
}

// softConn is a peer whose handshake is ztls's (crypto/tls plus the key derivation) and
// whose records are softDir's: it can send what crypto/tls never would (a KeyUpdate, an
// alert, a HelloRequest, a tampered record), and it reads what a kernel would be given.
type softConn struct {
	raw     net.Conn
	version uint16
	s       suite
	tx, rx  *softDir
	txSec   []byte
	rxSec   []byte
	tickets int
}

// softHandshake runs c's handshake (a Conn of Server or Client) without handing the
// keys to the kernel.
func softHandshake(raw net.Conn, c *Conn) (*softConn, error) {
	defer c.hs.Unroute()
	if err := c.tc.Handshake(); err != nil {
		return nil, err
	}
	st := c.tc.ConnectionState()
	tx, rx, err := c.hs.Keys()
	if err != nil {
		return nil, err
	}
	sc := &softConn{raw: raw, version: st.Version, s: suites[st.CipherSuite], txSec: tx.Secret, rxSec: rx.Secret}
	if sc.tx, err = newSoftDir(tx.Crypto); err != nil {
		return nil, err
	}
	if sc.rx, err = newSoftDir(rx.Crypto); err != nil {
		return nil, err
	}
	return sc, nil
}

// write sends p as data records of at most 16 KiB.
func (s *softConn) write(p []byte) error {
	for len(p) > 0 {
		n := min(len(p), 16384)
		if _, err := s.raw.Write(s.tx.seal(typeApplicationData, p[:n])); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// record sends one record of any type.
func (s *softConn) record(typ uint8, p []byte) error {
	_, err := s.raw.Write(s.tx.seal(typ, p))
	return err
}

// updateTX sends a KeyUpdate (asking the peer to update too, when request) and moves to
// the next TX keys.
func (s *softConn) updateTX(request bool) error {
	r := byte(0)
	if request {
		r = 1
	}
	if err := s.record(typeHandshake, []byte{msgKeyUpdate, 0, 0, 1, r}); err != nil {
		return err
	}
	s.txSec = nextSecret13(s.s, s.txSec)
	d, err := newSoftDir(trafficKeys13(s.s, s.txSec, 0))
	if err != nil {
		return err
	}
	s.tx = d
	return nil
}

// read returns the next data record's bytes: session tickets are counted and skipped,
// a KeyUpdate moves to the next RX keys, an alert is an *AlertError (io.EOF for
// close_notify).
func (s *softConn) read() ([]byte, error) {
	for {
		typ, p, err := s.rx.open(s.raw)
		if err != nil {
			return nil, err
		}
		switch {
		case typ == typeApplicationData:
			return p, nil
		case typ == typeAlert && len(p) == 2 && p[1] == 0:
			return nil, io.EOF
		case typ == typeAlert && len(p) == 2:
			return nil, &AlertError{Alert: p[1], Received: true}
		case typ == typeHandshake && len(p) >= 4 && p[0] == msgNewSessionTicket:
			s.tickets++
		case typ == typeHandshake && len(p) == 5 && p[0] == msgKeyUpdate:
			s.rxSec = nextSecret13(s.s, s.rxSec)
			if s.rx, err = newSoftDir(trafficKeys13(s.s, s.rxSec, 0)); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("unexpected record type %d: % x", typ, p[:min(len(p), 8)])
		}
	}
}

// readN reads n bytes of data.
func (s *softConn) readN(n int) ([]byte, error) {
	var got []byte
	for len(got) < n {
		p, err := s.read()
		if err != nil {
			return got, err
		}
		got = append(got, p...)
	}
	return got, nil
}
