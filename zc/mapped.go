package zc

import (
	"errors"
	"io"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// The mapped receive path (RecvMapped): a multishot poll tells the loop the socket is
// readable; the loop then calls TCP_ZEROCOPY_RECEIVE (tcpglue.RecvWindow) itself, handing
// the mapped pages and the copied remainder to OnData. The window's pages stay valid until the
// next receive call, so the loop reads again only once the handler released everything it
// got; closing waits for that too, so a handler never reads unmapped memory.

const mappedWindow = 1 << 20

type mappedRecv struct {
	sock     *tcpglue.Socket
	w        *tcpglue.RecvWindow
	copyBuf  []byte
	out      atomic.Int32 // Data handed out and not released
	wantRead bool
	posted   atomic.Bool
	c        *Conn
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
	if d.m.out.Add(-1) == 0 && d.m.posted.CompareAndSwap(false, true) {
		if d.m.c.q.Post(d.m.c.mappedResume) != nil {
			d.m.posted.Store(false)
		}
	}
	return nil
}

// setupRecvPath prepares the mapped window when RecvMapped is asked for (loop only).
func (c *Conn) setupRecvPath() {
	if c.e.cfg.RecvPath != RecvMapped || c.q == nil {
		return
	}
	fallback := func() {
		c.q.ctr.mappedFallbacks.Add(1)
	}
	if err := unix.SetNonblock(c.fd, true); err != nil {
		fallback()
		return
	}
	s, err := tcpglue.FromFD(c.fd)
	if err != nil {
		fallback()
		return
	}
	w, err := tcpglue.NewRecvWindow(s, mappedWindow)
	if err != nil {
		s.Disown()
		fallback()
		return
	}
	c.m = &mappedRecv{sock: s, w: w, copyBuf: make([]byte, 64<<10), c: c}
}

func (c *Conn) recvTag() uint32 {
	if c.m != nil {
		return tagPoll
	}
	return tagRecv
}

func (c *Conn) onPoll(cqe uring.CQE) {
	if !cqe.More() {
		c.recvArmed = false
	}
	if cqe.Res < 0 {
		if cqe.Res != -int32(unix.ECANCELED) && !c.eof {
			err := c.opErr("read", unix.Errno(-cqe.Res))
			c.eof = true
			c.h.OnEOF(c, err)
			c.beginClose(err)
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
	c.maybeFinishClose()
}

func (c *Conn) mappedRead() {
	m := c.m
	for m.wantRead && m.out.Load() == 0 && !c.closing && !c.paused && !c.eof && !c.finished {
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
			c.eof = true
			c.h.OnEOF(c, io.EOF)
			return
		}
		if err != nil {
			rerr := c.opErr("read", err)
			c.eof = true
			c.h.OnEOF(c, rerr)
			c.beginClose(rerr)
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
	c.h.OnData(c, Data{n: len(b), mr: &mappedData{m: c.m, b: b, mapped: mapped}})
}

// closeWindow unmaps the window once the handler released everything (or when wait is
// false: the close deadline passed). It reports whether the window is gone.
func (m *mappedRecv) closeWindow(c *Conn, wait bool) bool {
	if m.w == nil {
		return true
	}
	if m.out.Load() > 0 && wait {
		return false
	}
	m.w.Close()
	m.w = nil
	m.sock.Disown()
	return true
}
