package services

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zcnet/zcnet/bench/internal/frame"
	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/framed"
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

// kvZC is the key-value server in zc's event-loop style, the way zc's docs teach a
// request/response protocol: requests framed with a framed.Reader over the received Data
// (parsed in place from Reader.Span when a request lies in one receive buffer, the usual
// case; Peek for the rare one split between buffers: nothing is carried or copied to
// frame), the responses of one OnData built in registered send buffers (Conn.Buffer) and
// sent once (Conn.Send). The store belongs to the queue (one queue: its handlers never run
// at once, so no lock): a small value is copied once into the store, into the slice it
// had (no allocation when it fits), and into the response; a value of kvSharedMin bytes
// or more is copied once into registered memory (zc.Shared, from the send pool) and every
// GET sends that memory by reference (Shared.Send): no copy per GET in user space. When no
// send buffer is free, the connection stops receiving until OnWritable.
func kvZC(c harness.Case, m *harness.Meter, ready func(string)) error {
	e, err := zc.New(zcConfig())
	if err != nil {
		return err
	}
	defer e.Close()
	fail := newFirstErr()
	var wg sync.WaitGroup
	wg.Add(c.Conns)
	// the store keeps at most half the send pool, so responses always find buffers
	store := &kvStore{m: map[string]*kvEntry{}, maxHeld: int64(e.Config().SendPoolMax / 2)}
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
	store.release()
	return fail.get()
}

