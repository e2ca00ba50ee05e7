package services

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zcnet/zcnet/bench/internal/frame"
	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/zc"
)

// The key-value protocol. Request: [op u8 'G' or 'S'][key length u8][value length u32]
// [key][value]; response: [status u8: 'V' value, 'N' no such key, 'O' stored][value
// length u32][value].
const (
	opGet, opSet               = 'G', 'S'
	stValue, stMissing, stDone = 'V', 'N', 'O'
	kvReqHdr, kvRespHdr        = 6, 5
	// KVDepth is how many requests a client pipelines per round trip.
	KVDepth = 16
	// kvKeys is how many keys each connection uses (its own).
	kvKeys = 64
	// KVMixMax is the Case.Size that selects the mixed value sizes (up to 100 KiB);
	// any other size selects the small values (16–64 B).
	KVMixMax = 100 << 10
)

// kvValueSize draws a value size: 16–64 B; with mix, 70% of those, 25% 256 B–4 KiB and
// 5% 16–100 KiB.
func kvValueSize(r *rand.Rand, mix bool) int {
	if mix {
		switch x := r.IntN(100); {
		case x < 5:
			return 16<<10 + r.IntN(KVMixMax-16<<10+1)
		case x < 30:
			return 256 + r.IntN(4096-256+1)
		}
	}
	return 16 + r.IntN(49)
}

// kvNet is the key-value server Go users write: a goroutine per connection with a
// bufio.Reader and a bufio.Writer (flushed when no request is buffered), one map behind
// a sync.RWMutex; a stored value is a slice of its own.
func kvNet(ctx context.Context, c harness.Case, m *harness.Meter, ready func(string)) error {
	var mu sync.RWMutex
	store := map[string][]byte{}
	return serveNet(ctx, c, m, ready, func(conn *net.TCPConn) error {
		br, bw := bufio.NewReaderSize(conn, 64<<10), bufio.NewWriterSize(conn, 64<<10)
		var hdr [kvReqHdr]byte
		var key [255]byte
		var resp [kvRespHdr]byte
		for {
			if _, err := io.ReadFull(br, hdr[:]); err != nil {
				if err != io.EOF {
					return err
				}
				return nil
			}
			k := key[:hdr[1]]
			vlen := binary.LittleEndian.Uint32(hdr[2:])
			if _, err := io.ReadFull(br, k); err != nil {
				return err
			}
			switch hdr[0] {
			case opSet:
				v := make([]byte, vlen)
				if _, err := io.ReadFull(br, v); err != nil {
					return err
				}
				mu.Lock()
				store[string(k)] = v
				mu.Unlock()
				resp[0] = stDone
				binary.LittleEndian.PutUint32(resp[1:], 0)
				bw.Write(resp[:])
			case opGet:
				mu.RLock()
				v, ok := store[string(k)]
				mu.RUnlock()
				resp[0] = stValue
				if !ok {
					resp[0] = stMissing
				}
				binary.LittleEndian.PutUint32(resp[1:], uint32(len(v)))
				bw.Write(resp[:])
				bw.Write(v)
			default:
				return fmt.Errorf("unknown op %q", hdr[0])
			}
			if br.Buffered() == 0 {
				if err := bw.Flush(); err != nil {
					return err
				}
			}
		}
	})
}

// kvZC is the key-value server in zc's event-loop style: requests parsed from the
// received Data in OnData (a request split over two Data is copied together, as a user
// does today), values copied into the store, the responses of one OnData copied into
// registered send buffers (Conn.Buffer) and sent (Conn.Send); when no buffer is free,
// the connection stops receiving until OnWritable.
func kvZC(c harness.Case, m *harness.Meter, ready func(string)) error {
	e, err := zc.New(zcConfig())
	if err != nil {
		return err
	}
	defer e.Close()
	fail := newFirstErr()
	var wg sync.WaitGroup
	wg.Add(c.Conns)
	store := map[string][]byte{} // one queue: its handlers never run at once
	var accepted atomic.Int32
	l, err := e.Listen("tcp", c.Addr, func(conn *zc.Conn) zc.Handler {
		if accepted.Add(1) > int32(c.Conns) {
			return nil
		}
		m.Start()
		return &kvConn{store: store, fail: fail.set, done: wg.Done}
	})
	if err != nil {
		return err
	}
	ready(l.Addr().String())
	wg.Wait()
	m.Stop()
	l.Close()
	return fail.get()
}

type kvConn struct {
	store   map[string][]byte
	carry   []byte // input not parsed yet (a partial request, or requests waiting for room)
	out     []byte // responses waiting for a send buffer
	buf     memreg.Buf
	have    bool // buf is being filled
	n       int  // bytes of buf filled
	blocked bool
	eof     bool
	fail    func(error)
	done    func()
}

