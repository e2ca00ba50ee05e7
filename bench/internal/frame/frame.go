// Package frame defines the self-checking byte stream that zcbench sends, and the
// streaming verifier that checks it on the other side.
//
// Every write of a benchmark is one frame of exactly Size bytes:
//
//	[0:4)          magic "zcB1"
//	[4:8)          frame size, uint32 little-endian
//	[8:16)         sequence number, uint64 little-endian, 0, 1, 2, ... per connection
//	[16:size-16)   payload: pseudo-random bytes fixed per size
//	[size-16:-8)   sequence number again
//	[size-8:-4)    CRC-32C of the payload
//	[size-4:size)  magic "zcB1"
//
// The payload never changes between frames, so a sender fills a buffer once (Fill)
// and afterwards only rewrites the 32 header and trailer bytes (Stamp): the harness
// adds no copy of its own to any mode. The receiver computes the CRC of every payload
// byte it gets, so a fast wrong answer (lost, duplicated, reordered or corrupted data)
// fails the run with ErrCorrupt.
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
)

// Overhead is the number of header and trailer bytes in a frame; MinSize the
// smallest frame.
const (
	Overhead = 32
	MinSize  = Overhead
	hdrLen   = 16
	trlLen   = 16
	magic    = 0x3142637a // "zcB1" little-endian
)

// ErrCorrupt is returned (wrapped) for any byte that is not where the stream says it
// must be.
var ErrCorrupt = errors.New("payload check failed")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Payload returns the payload of a frame of the given size (deterministic). The
// slice is shared: do not modify it.
func Payload(size int) []byte {
	return payloadOf(size).p
}

type payload struct {
	p   []byte
	crc uint32
}

var payloads sync.Map // size -> *payload

func payloadOf(size int) *payload {
	if p, ok := payloads.Load(size); ok {
		return p.(*payload)
	}
	p := makePayload(size)
	pl := &payload{p: p, crc: crc32.Checksum(p, castagnoli)}
	got, _ := payloads.LoadOrStore(size, pl)
	return got.(*payload)
}

func makePayload(size int) []byte {
	p := make([]byte, size-Overhead)
	x := uint64(size)*0x9e3779b97f4a7c15 | 1
	for i := range p {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		p[i] = byte(x >> 24)
	}
	return p
}

// Source produces the frames of one connection. It is not safe for concurrent use.
type Source struct {
	size    int
	payload []byte
	crc     uint32
	next    uint64
	sent    uint64
	corrupt int64 // sequence number of the frame to damage, or -1
}

// NewSource returns a Source of frames of size bytes. corruptSeq >= 0 makes the frame
// with that sequence number carry one flipped payload byte under the checksum of the
// intact payload, so only a receiver that hashes the payload notices (fault injection for
// tests and for checking the checker; a frame of MinSize, which has no payload, gets a
// wrong checksum instead); pass -1 normally.
func NewSource(size int, corruptSeq int64) (*Source, error) {
	if size < MinSize {
		return nil, fmt.Errorf("frame size %d below minimum %d", size, MinSize)
	}
	pl := payloadOf(size)
	return &Source{size: size, payload: pl.p, crc: pl.crc, corrupt: corruptSeq}, nil
}

// Size is the frame size in bytes.
func (s *Source) Size() int { return s.size }

// Fill writes the fixed payload into buf (len(buf) must be Size). Call it once per
// buffer; afterwards Stamp is enough.
func (s *Source) Fill(buf []byte) {
	_ = buf[s.size-1]
	copy(buf[hdrLen:s.size-trlLen], s.payload)
}

// Stamp turns a Filled buffer into the next frame of the stream and returns its
// sequence number.
func (s *Source) Stamp(buf []byte) uint64 {
	seq := s.next
	s.next++
	b := buf[:s.size]
	binary.LittleEndian.PutUint32(b[0:], magic)
	binary.LittleEndian.PutUint32(b[4:], uint32(s.size))
	binary.LittleEndian.PutUint64(b[8:], seq)
	t := b[s.size-trlLen:]
	binary.LittleEndian.PutUint64(t[0:], seq)
	crc := s.crc
	if k := (s.size - hdrLen - trlLen) / 2; k < len(s.payload) {
		// One byte in the middle of the payload: rewritten in every frame, so a buffer
		// that carried the damaged frame is whole again in the next.
		b[hdrLen+k] = s.payload[k]
		if int64(seq) == s.corrupt {
			b[hdrLen+k] ^= 0x40
		}
	} else if int64(seq) == s.corrupt {
		crc ^= 1
	}
	binary.LittleEndian.PutUint32(t[8:], crc)
	binary.LittleEndian.PutUint32(t[12:], magic)
	return seq
}

// Sent records that one stamped frame was handed to the kernel completely.
func (s *Source) Sent() { s.sent++ }

// SentFrames records that n stamped frames were handed to the kernel (a sender that
// writes many frames in one call, such as a file send).
func (s *Source) SentFrames(n uint64) { s.sent += n }

// Frames is the number of frames recorded with Sent.
func (s *Source) Frames() uint64 { return s.sent }