// kvZCStraight is the key-value server written the straightforward way with the event-loop
// API (issue 29): the store is a Go map of Go slices (one queue: no lock), the response
// headers and small values of one OnData are gathered in a Go slice and written with one
// Conn.Write (a copy, after which a value is the store's again), and each
// value of kvSharedMin bytes or more is sent from the store's slice itself with
// Conn.SendBytes (no copy in user space), whose callback tells the store when the kernel
// is done with it. The store writes a SET into the key's slice when it fits and no send
// holds it; a replaced slice returns to a free list (by power-of-two size) once its sends
// are called back, and a SET takes its slice from there before it allocates one. Nothing
// of the store lives in the send pool, so it is not capped by it. When Write finds no
// send buffer (ErrWouldBlock), the rest waits in out, as in kvZC, until OnWritable.
func kvZCStraight(c harness.Case, m *harness.Meter, ready func(string)) error {
	e, err := zc.New(zcConfig())
	if err != nil {
		return err
	}
	defer e.Close()
	fail := newFirstErr()
	var wg sync.WaitGroup
	wg.Add(c.Conns)
	store := &kvAppStore{m: map[string]*kvAppEntry{}}
	if kvAppStoreMade != nil {
		kvAppStoreMade(store)
	}
	var accepted atomic.Int32
	l, err := e.Listen("tcp", c.Addr, func(conn *zc.Conn) zc.Handler {
		if accepted.Add(1) > int32(c.Conns) {
			return nil
		}
		m.Start()
		return &kvConn{app: store, fail: fail.set, done: wg.Done}
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

// kvAppStore is kvZCStraight's store (used by one queue's handlers and SendBytes
// callbacks only: no lock).
type kvAppStore struct {
	m    map[string]*kvAppEntry
	free [32][]*kvAppVal // slices no key and no send holds, by bits.Len(cap-1)
	// what the SETs did (for the tests): written into the key's slice, into a slice from
	// the free list, into a new slice; replaced slices freed by their last send's callback
	inPlace, reused, made, freedLate int
}

// kvAppStoreMade, when set (tests), is given kvZCStraight's store when it is made.
var kvAppStoreMade func(*kvAppStore)

// kvAppEntry is a key's place in the store: its current value (made on the key's first
// SET, the only map assignment of a key).
type kvAppEntry struct{ v *kvAppVal }

// kvAppVal is a stored value's slice and the sends of it the kernel still holds.
type kvAppVal struct {
	b     []byte
	sends int         // SendBytes of b not called back yet
	stale bool        // replaced: back to the free list when sends reaches 0
	done  func(error) // sent, made once per slice
	s     *kvAppStore
}

// sent is a SendBytes callback: the kernel is done with one send of v.b (whatever became
// of the connection: the slice is the store's again).
func (v *kvAppVal) sent(error) {
	v.sends--
	if v.sends == 0 && v.stale {
		v.stale = false
		v.s.freedLate++
		v.s.put(v)
	}
}

// kvAppClass is the size class of an n-byte value: its slice holds 1<<kvAppClass(n) bytes.
func kvAppClass(n int) int { return bits.Len(uint(max(n, 64) - 1)) }

func (s *kvAppStore) put(v *kvAppVal) {
	k := kvAppClass(cap(v.b))
	s.free[k] = append(s.free[k], v)
}

// get returns a slice of n bytes no one holds: from the free list, or made with the
// power-of-two capacity of n's class (at least 64 B), so that later SETs of the key of
// that class fit in it.
func (s *kvAppStore) get(n int) *kvAppVal {
	k := kvAppClass(n)
	if l := s.free[k]; len(l) > 0 {
		v := l[len(l)-1]
		s.free[k] = l[:len(l)-1]
		v.b = v.b[:n]
		s.reused++
		return v
	}
	s.made++
	v := &kvAppVal{b: make([]byte, n, 1<<k), s: s}
	v.done = v.sent
	return v
}

// set stores a value of n bytes under key, read by fill: into the key's slice when no send
// holds it and n is of its size class, else into another one (the old one is freed once
// its sends end). A slice is taken for its own class only, so that the store's memory is
// what its values need (a key that once held 100 KiB does not keep 128 KiB for 16 B).
func (s *kvAppStore) set(key []byte, n int, fill func(p []byte)) {
	e := s.m[string(key)] // no allocation: Go looks the key up without a string
	if e == nil {
		e = &kvAppEntry{}
		s.m[string(key)] = e
	}
	v := e.v
	switch {
	case v != nil && v.sends == 0 && kvAppClass(cap(v.b)) == kvAppClass(n):
		v.b = v.b[:n]
		s.inPlace++
	default:
		if v != nil {
			if v.sends == 0 {
				s.put(v)
			} else {
				v.stale = true
			}
		}
		v = s.get(n)
		e.v = v
	}
	fill(v.b)
}

// answerApp is answer for kvZCStraight's store (kvConn.app). The responses of one OnData
// are built in wb (a Go slice of the connection's, reused) and written with one Conn.Write
// (at the end of the OnData, before a value sent with SendBytes, or when wb holds
// kvWriteMax bytes), as a Go server's bufio.Writer would gather them.
func (h *kvConn) answerApp(c *zc.Conn, op byte, key []byte, vlen int, fill func(p []byte)) {
	var resp [kvRespHdr]byte
	switch op {
	case opSet:
		h.app.set(key, vlen, fill)
		resp[0] = stDone
		h.appendApp(c, resp[:])
	case opGet:
		var v *kvAppVal
		if e := h.app.m[string(key)]; e != nil {
			v = e.v
		}
		resp[0] = stMissing
		if v != nil {
			resp[0] = stValue
			binary.LittleEndian.PutUint32(resp[1:], uint32(len(v.b)))
		}
		h.appendApp(c, resp[:])
		switch {
		case v == nil:
		case len(v.b) < kvSharedMin:
			h.appendApp(c, v.b) // a copy: the slice is the store's again at once
		default:
			h.flushApp(c)
			if len(h.out) > 0 {
				h.out = append(h.out, v.b...) // behind responses waiting for a send buffer
				return
			}
			v.sends++
			if err := c.SendBytes(v.b, v.done); err != nil {
				v.sends--
				c.Close()
			}
		}
	}
}

// kvWriteMax is how many response bytes kvZCStraight gathers before it writes them.
const kvWriteMax = 32 << 10

// appendApp adds p to the responses being gathered (behind out when responses wait for a
// send buffer).
func (h *kvConn) appendApp(c *zc.Conn, p []byte) {
	if len(h.out) > 0 {
		h.out = append(h.out, p...)
		return
	}
	h.wb = append(h.wb, p...)
	if len(h.wb) >= kvWriteMax {
		h.flushApp(c)
	}
}

// flushApp writes the gathered responses with Conn.Write (a copy: wb is free again); what
// a Write refused for want of a send buffer (ErrWouldBlock on the loop) waits in out for
// OnWritable.
func (h *kvConn) flushApp(c *zc.Conn) {
	p := h.wb
	h.wb = h.wb[:0]
	if len(p) == 0 {
		return
	}
	n, err := c.Write(p)
	switch {
	case err == nil:
	case errors.Is(err, zc.ErrWouldBlock):
		h.out = append(h.out, p[n:]...)
	default:
		c.Close()
	}
}

// kvSharedMin is the value size from which the zc store keeps a value in registered
// memory and sends it by reference: below it, copying the value into the response buffer
// costs less than a send of its own.
const kvSharedMin = 8 << 10

// kvStore is the zc server's store (used by one queue's handlers only).
type kvStore struct {
	m       map[string]*kvEntry
	held    int64 // bytes of send-pool buffers the entries hold
	maxHeld int64
}

// kvEntry is a stored value: v (small values, rewritten in place) or sh (a value of
// kvSharedMin bytes or more, in send-pool buffers sent by reference).
type kvEntry struct {
	v    []byte
	sh   []*zc.Shared
	n    int
	held int64 // bytes of the buffers of sh
}

// dropShared gives the entry's registered buffers back (each returns to the pool once the
// sends queued with it are done).
func (s *kvStore) dropShared(e *kvEntry) {
	for _, sh := range e.sh {
		sh.Release()
	}
	e.sh = e.sh[:0]
	s.held -= e.held
	e.held = 0
}

func (s *kvStore) release() {
	for _, e := range s.m {
		s.dropShared(e)
	}
}

// entry returns key's entry, made on the first SET (the only allocation of a key).
func (s *kvStore) entry(key []byte) *kvEntry {
	e := s.m[string(key)] // no allocation: Go looks the key up without a string
	if e == nil {
		e = &kvEntry{}
		s.m[string(key)] = e
	}
	return e
}

// set stores a value of n bytes under key, read by fill (called with the slices to fill, in
// order, n bytes in all).
func (s *kvStore) set(c *zc.Conn, key []byte, n int, fill func(p []byte)) {
	e := s.entry(key)
	s.dropShared(e)
	e.n = n
	if n >= kvSharedMin && s.held+int64(n) <= s.maxHeld && s.setShared(c, e, n, fill) {
		e.v = e.v[:0]
		return
	}
	if cap(e.v) < n {
		e.v = make([]byte, n)
	}
	e.v = e.v[:n]
	fill(e.v)
}

// setShared copies the value into send-pool buffers, all taken first; false (nothing read)
// when the pool has not enough to spare: the value is then kept on the heap.
func (s *kvStore) setShared(c *zc.Conn, e *kvEntry, n int, fill func(p []byte)) bool {
	var taken [4]memreg.Buf
	bufs := taken[:0]
	for room := 0; room < n; {
		b, err := c.Buffer()
		if err != nil {
			for _, b := range bufs {
				b.Release()
			}
			return false
		}
		bufs = append(bufs, b)
		room += len(b.Bytes())
	}
	for _, b := range bufs {
		p := b.Bytes()
		p = p[:min(len(p), n)]
		n -= len(p)
		fill(p)
		s.held += int64(len(b.Bytes()))
		e.held += int64(len(b.Bytes()))
		sh, err := zc.NewShared(b, len(p)) // a pool's buffer, 1..len bytes: no error expected
		if err != nil {
			c.Close() // the value is lost: the client hears the connection close
			return true
		}
		e.sh = append(e.sh, sh)
	}
	return true
}

type kvConn struct {
	store   *kvStore
	app     *kvAppStore // kvZCStraight's store (nil: kvZC's)
	r       framed.Reader
	out     []byte // responses waiting for a send buffer
	wb      []byte // kvZCStraight: the responses being gathered for one Write
	buf     memreg.Buf
	bb      []byte // buf's bytes
	have    bool   // buf is being filled
	n       int    // bytes of buf filled
	blocked bool
	eof     bool
	fail    func(error)
	done    func()
}

func (h *kvConn) OnData(c *zc.Conn, d zc.Data) {
	h.r.Push(d) // the Reader owns d now
	if !h.blocked {
		h.serve(c)
	}
}

// serve answers the whole requests the Reader holds; a partial one stays for the next
// OnData.
func (h *kvConn) serve(c *zc.Conn) {
	for !h.blocked {
		// In place: the whole requests at the front of the first buffer, parsed there and
		// skipped together.
		span := h.r.Span()
		used := 0
		for !h.blocked && len(span)-used >= kvReqHdr {
			b := span[used:]
			op, klen, vlen := b[0], int(b[1]), int(binary.LittleEndian.Uint32(b[2:]))
			n := kvReqHdr + klen
			if op == opSet {
				n += vlen
			}
			if len(b) < n {
				break
			}
			v := b[kvReqHdr+klen : n]
			if !h.answer(c, op, b[kvReqHdr:kvReqHdr+klen], len(v), func(p []byte) { v = v[copy(p, v):] }) {
				return
			}
			used += n
		}
		if used > 0 {
			h.r.Skip(used)
			continue
		}
		// The next request goes on into the next buffer (or has not all arrived).
		var hk [kvReqHdr + 255]byte // its header and key
		if h.r.Peek(hk[:kvReqHdr]) < kvReqHdr {
			break
		}
		op, klen, vlen := hk[0], int(hk[1]), int(binary.LittleEndian.Uint32(hk[2:]))
		n := kvReqHdr + klen
		if op == opSet {
			n += vlen
		} else {
			vlen = 0
		}
		if h.r.Len() < n {
			break // the rest comes in a later Data
		}
		h.r.Peek(hk[:kvReqHdr+klen])
		h.r.Skip(kvReqHdr + klen)
		if !h.answer(c, op, hk[kvReqHdr:kvReqHdr+klen], vlen, func(p []byte) { h.r.Peek(p); h.r.Skip(len(p)) }) {
			return
		}
	}
	if h.app != nil {
		h.flushApp(c)
		if len(h.out) > 0 {
			h.blocked = true
		}
	}
	h.flush(c)
	if h.blocked {
		c.SetReceivePaused(true)
	} else if h.eof && h.r.Len() == 0 {
		c.Close()
	}
}

// answer serves one request: key, and for a SET the value's vlen bytes read by fill. false:
// the connection is closed (an unknown operation).
func (h *kvConn) answer(c *zc.Conn, op byte, key []byte, vlen int, fill func(p []byte)) bool {
	var resp [kvRespHdr]byte
	switch {
	case h.app != nil && (op == opSet || op == opGet):
		h.answerApp(c, op, key, vlen, fill)
		if len(h.out) > 0 {
			h.blocked = true
		}
		return true
	}
	switch op {
	case opSet:
		h.store.set(c, key, vlen, fill)
		resp[0] = stDone
		h.write(c, resp[:])
	case opGet:
		e := h.store.m[string(key)]
		if e == nil {
			resp[0] = stMissing
			h.write(c, resp[:])
			break
		}
		resp[0] = stValue
		binary.LittleEndian.PutUint32(resp[1:], uint32(e.n))
		h.write(c, resp[:])
		if len(e.sh) == 0 {
			h.write(c, e.v)
			break
		}
		h.sendShared(c, e.sh)
	default:
		h.fail(fmt.Errorf("unknown op %q", op))
		c.Close()
		return false
	}
	if len(h.out) > 0 {
		h.blocked = true
	}
	return true
}

// sendShared sends a stored value by reference, after the responses built so far; when
// responses wait for a send buffer already, the value's bytes wait behind them (a copy).
func (h *kvConn) sendShared(c *zc.Conn, sh []*zc.Shared) {
	if len(h.out) > 0 {
		for _, s := range sh {
			h.out = append(h.out, s.Bytes()...)
		}
		return
	}
	h.flush(c)
	for _, s := range sh {
		if err := s.Send(c); err != nil {
			c.Close()
			return
		}
	}
}

// write appends p to the response buffer being filled (a registered send buffer from
// Conn.Buffer), sending each one as it fills; every response of one OnData leaves in as
// few sends as fit. When no buffer is free, what is left waits in out for OnWritable.
func (h *kvConn) write(c *zc.Conn, p []byte) {
	if len(h.out) > 0 {
		h.out = append(h.out, p...)
		return
	}
	for len(p) > 0 {
		if !h.have {
			b, err := c.Buffer()
			if errors.Is(err, memreg.ErrExhausted) {
				h.out = append(h.out, p...)
				return
			}
			if err != nil {
				c.Close()
				return
			}
			h.buf, h.bb, h.have, h.n = b, b.Bytes(), true, 0
		}
		k := copy(h.bb[h.n:], p)
		h.n += k
		p = p[k:]
		if h.n == len(h.bb) {
			h.flush(c)
		}
	}
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
		h.write(c, out)
		h.flush(c)
		if len(h.out) > 0 {
			return
		}
	}
	if h.blocked {
		h.blocked = false
		h.serve(c)
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
		if h.r.Len() > 0 {
			h.fail(fmt.Errorf("stream ended inside a request (%d bytes)", h.r.Len()))
		}
		c.Close()
	}
}

func (h *kvConn) OnClose(c *zc.Conn, err error) {
	h.r.Release()
	if h.have {
		h.buf.Release()
		h.have = false
	}
	h.done()
}

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
	// At least one batch, however short the window (see the fan-out publisher).
	for first := true; first || !m.Stopped(); first = false {
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
