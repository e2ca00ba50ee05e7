package zc

import (
	"errors"
	"fmt"

	"github.com/zcnet/zcnet/memreg"
)

// Shared sends: one buffer sent on many connections without a copy, and received Data kept
// (or forwarded) by several holders. memreg counts the buffer's owners (memreg.Ref); every
// send is one owner until the kernel is done with it (its completion, or its zero-copy
// notification), and the buffer goes back to its pool with the last owner. Nobody may write
// a shared buffer.

// Retain returns a second reference to d's bytes, without copying them: d and the result are
// released (Release) or forwarded (Conn.SendData) each on its own, from any goroutine, and
// the bytes stay valid until the last reference is gone. The receiving connection's
// receive credit (MaxRecvHeld) stays charged until then, so a connection whose Data are
// retained stops receiving at its bound and resumes when the last reference goes. SendData
// of a reference sends the shared buffer itself (on the io_uring backend with no copy; on
// the plain and shim backends from the same memory), counted in Stats.Send.SharedSends.
//
// Data from the mapped window (RecvMapped) shares the window's pages as well: the window
// reads again once every reference is released. Data in a zcrx area shares the area's
// buffer: it goes back to the kernel's refill ring with the last reference.
// Retain of a released Data returns an error matching memreg.ErrStale.
func (d Data) Retain() (Data, error) {
	if d.src != nil {
		src, err := d.src.retain(d)
		if err != nil {
			return Data{}, err
		}
		return Data{c: d.c, src: src, off: d.off, n: d.n}, nil
	}
	var onLast func()
	if c := d.c; c != nil && d.buf.Region() != nil {
		credit := d.credit()
		onLast = func() { c.releaseHeld(credit) }
	}
	x, err := d.buf.Share(onLast)
	if err != nil {
		return Data{}, fmt.Errorf("zc: retain: %w", err)
	}
	return Data{c: d.c, src: (*refData)(x), n: d.n}, nil
}

// refData is a dataSource: one reference to a shared ring buffer (Retain, Slice). The
// receive credit goes back with the last reference (the onLast Retain gave memreg).
type refData memreg.Ref

func (r *refData) ref() *memreg.Ref { return (*memreg.Ref)(r) }
func (r *refData) bytes() []byte    { return r.ref().Bytes() }
func (r *refData) release(Data) error {
	return r.ref().Release()
}
func (r *refData) credit(Data) int64 { return int64(r.ref().Region().BufSize()) }

// send sends a retained reference: the shared buffer goes out.
func (r *refData) send(c *Conn, d Data) error { return c.sendRef(d, r.ref()) }
func (r *refData) retain(Data) (dataSource, error) {
	x, err := r.ref().Share()
	if err != nil {
		return nil, fmt.Errorf("zc: retain: %w", err)
	}
	return (*refData)(x), nil
}

// sendRef is SendData of a retained reference: the shared buffer goes out as is.
func (c *Conn) sendRef(d Data, r *memreg.Ref) error {
	if err := c.e.checkOwn(r.Region()); err != nil {
		d.Release()
		return c.opErr("send", err)
	}
	var sum uint64
	if dbg := c.e.dbg; dbg != nil && dbg.buffers() {
		if b := r.Bytes(); b != nil {
			sum = dbg.sum(b[:d.off+d.n]) // what dbg.sent reads back: from the start
		}
	}
	loan, err := r.Lend()
	r.Release() // the loan owns the buffer now (with the others)
	if err != nil {
		if errors.Is(err, memreg.ErrClosed) {
			err = ErrClosed
		}
		return c.opErr("send", err)
	}
	c.e.shareCtr.sends.Add(1)
	c.e.shareCtr.bytes.Add(uint64(d.n))
	s := loanSeg(loan, int32(d.off), int32(d.off+d.n))
	s.src, s.sum, s.shared = d.c, sum, true
	return c.enqueue(s)
}

// Slice returns a reference to n bytes of d from off, without copying them: as Retain
// (d stays valid, each is released or sent on its own, the receive credit goes back with the
// last reference), but over part of the bytes. off and n must lie within d (ErrInvalid;
// n == 0 is ErrEmpty).
func (d Data) Slice(off, n int) (Data, error) {
	if off < 0 || n < 0 || off > d.n || n > d.n-off {
		return Data{}, fmt.Errorf("zc: slice [%d, %d+%d) of %d bytes: %w", off, off, n, d.n, ErrInvalid)
	}
	if n == 0 {
		return Data{}, fmt.Errorf("zc: slice: %w", ErrEmpty)
	}
	r, err := d.Retain()
	if err != nil {
		return Data{}, err
	}
	r.off += off
	r.n = n
	return r, nil
}

// Shared is one send buffer sent on many connections without copying (a fan-out): each
// Send queues the same memory on one more connection, and the buffer returns to its pool
// when Release was called and every send is done with it (after its zero-copy notification
// when the send was zero-copy). Its methods may be called from any goroutine. Nobody may
// write the buffer once it is shared. ExampleShared shows the whole pattern.
type Shared struct {
	ref *memreg.Ref
	off int // where the bytes start in the buffer (a slice of received Data)
	n   int
	tag any // the engine that owns the buffer
}

