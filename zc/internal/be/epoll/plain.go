package epoll

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/memreg"
	bc "github.com/zcnet/zcnet/zc/internal/becontract"
)

// The plain backend: non-blocking sockets driven by epoll, one event loop per queue (the
// same queues, handlers and flow control as io_uring; no per-connection goroutine). Reads go
// into buffers of the queue's receive pool; sends are writev(2) of every queued buffer. Its
// epoll base (listening, dialing, registrations) is shared with the zcshim backend
// (Common).

type plainBackend struct {
	Common
	ctr     *bc.Counters
	recv    *memreg.Pool
	iov     [bc.MaxIov]unix.Iovec
	starved []bc.Conn // waiting for a receive buffer
	wakeReq atomic.Bool
}

// NewPlain makes queue q's plain backend.
func NewPlain(q bc.Queue) (loop.Driver, bc.Backend, error) {
	cfg := q.Config()
	ep, err := loop.NewEpoll(q.Loop())
	if err != nil {
		return nil, nil, err
	}
	b := &plainBackend{Common: Common{Q: q, LQ: q.Loop(), EP: ep}, ctr: q.Counters()}
	b.OnConn = b.onEvent
	b.recv, err = memreg.NewPool(cfg.Pool(memreg.PoolOptions{BufSize: cfg.RecvBufSize, Initial: cfg.RecvBufs,
		MaxBytes: cfg.RecvPoolMax, OnFree: b.bufferFreed}, false))
	if err != nil {
		ep.Close()
		return nil, nil, err
	}
	send, err := memreg.NewPool(cfg.Pool(memreg.PoolOptions{BufSize: cfg.SendBufSize, Initial: cfg.SendBufs,
		MaxBytes: cfg.SendPoolMax, OnFree: q.SendBufFreed}, true))
	if err != nil {
		b.recv.CloseWhenReleased()
		ep.Close()
		return nil, nil, err
	}
	q.SetSendPool(send)
	return ep, b, nil
}

func (b *plainBackend) Kind() bc.Kind            { return bc.KindPlain }
func (b *plainBackend) DirectOK() bool           { return true }
func (b *plainBackend) ZeroCopy() bool           { return false }
func (b *plainBackend) AppDirect() bool          { return true } // writev from it
func (b *plainBackend) RecvPool() *memreg.Pool   { return b.recv }
func (b *plainBackend) Sending(c bc.Conn) bool   { return ES(c).wantOut }
func (b *plainBackend) InFlightSegs(bc.Conn) int { return 0 }
func (b *plainBackend) CancelSend(bc.Conn)       {} // its sends are write(2) calls: none waits in the kernel
func (b *plainBackend) Start(c bc.Conn) error    { return b.Register(c) }

func (b *plainBackend) Close() {
	b.recv.CloseWhenReleased()
	b.Q.SendPool().CloseWhenReleased()
}

func (b *plainBackend) ArmRecv(c bc.Conn) {
	c.RecvStarted()
	b.Update(c)
	if c.KernelTLS() {
		b.readSoon(c)
	}
}

// readSoon reads c on the loop shortly, without waiting for readiness: kernel TLS reports
// a socket unreadable while a KeyUpdate it decrypted waits to be read (tls_sk_poll masks
// EPOLLIN until the next keys are set), so a kernel-TLS connection is read until EAGAIN,
// never left with a record that only a read would find.
func (b *plainBackend) readSoon(c bc.Conn) {
	b.LQ.Post(func() {
		if c.RecvArmed() && !c.Ended() {
			b.read(c)
		}
	})
}

func (b *plainBackend) StopRecv(c bc.Conn) {
	c.RecvEnded()
	b.Update(c)
}

func (b *plainBackend) CloseSocket(c bc.Conn) {
	b.Unregister(c)
	ES(c).wantOut = false
	c.Socket().Close()
}

