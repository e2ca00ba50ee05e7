package zc

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/memreg"
)

// The plain backend: non-blocking sockets driven by epoll, one event loop per queue (the
// same queues, handlers and flow control as io_uring; no per-connection goroutine). Reads go
// into buffers of the queue's receive pool; sends are writev(2) of every queued buffer. Its
// epoll base (listening, dialing, registrations) is shared with the zcshim backend
// (be_epoll.go).

// ---- the plain backend -----------------------------------------------------------------

type plainBackend struct {
	epollCommon
	recv    *memreg.Pool
	iov     [maxIov]unix.Iovec
	starved []*Conn // waiting for a receive buffer
	wakeReq atomic.Bool
}

func newPlainBackend(q *queue) (loop.Driver, error) {
	cfg := &q.e.cfg
	ep, err := loop.NewEpoll(q.Queue)
	if err != nil {
		return nil, err
	}
	b := &plainBackend{epollCommon: epollCommon{q: q, ep: ep}}
	b.onConn = b.onEvent
	b.recv, err = memreg.NewPool(q.e.poolOptions(memreg.PoolOptions{BufSize: cfg.RecvBufSize, Initial: cfg.RecvBufs,
		MaxBytes: cfg.RecvPoolMax, Tag: q.e, OnFree: b.bufferFreed}, false))
	if err != nil {
		ep.Close()
		return nil, err
	}
	q.send, err = memreg.NewPool(q.e.poolOptions(memreg.PoolOptions{BufSize: cfg.SendBufSize, Initial: cfg.SendBufs,
		MaxBytes: cfg.SendPoolMax, Tag: q.e, OnFree: q.sendBufFreed}, true))
	if err != nil {
		b.recv.CloseWhenReleased()
		ep.Close()
		return nil, err
	}
	q.setBackend(b)
	return ep, nil
}

func (b *plainBackend) common() *epollCommon      { return &b.epollCommon }
func (b *plainBackend) name() Backend             { return BackendPlain }
func (b *plainBackend) directOK() bool            { return true }
func (b *plainBackend) zeroCopy() bool            { return false }
func (b *plainBackend) appDirect() bool           { return true } // writev from it
func (b *plainBackend) recvPool() *memreg.Pool    { return b.recv }
func (b *plainBackend) sending(c *Conn) bool      { return es(c).wantOut }
func (b *plainBackend) inFlightSegs(c *Conn) int  { return 0 }
func (b *plainBackend) cancelSend(c *Conn)        {} // its sends are write(2) calls: none waits in the kernel
func (b *plainBackend) start(c *Conn) error       { return b.register(c, (*econn)(c)) }
func (b *plainBackend) freeOp(c *Conn, ud uint64) { b.epollCommon.freeOp(c, ud) }
func (b *plainBackend) dial(c *Conn)              { b.epollCommon.dial(c) }
func (b *plainBackend) cancelDial(c *Conn)        { b.epollCommon.cancelDial(c) }
func (b *plainBackend) dropDial(c *Conn)          { b.epollCommon.dropDial(c) }
func (b *plainBackend) listen(p *lpart)           { b.epollCommon.listen(p) }
func (b *plainBackend) stopListen(p *lpart)       { b.epollCommon.stopListen(p) }

func (b *plainBackend) close() {
	b.recv.CloseWhenReleased()
	b.q.send.CloseWhenReleased()
}

func (b *plainBackend) armRecv(c *Conn) {
	c.recvStarted()
	b.update(c)
	if c.kernelTLS() {
		b.readSoon(c)
	}
}

// readSoon reads c on the loop shortly, without waiting for readiness: kernel TLS reports
// a socket unreadable while a KeyUpdate it decrypted waits to be read (tls_sk_poll masks
// EPOLLIN until the next keys are set), so a kernel-TLS connection is read until EAGAIN,
// never left with a record that only a read would find.
func (b *plainBackend) readSoon(c *Conn) {
	b.q.Post(func() {
		if c.recvArmed && !c.ended() {
			b.read(c)
		}
	})
}

func (b *plainBackend) stopRecv(c *Conn) {
	c.recvEnded()
	b.update(c)
}

func (b *plainBackend) closeSocket(c *Conn) {
	b.unregister(c)
	es(c).wantOut = false
	c.sock.Close()
}

