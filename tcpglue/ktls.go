package tcpglue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/eintr"
	"github.com/zcnet/zcnet/internal/errs"
)

// Kernel TLS (Linux 4.13 TX, 4.17 RX; include/uapi/linux/tls.h): after the
// TCP_ULP "tls" socket option, TLS_TX and TLS_RX hand the socket the record
// keys a TLS handshake negotiated, and the kernel encrypts what is sent and
// decrypts what is received. The handshake itself stays in user space.
//
// The constants and structures below are the uapi's; TestKTLSLayout checks
// them against <linux/tls.h>.
const (
	solTLS           = 282 // SOL_TLS
	tlsTX            = 1   // TLS_TX
	tlsRX            = 2   // TLS_RX
	tlsTXZeroCopyRO  = 3   // TLS_TX_ZEROCOPY_RO (Linux 6.0)
	tlsRXExpectNoPad = 4   // TLS_RX_EXPECT_NO_PAD (Linux 6.0)
	tlsSetRecordType = 1   // TLS_SET_RECORD_TYPE (cmsg on sendmsg)
	tlsGetRecordType = 2   // TLS_GET_RECORD_TYPE (cmsg on recvmsg)
)

// TLS protocol versions as the kernel names them (TLS_1_2_VERSION, TLS_1_3_VERSION);
// they equal crypto/tls's VersionTLS12 and VersionTLS13.
const (
	TLSVersion12 uint16 = 0x0303
	TLSVersion13 uint16 = 0x0304
)

// TLS ciphers the kernel knows (TLS_CIPHER_*). zcnet uses the three that TLS 1.2 and 1.3
// share with crypto/tls: AES-128-GCM, AES-256-GCM and ChaCha20-Poly1305.
const (
	TLSCipherAESGCM128        uint16 = 51 // TLS_CIPHER_AES_GCM_128
	TLSCipherAESGCM256        uint16 = 52 // TLS_CIPHER_AES_GCM_256
	TLSCipherChaCha20Poly1305 uint16 = 54 // TLS_CIPHER_CHACHA20_POLY1305
)

// TLS record content types (RFC 8446 §5.1), as TLS_GET_RECORD_TYPE reports them and
// SendTLSRecord takes them.
const (
	TLSRecordChangeCipherSpec uint8 = 20
	TLSRecordAlert            uint8 = 21
	TLSRecordHandshake        uint8 = 22
	TLSRecordApplicationData  uint8 = 23
)

// struct tls_crypto_info.
type tlsCryptoInfo struct {
	Version    uint16
	CipherType uint16
}

// struct tls12_crypto_info_aes_gcm_128.
type tlsCryptoAESGCM128 struct {
	Info   tlsCryptoInfo
	IV     [8]byte
	Key    [16]byte
	Salt   [4]byte
	RecSeq [8]byte
}

// struct tls12_crypto_info_aes_gcm_256.
type tlsCryptoAESGCM256 struct {
	Info   tlsCryptoInfo
	IV     [8]byte
	Key    [32]byte
	Salt   [4]byte
	RecSeq [8]byte
}

// struct tls12_crypto_info_chacha20_poly1305 (salt has size 0).
type tlsCryptoChaCha20Poly1305 struct {
	Info   tlsCryptoInfo
	IV     [12]byte
	Key    [32]byte
	RecSeq [8]byte
}

// TLSCrypto is one direction's record protection state, as TLS_TX and TLS_RX take it.
//
// For the AES-GCM ciphers the 12-byte nonce of a record is Salt (4 bytes) followed by
// 8 bytes: in TLS 1.3 IV is the static IV's last 8 bytes (the nonce is the static IV
// XOR the sequence number); in TLS 1.2 Salt is the implicit part of the key block and
// IV is the first explicit nonce the sender puts on the wire (crypto/tls and the
// kernel both use the sequence number). For ChaCha20-Poly1305, IV is the whole 12-byte
// static IV and Salt is empty, in both versions.
type TLSCrypto struct {
	Version uint16 // TLSVersion12 or TLSVersion13
	Cipher  uint16 // TLSCipherAESGCM128, TLSCipherAESGCM256 or TLSCipherChaCha20Poly1305
	Key     []byte // 16 bytes (AES-128-GCM) or 32
	IV      []byte // 8 bytes (AES-GCM) or 12 (ChaCha20-Poly1305)
	Salt    []byte // 4 bytes (AES-GCM) or none
	Seq     uint64 // the sequence number of the next record in this direction
}

