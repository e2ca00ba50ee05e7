package framed

import (
	"fmt"

	"github.com/zcnet/zcnet/zc"
)

// Reader is a no-copy reader over received zc.Data: OnData pushes what arrived, the parser
// peeks at headers (Peek copies only the bytes asked for), skips what it does not need, and
// takes whole messages with Next as references to the received buffers (Data.Slice: no
// copy), wherever the buffer boundaries fall. A message held this way keeps its buffers, and
// the receiving connection's receive credit, until released; forwarding its parts with
// SendData (Message.SendTo) sends the received memory itself, so a reply that quotes a
// request (or a cached value) is a vectored send of held Data. A Reader is used by one
// goroutine at a time (the connection's handler); its zero value is ready to use.
//
// A server of many small requests per receive buffer (a key-value store) parses fastest in
// place: Span is the first buffer's bytes, a request that lies whole in it is read there and
// Skipped (no Data reference made, nothing copied), and only a request that goes on into the
// next buffer takes the Peek/Next path. Bytes kept beyond the handler (a stored value) are
// copied once, out of the receive buffer, so that receive credit is never held by a cache.
type Reader struct {
	q   []zc.Data // pushed, not yet consumed: q[h:]; the first starts at off
	h   int       // consumed Data at the front of q (emptied; q is reused once all are)
	off int
	n   int // bytes available
}

// Push adds d at the end (the Reader owns it now). Empty Data is released.
func (r *Reader) Push(d zc.Data) {
	if d.Len() == 0 {
		d.Release()
		return
	}
	r.q = append(r.q, d)
	r.n += d.Len()
}

// Span returns the available bytes of the first received buffer without copying them (nil
// when nothing is available): a parser reads a message in place when the whole message lies
// in the span (the common case: a buffer holds many small requests), then Skips it, and
// falls back to Peek and Next only for a message that goes on into the next buffer. The
// slice is read only and valid until the next Skip, Next or Release.
func (r *Reader) Span() []byte {
	if r.h == len(r.q) {
		return nil
	}
	b := r.q[r.h].Bytes()
	if b == nil {
		return nil // a pushed Data released behind the Reader's back (a misuse)
	}
	return b[r.off:]
}

// Len returns the bytes available.
func (r *Reader) Len() int { return r.n }

// Peek copies the first len(p) available bytes (or all, if fewer) into p without consuming
// them, and returns how many it copied: for headers, not payloads.
func (r *Reader) Peek(p []byte) int {
	k, off := 0, r.off
	for _, d := range r.q[r.h:] {
		if k == len(p) {
			break
		}
		k += copy(p[k:], d.Bytes()[off:])
		off = 0
	}
	return k
}

// Skip drops the first n available bytes (their buffers go back once nothing else holds
// them). n over Len is zc.ErrInvalid, and nothing is dropped.
func (r *Reader) Skip(n int) error {
	if n < 0 || n > r.n {
		return fmt.Errorf("framed: reader: skip %d of %d bytes: %w", n, r.n, zc.ErrInvalid)
	}
	r.n -= n
	for n > 0 {
		d := r.q[r.h]
		left := d.Len() - r.off
		if n < left {
			r.off += n
			return nil
		}
		n -= left
		r.pop()
	}
	return nil
}

// pop drops the first Data.
func (r *Reader) pop() {
	r.q[r.h].Release()
	r.take()
}

// take drops the first Data from q (its owner is elsewhere now), reusing q's array once
// every Data is consumed, so that a Reader does not allocate per Push.
func (r *Reader) take() {
	r.q[r.h] = zc.Data{}
	r.h++
	r.off = 0
	if r.h == len(r.q) {
		r.q, r.h = r.q[:0], 0
	}
}

// Next takes the first n available bytes as a Message: references to the received buffers,
// no copy. n over Len is zc.ErrInvalid (check Len first: a message not fully arrived stays
// where it is); 0 is zc.ErrEmpty. Data that cannot be sliced (zcrx) is zc.ErrNotSupported.
func (r *Reader) Next(n int) (Message, error) {
	if n <= 0 || n > r.n {
		if n == 0 {
			return Message{}, fmt.Errorf("framed: reader: %w", zc.ErrEmpty)
		}
		return Message{}, fmt.Errorf("framed: reader: next %d of %d bytes: %w", n, r.n, zc.ErrInvalid)
	}
	var m Message
	for left := n; left > 0; {
		d := r.q[r.h]
		avail := d.Len() - r.off
		k := min(left, avail)
		if r.off == 0 && k == avail {
			// the whole Data: it moves into the message as is
			r.take()
			m.parts = append(m.parts, d)
		} else {
			p, err := d.Slice(r.off, k)
			if err != nil {
				m.Release()
				return Message{}, err
			}
			m.parts = append(m.parts, p)
			if k == avail {
				r.pop()
			} else {
				r.off += k
			}
		}
		m.n += k
		left -= k
		r.n -= k
	}
	return m, nil
}

// Release drops everything the Reader holds.
func (r *Reader) Release() {
	for r.h < len(r.q) {
		r.pop()
	}
	r.n = 0
}

// Message is bytes taken from a Reader: references to received buffers, in order.
type Message struct {
	parts []zc.Data
	n     int
}

// Len returns the message's length.
func (m Message) Len() int { return m.n }

// Parts returns the message's pieces (each a zc.Data the message owns: do not release them,
// Release the message).
func (m Message) Parts() []zc.Data { return m.parts }

// AppendTo appends a copy of the bytes to p (for a caller that wants them in one slice).
func (m Message) AppendTo(p []byte) []byte {
	for _, d := range m.parts {
		p = append(p, d.Bytes()...)
	}
	return p
}

// Release gives every piece back (each piece's buffer returns once nothing else holds it).
func (m Message) Release() {
	for _, d := range m.parts {
		d.Release()
	}
}

// SendTo sends the message on c with SendData, piece by piece, without copying (the pieces
// leave in one vectored send when nothing else is in flight), and releases the message. On an
// error the pieces not sent are released, and the error returned.
func (m Message) SendTo(c *zc.Conn) error {
	for i, d := range m.parts {
		if err := c.SendData(d); err != nil {
			d.Release() // a refused copy leaves it with us (ErrStale when SendData released it)
			for _, d := range m.parts[i+1:] {
				d.Release()
			}
			return err
		}
	}
	return nil
}