func (h *kvConn) OnData(c *zc.Conn, d zc.Data) {
	b := d.Bytes()
	if len(h.carry) > 0 || h.blocked {
		h.carry = append(h.carry, b...)
		d.Release()
		h.serve(c, nil)
		return
	}
	h.serve(c, b)
	d.Release()
}

// serve answers the whole requests of b (nil: of carry) and keeps the rest in carry.
func (h *kvConn) serve(c *zc.Conn, b []byte) {
	fromCarry := b == nil
	if fromCarry {
		b = h.carry
	}
	for !h.blocked && len(b) >= kvReqHdr {
		klen, vlen := int(b[1]), int(binary.LittleEndian.Uint32(b[2:]))
		n := kvReqHdr + klen
		if b[0] == opSet {
			n += vlen
		}
		if len(b) < n {
			break
		}
		key := b[kvReqHdr : kvReqHdr+klen]
		var resp [kvRespHdr]byte
		var val []byte
		switch b[0] {
		case opSet:
			h.store[string(key)] = bytes.Clone(b[kvReqHdr+klen : n])
			resp[0] = stDone
		case opGet:
			v, ok := h.store[string(key)]
			resp[0] = stValue
			if !ok {
				resp[0] = stMissing
			}
			binary.LittleEndian.PutUint32(resp[1:], uint32(len(v)))
			val = v
		default:
			h.fail(fmt.Errorf("unknown op %q", b[0]))
			c.Close()
			return
		}
		b = b[n:]
		// Both parts, in order: once one waits in out, the other queues behind it.
		okHdr := h.write(c, resp[:])
		okVal := h.write(c, val)
		if !okHdr || !okVal {
			h.blocked = true
		}
	}
	if fromCarry {
		h.carry = append(h.carry[:0], b...)
	} else {
		h.carry = append(h.carry, b...)
	}
	h.flush(c)
	if h.blocked {
		c.SetReceivePaused(true)
	} else if h.eof && len(h.carry) == 0 {
		c.Close()
	}
}

// write appends p to the response buffer being filled (a registered send buffer from
// Conn.Buffer), sending each one as it fills; every response of one OnData leaves in as
// few sends as fit. When no buffer is free, what is left waits in out for OnWritable
// (false).
func (h *kvConn) write(c *zc.Conn, p []byte) bool {
	if len(h.out) > 0 {
		h.out = append(h.out, p...)
		return false
	}
	for len(p) > 0 {
		if !h.have {
			b, err := c.Buffer()
			if errors.Is(err, memreg.ErrExhausted) {
				h.out = append(h.out, p...)
				return false
			}
			if err != nil {
				c.Close()
				return false
			}
			h.buf, h.have, h.n = b, true, 0
		}
		k := copy(h.buf.Bytes()[h.n:], p)
		h.n += k
		p = p[k:]
		if h.n == len(h.buf.Bytes()) {
			h.flush(c)
		}
	}
	return true
}

// flush sends the response buffer being filled.
func (h *kvConn) flush(c *zc.Conn) {
	if !h.have {
		return
	}
	h.have = false
	if h.n == 0 {
		h.buf.Release()
		return
	}
	if err := c.Send(h.buf, h.n); err != nil {
		c.Close()
	}
}

func (h *kvConn) OnWritable(c *zc.Conn) {
	if len(h.out) > 0 {
		out := h.out
		h.out = nil
		if !h.write(c, out) {
			h.flush(c)
			return
		}
		h.flush(c)
	}
	if h.blocked {
		h.blocked = false
		h.serve(c, nil)
		if !h.blocked {
			c.SetReceivePaused(false)
		}
	}
}

func (h *kvConn) OnEOF(c *zc.Conn, err error) {
	h.eof = true
	if err != io.EOF {
		h.fail(err)
	}
	if !h.blocked && len(h.out) == 0 {
		if len(h.carry) > 0 {
			h.fail(fmt.Errorf("stream ended inside a request (%d bytes)", len(h.carry)))
		}
		c.Close()
	}
}

func (h *kvConn) OnClose(c *zc.Conn, err error) { h.done() }