// send writes the queued buffers with writev until they are out or the socket is full (then
// it waits for EPOLLOUT).
func (b *plainBackend) send(c *Conn) {
	progress := false
	for c.pendLen() > 0 && !c.st.SockClosed() {
		if c.tls != nil && !c.tlsRekey() {
			break // a KeyUpdate waits for room (or failed): it goes first
		}
		n := 0
		for n < c.pendLen() && n < maxIov {
			s := &c.tx.pend[n]
			b.iov[n].Base = s.ptr(int(s.off))
			b.iov[n].SetLen(int(s.n - s.off))
			n++
		}
		w, err := writev(c.fd, b.iov[:tlsCapIov(b.iov[:n], c.tlsSendCap())])
		clear(b.iov[:n])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			break
		}
		if err != nil {
			c.fail(c.opErr("write", err))
			return
		}
		c.tx.sendOps.Add(1)
		b.q.ctr.sendOps.Add(1)
		c.advance(w)
		progress = true
	}
	want := c.pendLen() > 0 && !c.st.SockClosed()
	if want != es(c).wantOut {
		es(c).wantOut = want
		b.update(c)
	}
	if progress && !es(c).wantOut {
		// Completed synchronously: OnWritable runs from the loop, not from inside Send.
		b.q.MarkDirty((*plainWritable)(c))
	}
}

func writev(fd int, iov []unix.Iovec) (int, error) {
	n, _, e := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

type plainWritable Conn

func (w *plainWritable) Flush(*loop.Queue) {
	c := (*Conn)(w)
	if !c.ended() {
		// A closing connection too: Write's staging buffer may still hold a tail that waited
		// behind the sends just completed, and only the pump moves it (sendProgress then
		// advances the close).
		c.sendProgress()
	}
}

func (b *plainBackend) onEvent(c *Conn, events uint32) {
	if events&(unix.EPOLLHUP|unix.EPOLLERR) != 0 && !c.recvArmed && !es(c).wantOut && es(c).recvUD != 0 {
		// epoll reports these whatever the mask: while the connection neither receives nor
		// waits to send, silence them until the next update (armRecv, a blocked send).
		b.ep.Mod(c.fd, unix.EPOLLONESHOT, es(c).recvUD)
		return
	}
	if events&unix.EPOLLOUT != 0 && es(c).wantOut {
		b.send(c)
		if !es(c).wantOut {
			c.sendProgress()
		}
	}
	if c.ended() {
		return
	}
	if events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 && c.recvArmed {
		b.read(c)
	}
	if c.inClose() {
		c.advanceClose()
	}
}

// read reads what the socket has (up to 16 buffers, then the loop serves others).
func (b *plainBackend) read(c *Conn) {
	for i := 0; i < 16 && c.recvArmed && !c.st.SockClosed(); i++ {
		buf, err := b.getBuf()
		if err != nil {
			// At the pool's cap: wait for a release.
			b.stopRecv(c)
			es(c).needArm = true
			b.starved = append(b.starved, c)
			b.q.ctr.bufEmpty.Add(1)
			return
		}
		mem := buf.Bytes()
		n, err := unix.Read(c.fd, mem)
		if err == unix.EINTR {
			buf.Release()
			continue
		}
		if n <= 0 {
			buf.Release()
			if err == unix.EAGAIN {
				return
			}
			if n == 0 && err == nil {
				b.stopRecv(c)
				c.gotEOF(nil)
			} else {
				b.stopRecv(c)
				c.gotEOF(err)
			}
			return
		}
		b.q.ctr.recvPlain.Add(uint64(n))
		c.deliver(Data{buf: buf, n: n})
		if c.ended() {
			return
		}
		c.checkCredit()
		if n < len(mem) && !c.kernelTLS() {
			return // drained (a kernel-TLS read also stops short where a control record follows)
		}
	}
	if c.kernelTLS() && c.recvArmed && !c.st.SockClosed() && !c.ended() {
		b.readSoon(c) // read on until EAGAIN, after the others had their turn
	}
}

// getBuf takes a receive buffer, growing the pool when it may.
func (b *plainBackend) getBuf() (memreg.Buf, error) {
	buf, err := b.recv.Get()
	if err != nil && b.recv.CanGrow() {
		if _, gerr := b.recv.Grow(); gerr == nil {
			b.q.ctr.sendPoolGrows.Add(1)
			buf, err = b.recv.Get()
		}
	}
	return buf, err
}

// bufferFreed runs on any goroutine when a receive buffer returns: starved connections
// try again on the loop.
func (b *plainBackend) bufferFreed() {
	if b.wakeReq.CompareAndSwap(false, true) {
		if b.q.Post(b.retryStarved) != nil {
			b.wakeReq.Store(false)
		}
	}
}

func (b *plainBackend) retryStarved() {
	b.wakeReq.Store(false)
	st := b.starved
	b.starved = nil
	for _, c := range st {
		if es(c).needArm {
			es(c).needArm = false
			c.armRecv()
		}
	}
}