// TLSCipherName names a kernel TLS cipher ("AES-128-GCM", ...).
func TLSCipherName(c uint16) string {
	switch c {
	case TLSCipherAESGCM128:
		return "AES-128-GCM"
	case TLSCipherAESGCM256:
		return "AES-256-GCM"
	case TLSCipherChaCha20Poly1305:
		return "ChaCha20-Poly1305"
	}
	return fmt.Sprintf("cipher %d", c)
}

// marshal checks c and returns the bytes of its kernel structure.
func (c *TLSCrypto) marshal(op string) ([]byte, error) {
	bad := func(name string, v any, reason string) ([]byte, error) {
		return nil, invalid(op, name, v, reason)
	}
	if c == nil {
		return bad("crypto state", nil, "want a *TLSCrypto")
	}
	if c.Version != TLSVersion12 && c.Version != TLSVersion13 {
		return bad("TLS version", fmt.Sprintf("%#04x", c.Version), "want TLSVersion12 (0x0303) or TLSVersion13 (0x0304)")
	}
	size := func(name string, b []byte, n int) error {
		if len(b) != n {
			return invalid(op, name, len(b), fmt.Sprintf("%s wants %d bytes", TLSCipherName(c.Cipher), n))
		}
		return nil
	}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], c.Seq)
	info := tlsCryptoInfo{Version: c.Version, CipherType: c.Cipher}
	switch c.Cipher {
	case TLSCipherAESGCM128:
		if err := errors.Join(size("key", c.Key, 16), size("IV", c.IV, 8), size("salt", c.Salt, 4)); err != nil {
			return nil, err
		}
		s := tlsCryptoAESGCM128{Info: info, RecSeq: seq}
		copy(s.IV[:], c.IV)
		copy(s.Key[:], c.Key)
		copy(s.Salt[:], c.Salt)
		return structBytes(&s), nil
	case TLSCipherAESGCM256:
		if err := errors.Join(size("key", c.Key, 32), size("IV", c.IV, 8), size("salt", c.Salt, 4)); err != nil {
			return nil, err
		}
		s := tlsCryptoAESGCM256{Info: info, RecSeq: seq}
		copy(s.IV[:], c.IV)
		copy(s.Key[:], c.Key)
		copy(s.Salt[:], c.Salt)
		return structBytes(&s), nil
	case TLSCipherChaCha20Poly1305:
		if err := errors.Join(size("key", c.Key, 32), size("IV", c.IV, 12), size("salt", c.Salt, 0)); err != nil {
			return nil, err
		}
		s := tlsCryptoChaCha20Poly1305{Info: info, RecSeq: seq}
		copy(s.IV[:], c.IV)
		copy(s.Key[:], c.Key)
		return structBytes(&s), nil
	}
	return bad("TLS cipher", c.Cipher, "want TLSCipherAESGCM128 (51), TLSCipherAESGCM256 (52) or TLSCipherChaCha20Poly1305 (54)")
}

// structBytes copies a fixed-size structure of bytes and uint16s into a new slice.
func structBytes[T any](s *T) []byte {
	b := make([]byte, unsafe.Sizeof(*s))
	copy(b, unsafe.Slice((*byte)(unsafe.Pointer(s)), len(b)))
	return b
}

// setsockoptBytes is the one setsockopt(2) wrapper with a raw buffer: it keeps the
// buffer alive and retries EINTR.
func setsockoptBytes(fd, level, opt int, b []byte) error {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	e := eintr.Errno(func() unix.Errno {
		_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
			uintptr(p), uintptr(len(b)), 0)
		return e
	})
	runtime.KeepAlive(b)
	if e != 0 {
		return e
	}
	return nil
}

