package zc

import (
	"errors"
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

func (d *mappedData) bytes() []byte {
	if d.released.Load() {
		return nil
	}
	return d.b
}

func (d *mappedData) release() error {
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
		if m.c.q.Post(m.c.mappedResume) != nil {
			m.posted.Store(false)
		}
	}
	return nil
}

// setupRecvPath prepares the receive path asked for: the mapped window (RecvMapped), zcrx
// (RecvZcrx, zcrx.go) (loop only).
func (c *Conn) setupRecvPath() {
	if c.e.cfg.RecvPath == RecvZcrx {
		c.setupZcrx()
		return
	}
	if c.e.cfg.RecvPath != RecvMapped {
		return
	}
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
	c.m = &mappedRecv{w: w, copyBuf: make([]byte, 64<<10), c: c}
}

func (c *Conn) onPoll(ev loop.Event) {
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
	c.m.wantRead = true
	c.mappedRead()
	if !c.recvArmed {
		c.armRecv()
	}
}

// mappedResume runs on the loop after the handler released the last mapped Data.
func (c *Conn) mappedResume() {
	if c.m == nil {
		return
	}
	c.m.posted.Store(false)
	c.mappedRead()
	if c.inClose() {
		c.advanceClose()
	}
}

func (c *Conn) mappedRead() {
	m := c.m
	for m.wantRead && m.out.Load() == 0 && !c.inClose() && c.paused == 0 && !c.eof && !c.ended() {
		res, err := m.w.Recv(m.copyBuf)
		if errors.Is(err, unix.EAGAIN) {
			m.wantRead = false
			return
		}
		if len(res.Mapped) > 0 {
			c.deliverMapped(res.Mapped, true)
		}
		if res.Copied > 0 {
			c.deliverMapped(m.copyBuf[:res.Copied], false)
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

func (c *Conn) deliverMapped(b []byte, mapped bool) {
	n := uint64(len(b))
	c.ctr.recv.Add(n)
	if mapped {
		c.ctr.recvMapped.Add(n)
		c.q.ctr.recvMapped.Add(n)
	} else {
		c.q.ctr.recvMappedCopied.Add(n)
	}
	c.m.out.Add(1)
	c.callData(Data{n: len(b), mr: &mappedData{m: c.m, b: b, mapped: mapped}})
}

// close drops the window once the handler released everything it holds (loop only).
func (m *mappedRecv) close(c *Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.out.Load() == 0 && m.w != nil {
		m.w.Close()
		m.w = nil
	}
}
