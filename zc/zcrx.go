package zc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/zcrx"
	"github.com/zcnet/zcnet/memreg"
)

// The zcrx receive path (RecvZcrx): each io_uring queue registers one zcrx interface queue
// with an area of Config.ZcrxAreaSize bytes at start (internal/zcrx: device-less on Linux
// 7.1+, so any TCP socket, loopback included, receives through it with the kernel copying the
// payload into the area; the ring needs CQE32, SINGLE_ISSUER|DEFER_TASKRUN and
// CAP_NET_ADMIN). Its connections arm one multishot RECV_ZC each instead of the buffer-ring
// recv; every completion becomes a Data viewing the area, charged to the connection's
// receive credit, whose Release hands the buffer back through the refill ring from any
// goroutine. Where zcrx cannot be set up the queue receives through the ring and says why
// (Stats.RecvZcrxFallback; Config.NoFallback makes New fail instead).

// zcrxQueue is a queue's zcrx state. r is set in the queue's init (before anyone else sees
// the queue) and never changes; the rest is read by Stats from any goroutine.
type zcrxQueue struct {
	r         *zcrx.Receiver
	reason    atomic.Pointer[error] // why the queue receives through the ring
	bytes     atomic.Uint64         // received through zcrx
	fallbacks atomic.Uint64         // connections that wanted zcrx and use the ring
}

// ZcrxUnavailableError is New's error when Config.RecvPath is RecvZcrx, Config.NoFallback
// forbids the fallback to RecvRing, and zcrx cannot be set up: Err says why (it matches
// ErrNotSupported when the kernel, the privileges or the backend lack what zcrx needs).
type ZcrxUnavailableError struct {
	Queue int // the queue that could not set it up, -1 for the whole engine
	Err   error
}

func (e *ZcrxUnavailableError) Error() string {
	where := "engine"
	if e.Queue >= 0 {
		where = fmt.Sprintf("queue %d", e.Queue)
	}
	return fmt.Sprintf("receive path zcrx unavailable on %s (fallback forbidden): %v", where, e.Err)
}

func (e *ZcrxUnavailableError) Unwrap() error { return e.Err }

// checkZcrxBackend refuses RecvZcrx with NoFallback on a backend without io_uring.
func (e *Engine) checkZcrxBackend() error {
	if e.cfg.RecvPath != RecvZcrx || !e.cfg.NoFallback || e.backend == BackendIOUring {
		return nil
	}
	return &ZcrxUnavailableError{Queue: -1, Err: errs.NotSupported("zcrx receive path", "the io_uring backend", fmt.Errorf("backend %v", e.backend))}
}

// zcrxWanted says whether a new io_uring queue should try zcrx, and sets the fallback reason
// when the kernel cannot do it at all (so the ring does not get CQE32 for nothing).
func (q *queue) zcrxWanted() bool {
	if q.e.cfg.RecvPath != RecvZcrx {
		return false
	}
	if err := zcrxProbe(); err != nil {
		q.zx.reason.Store(&err)
		return false
	}
	return true
}

// zcrxProbe reports whether device-less zcrx is there (nil) or why not.
func zcrxProbe() error { return zcrx.Probe().NoDev }

// setupZcrx registers the queue's zcrx instance on the loop during init; on failure the
// queue uses the ring, or, with NoFallback, the error fails the queue (and New).
func (q *queue) setupZcrx(u *loop.URing, tried bool) error {
	if q.e.cfg.RecvPath != RecvZcrx {
		return nil
	}
	var err error
	if tried {
		q.zx.r, err = zcrx.New(u, zcrx.Config{NoDev: true, AreaSize: q.e.cfg.ZcrxAreaSize})
		if err != nil {
			q.zx.reason.Store(&err)
		}
	} else if p := q.zx.reason.Load(); p != nil {
		err = *p
	}
	if err != nil && q.e.cfg.NoFallback {
		return &ZcrxUnavailableError{Queue: q.idx, Err: err}
	}
	return nil
}

// addZcrxStats adds the queue's zcrx counters to s.
func (q *queue) addZcrxStats(s *Stats) {
	s.BytesRecvZcrx += q.zx.bytes.Load()
	s.RecvZcrxFallbacks += q.zx.fallbacks.Load()
	if p := q.zx.reason.Load(); p != nil && s.RecvZcrxFallback == "" {
		s.RecvZcrxFallback = (*p).Error()
	}
	if r := q.zx.r; r != nil {
		st := r.Stats()
		s.ZcrxQueues++
		s.ZcrxAreaStalls += st.AreaStalls
		switch {
		case st.NoDev:
			s.BytesRecvZcrxCopied += st.Bytes
		case st.KernelStats:
			s.BytesRecvZcrxCopied += st.KernelCopyBytes
		}
	}
}