// needTLS is what kernel TLS needs, for errors that say so.
const needTLS = "a kernel built with CONFIG_TLS (the tls module: modprobe tls), Linux 4.13+"

// EnableTLS attaches the "tls" upper-layer protocol to the established TCP socket fd
// (setsockopt TCP_ULP "tls"). Nothing changes on the wire until SetTLSTx or SetTLSRx.
// A kernel without TLS gives an error matching ErrNotSupported (ENOENT: no tls module).
func EnableTLS(fd int) error {
	const op = "setsockopt TCP_ULP tls"
	err := setsockoptBytes(fd, unix.IPPROTO_TCP, unix.TCP_ULP, []byte("tls"))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOENT):
		return opErr(op, fd, nil, errs.NotSupported("kernel TLS", needTLS, sysErr("setsockopt", err)))
	case errors.Is(err, unix.ENOPROTOOPT), errors.Is(err, unix.EOPNOTSUPP):
		return opErr(op, fd, nil, errs.NotSupported("kernel TLS on this socket", "a plain TCP socket (not MPTCP), Linux 4.13+", sysErr("setsockopt", err)))
	}
	return opErr(op, fd, nil, sysErr("setsockopt", err))
}

// SetTLSTx hands the kernel the transmit keys of fd (after EnableTLS): from then on every
// byte sent is encrypted into records, and SendTLSRecord sends non-data records. Setting
// new TX keys again (TLS 1.3 KeyUpdate) needs Linux 6.14; older kernels answer EBUSY,
// reported as matching ErrNotSupported. A cipher the kernel lacks (no crypto module, or
// ChaCha20-Poly1305 before Linux 5.11) also matches ErrNotSupported.
func SetTLSTx(fd int, c *TLSCrypto) error { return setTLSCrypto("setsockopt TLS_TX", fd, tlsTX, c) }

// SetTLSRx hands the kernel the receive keys of fd (after EnableTLS): from then on reads
// return decrypted data, and non-data records come with their type (RecvTLS). After a TLS
// 1.3 KeyUpdate record the kernel stops decrypting (reads fail with EKEYEXPIRED) until
// SetTLSRx gives it the next keys (Linux 6.14; older kernels answer EBUSY, reported as
// matching ErrNotSupported).
func SetTLSRx(fd int, c *TLSCrypto) error { return setTLSCrypto("setsockopt TLS_RX", fd, tlsRX, c) }

func setTLSCrypto(op string, fd, opt int, c *TLSCrypto) error {
	b, err := c.marshal(op)
	if err != nil {
		return err
	}
	err = setsockoptBytes(fd, solTLS, opt, b)
	clear(b) // key material
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EBUSY):
		return opErr(op, fd, nil, errs.NotSupported("kernel TLS rekey", "Linux 6.14 or newer (TLS 1.3 KeyUpdate)", sysErr("setsockopt", err)))
	case errors.Is(err, unix.ENOPROTOOPT):
		return opErr(op, fd, nil, errs.NotSupported("kernel TLS", "EnableTLS first, "+needTLS, sysErr("setsockopt", err)))
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EOPNOTSUPP):
		return opErr(op, fd, nil, errs.NotSupported("kernel TLS cipher "+TLSCipherName(c.Cipher),
			"a kernel with that cipher (ChaCha20-Poly1305: Linux 5.11; crypto modules gcm, aes, chacha20poly1305)", sysErr("setsockopt", err)))
	}
	return opErr(op, fd, nil, sysErr("setsockopt", err))
}

// SetTLSTxZeroCopyRO sets TLS_TX_ZEROCOPY_RO (Linux 6.0): sendfile may encrypt straight
// from the page cache, which is safe only if the file is not modified while it is sent.
func SetTLSTxZeroCopyRO(fd int, on bool) error {
	return setTLSFlag("setsockopt TLS_TX_ZEROCOPY_RO", fd, tlsTXZeroCopyRO, on)
}