// Check checks one whole frame on its own (magic, size, the two sequence numbers agree,
// payload CRC), without the stream order a Verifier enforces: for servers whose
// requests arrive in no fixed order per connection (HTTP). It returns the frame's
// sequence number.
func Check(p []byte, size int) (uint64, error) {
	if size < MinSize {
		return 0, fmt.Errorf("frame size %d below minimum %d", size, MinSize)
	}
	if len(p) != size {
		return 0, fmt.Errorf("%w: %d bytes, want one frame of %d", ErrCorrupt, len(p), size)
	}
	if m := binary.LittleEndian.Uint32(p[0:]); m != magic {
		return 0, fmt.Errorf("%w: bad magic %#08x", ErrCorrupt, m)
	}
	if n := binary.LittleEndian.Uint32(p[4:]); n != uint32(size) {
		return 0, fmt.Errorf("%w: frame size %d, want %d", ErrCorrupt, n, size)
	}
	seq := binary.LittleEndian.Uint64(p[8:])
	t := p[size-trlLen:]
	if s := binary.LittleEndian.Uint64(t[0:]); s != seq {
		return seq, fmt.Errorf("%w: frame %d: trailer sequence %d", ErrCorrupt, seq, s)
	}
	want := payloadOf(size).crc
	if c := binary.LittleEndian.Uint32(t[8:]); c != want || crc32.Checksum(p[hdrLen:size-trlLen], castagnoli) != want {
		return seq, fmt.Errorf("%w: frame %d: payload CRC-32C (sender says %08x), want %08x", ErrCorrupt, seq, c, want)
	}
	if m := binary.LittleEndian.Uint32(t[12:]); m != magic {
		return seq, fmt.Errorf("%w: frame %d: bad trailer magic %#08x", ErrCorrupt, seq, m)
	}
	return seq, nil
}

// Verifier checks the byte stream of one connection. It is not safe for concurrent
// use.
type Verifier struct {
	size    int
	want    uint32 // CRC of the payload
	pos     int    // position inside the current frame
	crc     uint32 // running CRC of the current payload
	seq     uint64 // expected sequence number
	frames  uint64
	bytes   uint64
	scratch [trlLen]byte
	onData  func()
}

// NewVerifier returns a Verifier for frames of size bytes. onData, if not nil, is
// called before the first byte is checked.
func NewVerifier(size int, onData func()) (*Verifier, error) {
	if size < MinSize {
		return nil, fmt.Errorf("frame size %d below minimum %d", size, MinSize)
	}
	return &Verifier{size: size, want: payloadOf(size).crc, onData: onData}, nil
}

// NewVerifierAt is NewVerifier for a stream that starts at frame seq (a slice of a
// frame file).
func NewVerifierAt(size int, seq uint64, onData func()) (*Verifier, error) {
	v, err := NewVerifier(size, onData)
	if err == nil {
		v.seq = seq
	}
	return v, err
}

// Frames and Bytes count what was verified completely.
func (v *Verifier) Frames() uint64 { return v.frames }
func (v *Verifier) Bytes() uint64  { return v.bytes }

// Feed checks the next bytes of the stream. After an error the Verifier stays failed.
func (v *Verifier) Feed(p []byte) error {
	if v.onData != nil {
		v.onData()
		v.onData = nil
	}
	if v.pos < 0 {
		return fmt.Errorf("%w: stream already failed", ErrCorrupt)
	}
	for len(p) > 0 {
		payEnd := v.size - trlLen
		switch {
		case v.pos < hdrLen:
			n := copy(v.scratch[v.pos:hdrLen], p)
			v.pos += n
			p = p[n:]
			if v.pos == hdrLen {
				if err := v.header(); err != nil {
					return err
				}
			}
		case v.pos < payEnd:
			n := min(len(p), payEnd-v.pos)
			v.crc = crc32.Update(v.crc, castagnoli, p[:n])
			v.pos += n
			p = p[n:]
		default:
			off := v.pos - payEnd
			n := copy(v.scratch[off:trlLen], p)
			v.pos += n
			p = p[n:]
			if v.pos == v.size {
				if err := v.trailer(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (v *Verifier) header() error {
	h := v.scratch[:hdrLen]
	if m := binary.LittleEndian.Uint32(h[0:]); m != magic {
		return v.fail("bad magic %#08x at frame start", m)
	}
	if n := binary.LittleEndian.Uint32(h[4:]); n != uint32(v.size) {
		return v.fail("frame size %d, want %d", n, v.size)
	}
	if s := binary.LittleEndian.Uint64(h[8:]); s != v.seq {
		return v.fail("sequence %d, want %d", s, v.seq)
	}
	v.crc = 0
	return nil
}

func (v *Verifier) trailer() error {
	t := v.scratch[:trlLen]
	if s := binary.LittleEndian.Uint64(t[0:]); s != v.seq {
		return v.fail("trailer sequence %d, want %d", s, v.seq)
	}
	if c := binary.LittleEndian.Uint32(t[8:]); c != v.want || v.crc != v.want {
		return v.fail("payload CRC-32C %08x (sender says %08x), want %08x", v.crc, c, v.want)
	}
	if m := binary.LittleEndian.Uint32(t[12:]); m != magic {
		return v.fail("bad trailer magic %#08x", m)
	}
	v.seq++
	v.frames++
	v.bytes += uint64(v.size)
	v.pos = 0
	return nil
}

func (v *Verifier) fail(format string, args ...any) error {
	err := fmt.Errorf("%w: frame %d (size %d): %s", ErrCorrupt, v.seq, v.size, fmt.Sprintf(format, args...))
	v.pos = -1
	return err
}

// Close reports an error if the stream ended inside a frame.
func (v *Verifier) Close() error {
	if v.pos > 0 {
		return fmt.Errorf("%w: stream ended %d bytes into frame %d (size %d)", ErrCorrupt, v.pos, v.seq, v.size)
	}
	return nil
}