// NewShared makes the first n bytes of b a shared send buffer, taking ownership of b (the
// handle is stale once NewShared returns). b must come from an engine's send pool
// (Conn.Buffer, Conn.BufferWait). n must be 1..len(b.Bytes()) (0: ErrEmpty, negative:
// ErrInvalid, more: ErrTooLarge); on those errors b is released.
func NewShared(b memreg.Buf, n int) (*Shared, error) {
	if !b.Valid() {
		return nil, fmt.Errorf("zc: shared: %w", memreg.ErrStale)
	}
	var err error
	switch {
	case b.Region().Pool() == nil:
		err = ErrForeignBuffer
	case n == 0:
		err = ErrEmpty
	case n < 0:
		err = fmt.Errorf("negative length %d: %w", n, ErrInvalid)
	case n > len(b.Bytes()):
		err = ErrTooLarge
	}
	if err != nil {
		b.Release()
		return nil, fmt.Errorf("zc: shared: %w", err)
	}
	x, err := b.Share(nil)
	if err != nil {
		return nil, fmt.Errorf("zc: shared: %w", err)
	}
	b.Release() // x owns the buffer alone now
	return &Shared{ref: x, n: n, tag: b.Region().Pool().Tag()}, nil
}

// Bytes returns the shared bytes (read only: what each Send sends, len(Bytes()) of them), or
// nil after Release.
func (s *Shared) Bytes() []byte {
	b := s.ref.Bytes()
	if b == nil {
		return nil
	}
	return b[s.off : s.off+s.n]
}

// Send queues the shared bytes on c, as Conn.Send does with a buffer of its own: the bytes
// count toward c's MaxQueuedBytes (Send does not block: above it, it still queues), the
// buffer stays lent until the kernel is done with this send. After Release it fails with
// memreg.ErrStale; on a connection of another engine with ErrForeignBuffer; on a closed one
// with ErrClosed (nothing is queued then).
func (s *Shared) Send(c *Conn) error {
	if err := s.send(c); err != nil {
		return err
	}
	c.e.shareCtr.sends.Add(1)
	c.e.shareCtr.bytes.Add(uint64(s.n))
	return nil
}

// send is Send without the engine's counters (FanOut adds them once per message).
func (s *Shared) send(c *Conn) error {
	if s == nil || s.ref == nil {
		return fmt.Errorf("zc: shared send: %w", ErrInvalid)
	}
	if c.e != s.tag {
		return c.opErr("send", ErrForeignBuffer)
	}
	var sum uint64
	if dbg := c.e.dbg; dbg != nil && dbg.buffers() {
		if b := s.ref.Bytes(); b != nil {
			sum = dbg.sum(b[:s.off+s.n]) // what dbg.sent reads back: from the start
		}
	}
	loan, err := s.ref.Lend()
	if err != nil {
		if errors.Is(err, memreg.ErrClosed) {
			err = ErrClosed
		}
		return c.opErr("send", err)
	}
	sg := loanSeg(loan, int32(s.off), int32(s.off+s.n))
	sg.sum, sg.shared = sum, true
	return c.enqueue(sg)
}

// Release drops the caller's reference: the buffer returns to its pool once the sends
// queued with it are done. A second Release returns memreg.ErrStale. It works after the
// engine closed.
func (s *Shared) Release() error {
	if s == nil || s.ref == nil {
		return memreg.ErrStale
	}
	return s.ref.Release()
}

// copyData queues a copy of p (the bytes of Data whose memory a send cannot reference) charged to src's receive credit until sent, all or nothing: every send buffer it
// needs is taken first, and when the pool refuses one (an error matching
// memreg.ErrExhausted: the connection then hears OnWritable when a buffer is free for it)
// the ones taken go back and nothing is queued. Bytes larger than the pool can ever hold
// at once are refused with ErrTooLarge.
// sendCopy is SendData of Data whose memory a send cannot reference (mapped; zcrx on the
// shim backend): the bytes are copied into send buffers (all or nothing, copyData) and d
// is released. The copies stay charged to the receiving connection's credit until sent
// (zcrx Data; mapped Data holds none), as forwarded ring buffers are, so flow control
// works the same. A
// refusal (the pool is exhausted: OnWritable follows; or too small: ErrTooLarge) leaves d
// with the caller.
func (c *Conn) sendCopy(d Data) error {
	p := d.Bytes()
	if p == nil {
		return c.opErr("send", memreg.ErrStale)
	}
	if err := c.copyData(p, d.c); err != nil {
		if errors.Is(err, memreg.ErrExhausted) || errors.Is(err, ErrTooLarge) {
			return err // nothing queued: d is still the caller's
		}
		d.Release()
		return err
	}
	d.Release()
	return nil
}

func (c *Conn) copyData(p []byte, src *Conn) error {
	bs := c.q.send.BufSize()
	need := (len(p) + bs - 1) / bs
	if need > c.q.send.MaxBytes()/bs {
		return c.opErr("send", fmt.Errorf("%d bytes to copy, the send pool holds at most %d: %w", len(p), c.q.send.MaxBytes(), ErrTooLarge))
	}
	var one [1]memreg.Buf
	bufs := one[:0]
	if need > 1 {
		bufs = make([]memreg.Buf, 0, need)
	}
	for len(bufs) < need {
		b, err := c.q.getBuf(c, c)
		if err != nil {
			for _, b := range bufs {
				b.Release()
			}
			return c.opErr("send", err)
		}
		bufs = append(bufs, b)
	}
	segs := make([]seg, 0, need)
	for _, b := range bufs {
		k := copy(b.Bytes(), p)
		p = p[k:]
		loan, err := b.Lend()
		if err != nil { // the engine closed meanwhile
			b.Release()
			for _, s := range segs {
				c.dropSeg(s)
			}
			return c.opErr("send", ErrClosed)
		}
		sg := loanSeg(loan, 0, int32(k))
		sg.src = src
		segs = append(segs, sg)
		if src != nil {
			src.held.Add(int64(loan.Region().BufSize())) // released by finishSeg
		}
	}
	for i, s := range segs {
		if err := c.enqueue(s); err != nil {
			for _, s := range segs[i+1:] {
				c.dropSeg(s)
			}
			return err // enqueue fails only once the connection is closing
		}
		c.e.shareCtr.dataCopied.Add(uint64(s.n))
	}
	return nil
}