// Send writes the queued buffers with writev until they are out or the socket is full (then
// it waits for EPOLLOUT).
func (b *plainBackend) Send(c bc.Conn) {
	progress := false
	for c.PendLen() > 0 && !c.SockClosed() {
		if !c.TLSRekey() {
			break // a KeyUpdate waits for room (or failed): it goes first
		}
		n := 0
		for n < c.PendLen() && n < bc.MaxIov {
			s := c.Pend(n)
			b.iov[n].Base = s.Ptr
			b.iov[n].SetLen(s.Len)
			n++
		}
		w, err := writev(c.FD(), b.iov[:bc.CapIov(b.iov[:n], c.TLSSendCap())])
		clear(b.iov[:n])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			break
		}
		if err != nil {
			c.Fail("write", err)
			return
		}
		c.CountSend(false)
		c.Advance(w)
		progress = true
	}
	st := ES(c)
	want := c.PendLen() > 0 && !c.SockClosed()
	if want != st.wantOut {
		st.wantOut = want
		b.Update(c)
	}
	if progress && !st.wantOut {
		// Completed synchronously: OnWritable runs from the loop, not from inside Send.
		b.LQ.MarkDirty((*plainWritable)(st))
	}
}

func writev(fd int, iov []unix.Iovec) (int, error) {
	n, _, e := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// plainWritable is a connection's state as the loop.Flusher that reports a send completed
// synchronously.
type plainWritable Conn

func (w *plainWritable) Flush(*loop.Queue) {
	c := w.c
	if !c.Ended() {
		// A closing connection too: Write's staging buffer may still hold a tail that waited
		// behind the sends just completed, and only the pump moves it (SendProgress then
		// advances the close).
		c.SendProgress()
	}
}

func (b *plainBackend) onEvent(c bc.Conn, events uint32) {
	st := ES(c)
	if events&(unix.EPOLLHUP|unix.EPOLLERR) != 0 && !c.RecvArmed() && !st.wantOut && st.RecvUD != 0 {
		// epoll reports these whatever the mask: while the connection neither receives nor
		// waits to send, silence them until the next update (ArmRecv, a blocked send).
		b.EP.Mod(c.FD(), unix.EPOLLONESHOT, st.RecvUD)
		return
	}
	if events&unix.EPOLLOUT != 0 && st.wantOut {
		b.Send(c)
		if !st.wantOut {
			c.SendProgress()
		}
	}
	if c.Ended() {
		return
	}
	if events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 && c.RecvArmed() {
		b.read(c)
	}
	if c.InClose() {
		c.AdvanceClose()
	}
}

// read reads what the socket has (up to 16 buffers, then the loop serves others).
func (b *plainBackend) read(c bc.Conn) {
	for i := 0; i < 16 && c.RecvArmed() && !c.SockClosed(); i++ {
		buf, err := b.getBuf()
		if err != nil {
			// At the pool's cap: wait for a release.
			b.StopRecv(c)
			ES(c).needArm = true
			b.starved = append(b.starved, c)
			b.ctr.BufEmpty.Add(1)
			return
		}
		mem := buf.Bytes()
		n, err := unix.Read(c.FD(), mem)
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
				b.StopRecv(c)
				c.GotEOF(nil)
			} else {
				b.StopRecv(c)
				c.GotEOF(err)
			}
			return
		}
		b.ctr.RecvPlain.Add(uint64(n))
		c.Deliver(buf, n)
		if c.Ended() {
			return
		}
		c.CheckCredit()
		if n < len(mem) && !c.KernelTLS() {
			return // drained (a kernel-TLS read also stops short where a control record follows)
		}
	}
	if c.KernelTLS() && c.RecvArmed() && !c.SockClosed() && !c.Ended() {
		b.readSoon(c) // read on until EAGAIN, after the others had their turn
	}
}

// getBuf takes a receive buffer, growing the pool when it may.
func (b *plainBackend) getBuf() (memreg.Buf, error) {
	buf, err := b.recv.Get()
	if err != nil && b.recv.CanGrow() {
		if _, gerr := b.recv.Grow(); gerr == nil {
			b.ctr.PoolGrows.Add(1)
			buf, err = b.recv.Get()
		}
	}
	return buf, err
}

// bufferFreed runs on any goroutine when a receive buffer returns: starved connections
// try again on the loop.
func (b *plainBackend) bufferFreed() {
	if b.wakeReq.CompareAndSwap(false, true) {
		if b.LQ.Post(b.retryStarved) != nil {
			b.wakeReq.Store(false)
		}
	}
}

func (b *plainBackend) retryStarved() {
	b.wakeReq.Store(false)
	st := b.starved
	b.starved = nil
	for _, c := range st {
		if s := ES(c); s.needArm {
			s.needArm = false
			c.Rearm()
		}
	}
}