// SetTLSRxExpectNoPad sets TLS_RX_EXPECT_NO_PAD (Linux 6.0, TLS 1.3 only): the kernel
// decrypts straight into the reader's buffer, betting that the peer does not pad records.
func SetTLSRxExpectNoPad(fd int, on bool) error {
	return setTLSFlag("setsockopt TLS_RX_EXPECT_NO_PAD", fd, tlsRXExpectNoPad, on)
}

func setTLSFlag(op string, fd, opt int, on bool) error {
	var v [4]byte
	binary.NativeEndian.PutUint32(v[:], uint32(boolInt(on)))
	err := setsockoptBytes(fd, solTLS, opt, v[:])
	if errors.Is(err, unix.ENOPROTOOPT) || errors.Is(err, unix.EINVAL) {
		return opErr(op, fd, nil, errs.NotSupported(op[len("setsockopt "):], "Linux 6.0 or newer with kernel TLS set up on the socket", sysErr("setsockopt", err)))
	}
	return opErr(op, fd, nil, sysErr("setsockopt", err))
}

// cmsgSpace1 is CMSG_SPACE(1): a control message carrying one byte.
var cmsgSpace1 = unix.CmsgSpace(1)

// RecvTLS is one recvmsg(2) on a socket with TLS_RX set, with room for the
// TLS_GET_RECORD_TYPE control message: it returns the bytes read and the type of the
// record(s) they came from. Data records give TLSRecordApplicationData; the kernel hands
// several data records to one call when p holds them, and stops before a non-data record,
// which a later call returns alone with its own type (an alert, a handshake message).
// n == 0 with a nil error is the peer's end of stream. flags are MSG_* (MSG_DONTWAIT).
// EAGAIN and the kernel's EKEYEXPIRED (a KeyUpdate was received: set new RX keys),
// EBADMSG (a record failed authentication) and EMSGSIZE come back as errors matching the
// errno; EINTR is retried.
func RecvTLS(fd int, p []byte, flags int) (n int, recordType uint8, err error) {
	oob := make([]byte, cmsgSpace1)
	var oobn int
	err = eintr.Retry(func() (err error) {
		n, oobn, _, _, err = unix.Recvmsg(fd, p, oob, flags)
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	recordType = TLSRecordApplicationData
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			return 0, 0, perr
		}
		for _, m := range msgs {
			if m.Header.Level == solTLS && m.Header.Type == tlsGetRecordType && len(m.Data) >= 1 {
				recordType = m.Data[0]
			}
		}
	}
	return n, recordType, nil
}

// SendTLSRecord sends p as one record of the given type (TLS_SET_RECORD_TYPE) on a socket
// with TLS_TX set: an alert, a handshake message (TLS 1.3 KeyUpdate). It returns the bytes
// taken; EINTR is retried. flags are MSG_* (MSG_NOSIGNAL is always added).
func SendTLSRecord(fd int, recordType uint8, p []byte, flags int) (int, error) {
	oob := make([]byte, cmsgSpace1)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level = solTLS
	h.Type = tlsSetRecordType
	h.SetLen(unix.CmsgLen(1))
	oob[unix.CmsgLen(0)] = recordType
	return eintr.Retry1(func() (int, error) { return unix.SendmsgN(fd, p, oob, nil, flags|unix.MSG_NOSIGNAL) })
}

// TLSSupport is what ProbeTLS found: whether the kernel has TLS, and which ciphers it
// accepts for TLS 1.2 and 1.3, both directions.
type TLSSupport struct {
	Ciphers map[uint16]bool // TLS cipher -> the kernel took TX and RX keys for it (TLS 1.3 and 1.2)
}

// Missing lists the ciphers of zcnet's three that the kernel refused ("" when none).
func (s TLSSupport) Missing() string {
	var miss []string
	for _, c := range []uint16{TLSCipherAESGCM128, TLSCipherAESGCM256, TLSCipherChaCha20Poly1305} {
		if !s.Ciphers[c] {
			miss = append(miss, TLSCipherName(c))
		}
	}
	return strings.Join(miss, ", ")
}

