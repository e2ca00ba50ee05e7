package zc

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// The mapped receive path (RecvMapped): a multishot poll tells the loop the socket is
// readable; the loop then calls TCP_ZEROCOPY_RECEIVE (tcpglue.RecvWindow) itself, handing
// the mapped pages and the copied remainder to OnData. The window's pages stay valid until the
// next receive call, so the loop reads again only once the handler released everything it
// got; closing defers the window's unmap until then too, so a handler never reads unmapped
// memory.

const mappedWindow = 1 << 20

type mappedRecv struct {
	w        *tcpglue.RecvWindow
	copyBuf  []byte
	out      atomic.Int32 // Data handed out and not released
	wantRead bool
	posted   atomic.Bool
	c        *Conn

	mu     sync.Mutex
	closed bool // the connection finished: unmap once out drops to zero
}

type mappedData struct {
	m        *mappedRecv
	b        []byte
	mapped   bool
	released atomic.Bool
}

// mapped reports whether the bytes are pages of the socket's receive queue mapped into the
// connection's window (RecvMapped), rather than a copy in a receive buffer
// (Stats.Recv.BytesMapped and ConnStats.BytesRecvMapped count them).
func (d Data) mapped() bool {
	m, ok := d.src.(*mappedData)
	return ok && m.mapped
}

// send copies mapped Data: the pages belong to the socket's receive queue.
func (d *mappedData) send(c *Conn, dd Data) error { return c.sendCopy(dd) }

func (d *mappedData) bytes() []byte {
	if d.released.Load() {
		return nil
	}
	return d.b
}

// credit is none: the window is the mapped path's bound (it reads on once everything is back).
func (d *mappedData) credit(Data) int64 { return 0 }

// retain is another reference to the same mapped bytes (the window reads on once every
// reference is released).
func (d *mappedData) retain(Data) (dataSource, error) {
	if d.released.Load() {
		return nil, fmt.Errorf("zc: retain: %w", memreg.ErrStale)
	}
	d.m.out.Add(1)
	if d.released.Load() {
		// released meanwhile (a misuse: Retain racing the Data's own Release)
		d.m.out.Add(-1)
		return nil, fmt.Errorf("zc: retain: %w", memreg.ErrStale)
	}
	return &mappedData{m: d.m, b: d.b, mapped: d.mapped}, nil
}

func (d *mappedData) release(Data) error {
	if !d.released.CompareAndSwap(false, true) {
		return memreg.ErrStale
	}
	m := d.m
	if m.out.Add(-1) != 0 {
		return nil
	}
	m.mu.Lock()
	closed := m.closed
	if closed && m.w != nil {
		m.w.Close()
		m.w = nil
	}
	m.mu.Unlock()
	if !closed && m.posted.CompareAndSwap(false, true) {
		if m.c.q.Post(m.resume) != nil {
			m.posted.Store(false)
		}
	}
	return nil
}

func init() { features.recvSetup[RecvMapped] = (*Conn).setupMapped }

// setupMapped prepares RecvMapped's window: the io_uring backend only, else the ring,
// counted (loop only).
func (c *Conn) setupMapped() {
	if c.q.be.name() != BackendIOUring {
		c.q.ctr.mappedFallbacks.Add(1)
		return
	}
	if err := c.sock.SetNonblocking(true); err != nil {
		c.q.ctr.mappedFallbacks.Add(1)
		return
	}
	w, err := tcpglue.NewRecvWindow(c.sock, mappedWindow)
	if err != nil {
		c.sock.SetNonblocking(false)
		c.q.ctr.mappedFallbacks.Add(1)
		return
	}
	c.rx = &mappedRecv{w: w, copyBuf: make([]byte, 64<<10), c: c}
}

// arm polls the socket for readability (the backend's armRecv): a multishot POLL_ADD; the
// loop reads the window itself when it fires (onPoll).
func (m *mappedRecv) arm(b ringBackend) { b.armPoll(m.c) }

// stop cancels the poll (the backend's stopRecv); its last completion follows.
func (m *mappedRecv) stop(b ringBackend) { b.cancelRecv(m.c) }

// onPoll is the poll's completion: read while the socket is readable and the handler holds
// nothing of the window.
func (m *mappedRecv) onPoll(ev loop.Event) {
	c := m.c
	if ev.Res < 0 {
		if ev.Res != -int32(unix.ECANCELED) {
			c.gotEOF(unix.Errno(-ev.Res))
			return
		}
		// Cancelled by a pause: if the connection was resumed while the cancel was in
		// flight (armRecv saw the poll still armed and did nothing), the poll is owed now.
		if !c.recvArmed {
			c.armRecv()
		}
		return
	}
	m.wantRead = true
	m.read()
	if !c.recvArmed {
		c.armRecv()
	}
}

// resume runs on the loop after the handler released the last mapped Data.
func (m *mappedRecv) resume() {
	c := m.c
	m.posted.Store(false)
	m.read()
	if c.inClose() {
		c.advanceClose()
	}
}

func (m *mappedRecv) read() {
	c := m.c
	for m.wantRead && m.out.Load() == 0 && !c.inClose() && c.paused == 0 && !c.eof && !c.ended() {
		res, err := m.w.Recv(m.copyBuf)
		if errors.Is(err, unix.EAGAIN) {
			m.wantRead = false
			return
		}
		if len(res.Mapped) > 0 {
			m.deliver(res.Mapped, true)
		}
		if res.Copied > 0 {
			m.deliver(m.copyBuf[:res.Copied], false)
		}
		if err == io.EOF {
			c.gotEOF(nil)
			return
		}
		if err != nil {
			c.gotEOF(err)
			return
		}
	}
}

func (m *mappedRecv) deliver(b []byte, mapped bool) {
	c := m.c
	n := uint64(len(b))
	c.ctr.recv.Add(n)
	if mapped {
		c.ctr.recvMapped.Add(n)
		c.q.ctr.recvMapped.Add(n)
	} else {
		c.q.ctr.recvMappedCopied.Add(n)
	}
	m.out.Add(1)
	c.callData(Data{n: len(b), src: &mappedData{m: m, b: b, mapped: mapped}})
}

// finish drops the window once the handler released everything it holds (loop only).
func (m *mappedRecv) finish() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.out.Load() == 0 && m.w != nil {
		m.w.Close()
		m.w = nil
	}
}