// zcrxConn is a connection receiving through its queue's zcrx instance: the zcrx.Handler of
// its streams (a stream lasts from an arm to the stop or end that follows).
type zcrxConn struct {
	c      *Conn
	r      *zcrx.Receiver
	s      *zcrx.Stream // the armed stream, nil when none
	inStop bool         // a Cancel we called is running (it may end the stream at once)
}

// setupZcrx chooses the connection's receive path when RecvZcrx is asked for (loop only).
func (c *Conn) setupZcrx() {
	if c.q.zx.r == nil || c.q.be.name() != BackendIOUring {
		if c.q.zx.reason.Load() == nil {
			err := fmt.Errorf("backend %v: %w", c.q.be.name(), errs.NotSupported("zcrx receive path", "the io_uring backend", nil))
			c.q.zx.reason.CompareAndSwap(nil, &err)
		}
		c.q.zx.fallbacks.Add(1)
		return
	}
	c.zx = &zcrxConn{c: c, r: c.q.zx.r}
}

// arm starts a stream (the backend's armRecv).
func (zx *zcrxConn) arm() {
	c := zx.c
	s, err := zx.r.Recv(c.fd, zx)
	if err != nil {
		// Only a receiver gone with its ring refuses: the queue is closing.
		c.gotEOF(err)
		return
	}
	zx.s = s
	c.recvArmed = true
	c.needArm = false
	c.ops++
}

// stop cancels the armed stream (the backend's stopRecv): its End follows, at once when the
// stream was waiting for area buffers, else with the kernel's last completion.
func (zx *zcrxConn) stop() {
	if zx.s == nil || zx.inStop {
		return
	}
	zx.inStop = true
	zx.s.Cancel()
	zx.inStop = false
}

// Data implements zcrx.Handler: one completion, a view of the area.
func (zx *zcrxConn) Data(s *zcrx.Stream, b []byte, buf zcrx.Buf) {
	c := zx.c
	c.q.zx.bytes.Add(uint64(len(b)))
	c.deliver(Data{n: len(b), zb: buf})
	if !c.finished && !zx.inStop {
		c.checkCredit()
	}
}

// End implements zcrx.Handler: the stream ended (EOF, stopped, error).
func (zx *zcrxConn) End(s *zcrx.Stream, err error) {
	c := zx.c
	if zx.s != s {
		return
	}
	zx.s = nil
	c.recvArmed = false
	c.ops--
	if c.finished {
		return
	}
	switch {
	case err == io.EOF:
		c.gotEOF(nil)
	case errors.Is(err, zcrx.ErrCanceled):
		// stopRecv: a pause, or the close
	default:
		c.gotEOF(err)
	}
	if zx.inStop || c.finished {
		return // the caller of stop goes on
	}
	c.checkCredit()
	if c.closing {
		c.advanceClose()
		return
	}
	if !c.recvArmed {
		c.armRecv()
	}
}

// zcrxCredit is the receive credit a zcrx Data takes: the area pages it occupies (the
// kernel puts each completion in buffers of a page).
func zcrxCredit(n int) int64 {
	page := os.Getpagesize()
	return int64((n + page - 1) &^ (page - 1))
}

// sendZcrxData is SendData for zcrx Data: the area belongs to the zcrx instance, so the
// bytes are copied into send buffers and the Data is released at once. The copies stay
// charged to the receiving connection's credit until sent, as forwarded ring buffers are, so
// flow control works the same.
func (c *Conn) sendZcrxData(d Data) error {
	p := d.Bytes()
	if p == nil {
		return c.opErr("send", memreg.ErrStale)
	}
	defer d.Release()
	src := d.c
	for len(p) > 0 {
		b, err := c.q.getSendBuf()
		if err != nil {
			return c.opErr("send", err)
		}
		k := copy(b.Bytes(), p)
		p = p[k:]
		loan, err := b.Lend()
		if err != nil {
			b.Release()
			return c.opErr("send", err)
		}
		if src != nil {
			src.held.Add(int64(loan.Region().BufSize())) // released by finishSeg
		}
		if err := c.enqueue(seg{loan: loan, n: int32(k), src: src}); err != nil {
			return err
		}
	}
	return nil
}