// ProbeTLS tries kernel TLS on a loopback connection of its own: the "tls" ULP, then TX
// and RX keys (all zero: nothing is sent) for each cipher and both versions. It returns
// what the kernel accepted, and nil or an error matching ErrNotSupported when the kernel
// has no TLS at all (this error says what is missing). Any other error means the probe
// itself failed (no loopback).
func ProbeTLS() (TLSSupport, error) {
	sup := TLSSupport{Ciphers: map[uint16]bool{}}
	for _, c := range []uint16{TLSCipherAESGCM128, TLSCipherAESGCM256, TLSCipherChaCha20Poly1305} {
		ok := true
		for _, v := range []uint16{TLSVersion13, TLSVersion12} {
			ulpErr, keyErr := probeCipher(v, c)
			if ulpErr != nil {
				return sup, ulpErr // no TLS at all, or no loopback
			}
			if keyErr != nil && !errors.Is(keyErr, ErrNotSupported) {
				return sup, keyErr
			}
			ok = ok && keyErr == nil
		}
		sup.Ciphers[c] = ok
	}
	return sup, nil
}

// probeCipher sets zero TX and RX keys of one cipher on a fresh loopback pair. ulpErr is
// the failure to get there (the ULP refused, no loopback), keyErr the kernel's answer to
// the keys.
func probeCipher(version, cipher uint16) (ulpErr, keyErr error) {
	c, s, err := loopbackPair()
	if err != nil {
		return err, nil
	}
	defer c.Close()
	defer s.Close()
	ulpErr = c.Control(func(fd int) error {
		if err := EnableTLS(fd); err != nil {
			return err
		}
		keyErr = SetTLSTx(fd, ZeroTLSCrypto(version, cipher))
		if keyErr == nil {
			keyErr = SetTLSRx(fd, ZeroTLSCrypto(version, cipher))
		}
		return nil
	})
	return ulpErr, keyErr
}

// ZeroTLSCrypto returns a TLSCrypto of the right sizes for cipher with all-zero keys and
// sequence number 0 (for probes and tests; unknown ciphers get AES-128-GCM's sizes).
func ZeroTLSCrypto(version, cipher uint16) *TLSCrypto {
	k := &TLSCrypto{Version: version, Cipher: cipher, Key: make([]byte, 16), IV: make([]byte, 8), Salt: make([]byte, 4)}
	switch cipher {
	case TLSCipherAESGCM256:
		k.Key = make([]byte, 32)
	case TLSCipherChaCha20Poly1305:
		k.Key, k.IV, k.Salt = make([]byte, 32), make([]byte, 12), nil
	}
	return k
}

// loopbackPair returns the two ends of a new TCP connection on 127.0.0.1 (blocking
// sockets): the dialer's and the acceptor's. The caller closes both.
func loopbackPair() (client, server *Socket, err error) {
	ln, err := ListenAddrPort("tcp4", netip.MustParseAddrPort("127.0.0.1:0"), ListenOptions{})
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	addr, err := ln.LocalAddr()
	if err != nil {
		return nil, nil, err
	}
	c, err := DialAddrPort(addr, DialOptions{})
	if err != nil {
		return nil, nil, err
	}
	s, _, err := ln.Accept()
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, s, nil
}

// ProbeTLSRekey says whether the kernel takes new TLS 1.3 keys on a socket that has keys
// already (TLS 1.3 KeyUpdate, Linux 6.14): nil, or an error matching ErrNotSupported (no
// kernel TLS, or EBUSY from an older kernel).
func ProbeTLSRekey() error {
	c, s, err := loopbackPair()
	if err != nil {
		return err
	}
	defer c.Close()
	defer s.Close()
	return c.Control(func(fd int) error {
		if err := EnableTLS(fd); err != nil {
			return err
		}
		for range 2 {
			if err := SetTLSTx(fd, ZeroTLSCrypto(TLSVersion13, TLSCipherAESGCM128)); err != nil {
				return err
			}
		}
		return nil
	})
}