// kvClient runs c.Conns connections; each pipelines KVDepth GET/SET requests (half
// each) on its own kvKeys keys through a bufio.Writer, reads the KVDepth responses and
// checks every byte of every value against what it stored last, until the run's time is
// up.
func kvClient(ctx context.Context, c harness.Case, m *harness.Meter) error {
	conns := make([]*net.TCPConn, c.Conns)
	var err error
	for i := range conns {
		if conns[i], err = dialNet(ctx, c.Addr); err != nil {
			return fmt.Errorf("connection %d of %d: %w", i+1, c.Conns, err)
		}
		defer conns[i].Close()
	}
	// Values are slices of one random pool: nothing to build per request, and the
	// expected bytes of a key are the slice it was last set to.
	pool := make([]byte, 2*KVMixMax)
	rand.NewChaCha8([32]byte{1}).Read(pool)
	var open closers
	for _, c := range conns {
		open.add(c)
	}
	fail := newFirstErr()
	fail.onErr = open.closeAll
	var wg sync.WaitGroup
	m.Start()
	for i, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail.set(kvDrive(conn, m, i, pool, c.Size == KVMixMax, c.CorruptSeq))
		}()
	}
	wg.Wait()
	m.Stop()
	return fail.get()
}

type kvOp struct {
	get  bool
	key  int
	want []byte // GET: the value expected (nil: no such key)
}

func kvDrive(conn *net.TCPConn, m *harness.Meter, id int, pool []byte, mix bool, corrupt int64) error {
	r := rand.New(rand.NewPCG(uint64(id), 7))
	br, bw := bufio.NewReaderSize(conn, 64<<10), bufio.NewWriterSize(conn, 64<<10)
	rec := m.NewRecorder()
	stored := make([][]byte, kvKeys)
	keys := make([][]byte, kvKeys)
	for k := range keys {
		keys[k] = fmt.Appendf(nil, "c%04d-k%02d", id, k)
	}
	ops := make([]kvOp, KVDepth)
	var hdr [kvReqHdr]byte
	var resp [kvRespHdr]byte
	got := make([]byte, KVMixMax)
	var n int64
	readBack := -1 // -selftest-corrupt: the key whose damaged value the next GET reads
	var units, vbytes uint64
	defer func() { m.Count(units, vbytes) }()
	for !m.Stopped() {
		t0 := time.Now()
		for i := range ops {
			op := kvOp{get: r.IntN(2) == 0, key: r.IntN(kvKeys)}
			switch {
			case n == corrupt:
				op.get, readBack = false, op.key
			case readBack >= 0:
				op = kvOp{get: true, key: readBack}
				readBack = -1
			}
			hdr[1] = byte(len(keys[op.key]))
			if op.get {
				hdr[0] = opGet
				binary.LittleEndian.PutUint32(hdr[2:], 0)
				op.want = stored[op.key]
				bw.Write(hdr[:])
				bw.Write(keys[op.key])
			} else {
				size := kvValueSize(r, mix)
				off := r.IntN(len(pool) - size)
				v := pool[off : off+size]
				hdr[0] = opSet
				binary.LittleEndian.PutUint32(hdr[2:], uint32(size))
				bw.Write(hdr[:])
				bw.Write(keys[op.key])
				if n == corrupt {
					bad := bytes.Clone(v)
					bad[size/2] ^= 0x01
					bw.Write(bad)
				} else {
					bw.Write(v)
				}
				stored[op.key] = v
			}
			ops[i] = op
			n++
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		for _, op := range ops {
			if _, err := io.ReadFull(br, resp[:]); err != nil {
				return fmt.Errorf("response: %w", err)
			}
			vlen := int(binary.LittleEndian.Uint32(resp[1:]))
			switch {
			case !op.get && (resp[0] != stDone || vlen != 0):
				return fmt.Errorf("%w: SET answered %q with %d bytes", frame.ErrCorrupt, resp[0], vlen)
			case op.get && op.want == nil && (resp[0] != stMissing || vlen != 0):
				return fmt.Errorf("%w: GET of an unset key answered %q with %d bytes", frame.ErrCorrupt, resp[0], vlen)
			case op.get && op.want != nil && (resp[0] != stValue || vlen != len(op.want)):
				return fmt.Errorf("%w: GET answered %q with %d bytes, want %d", frame.ErrCorrupt, resp[0], vlen, len(op.want))
			}
			if vlen > len(got) {
				return fmt.Errorf("%w: value of %d bytes", frame.ErrCorrupt, vlen)
			}
			if _, err := io.ReadFull(br, got[:vlen]); err != nil {
				return fmt.Errorf("response: %w", err)
			}
			if !bytes.Equal(got[:vlen], op.want) {
				return fmt.Errorf("%w: GET of key %d: the value is not what was stored", frame.ErrCorrupt, op.key)
			}
			units++
			vbytes += uint64(vlen)
		}
		rec.Add(time.Since(t0))
	}
	return nil
}
