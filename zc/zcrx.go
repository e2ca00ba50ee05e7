package zc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/zcnet/zcnet/hwq"
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
// (Stats.Recv.ZcrxFallback; Config.NoFallback makes New fail instead).

// zcrxQueue is a queue's zcrx state. r is set in the queue's init (before anyone else sees
// the queue) and never changes; the rest is read by Stats from any goroutine.
type zcrxQueue struct {
	r         *zcrx.Receiver        // the device-less instance
	reason    atomic.Pointer[error] // why the queue receives through the ring
	bytes     atomic.Uint64         // received through zcrx
	fallbacks atomic.Uint64         // connections that wanted zcrx and use the ring

	mu  sync.Mutex
	nic []*zcrx.Receiver // instances bound to NIC queues (listeners' ZcrxNIC), for Stats
}

// zcrxUnavailable is the refusal of zcrx on queue (-1: the engine, or the NIC's queue) for
// cause: New's (or Listen's, for ListenOptions.ZcrxNIC) error when Config.RecvPath is
// RecvZcrx, Config.NoFallback forbids the fallback to RecvRing, and zcrx cannot be set up, a
// *NotSupportedError that says where (the engine, a queue, a NIC) and why. It is a
// *featureRefused: the engine does not fall back to another backend for it (io_uring works;
// zcrx does not).
func zcrxUnavailable(queue int, cause error) error {
	where := "the engine"
	if queue >= 0 {
		where = fmt.Sprintf("queue %d", queue)
	}
	return &featureRefused{&NotSupportedError{What: "zcrx receive path on " + where + " (fallback forbidden)",
		Need: "device-less zcrx (Linux 7.1+) or a NIC queue bound to the ring, CAP_NET_ADMIN, the io_uring backend", Err: cause}}
}

func init() { features.backendCheck = (*Engine).checkZcrxBackend }

// checkZcrxBackend refuses RecvZcrx with NoFallback on a backend without io_uring.
func (e *Engine) checkZcrxBackend() error {
	if e.cfg.RecvPath != RecvZcrx || !e.cfg.NoFallback || e.backend == BackendIOUring {
		return nil
	}
	return zcrxUnavailable(-1, errs.NotSupported("zcrx receive path", "the io_uring backend", fmt.Errorf("backend %v", e.backend)))
}

// zcrxWanted says whether a new io_uring queue's ring needs 32-byte completions: RecvZcrx
// is asked for and the kernel has zcrx at all (a NIC-bound instance may come with a
// listener even where device-less ones cannot). Otherwise it records why not.
func (q *queue) zcrxWanted() bool {
	if q.e.cfg.RecvPath != RecvZcrx {
		return false
	}
	if err := zcrx.Probe().RecvZC; err != nil {
		q.zx().reason.Store(&err)
		return false
	}
	return true
}

// zcrxProbe reports whether device-less zcrx is there (nil) or why not.
func zcrxProbe() error { return zcrx.Probe().NoDev }

// setupZcrx registers the queue's device-less zcrx instance during init; where it cannot,
// the queue's connections use the ring, or, with NoFallback, the error fails the queue (and
// New).
func (q *queue) setupZcrx(u *loop.URing, cqe32 bool) error {
	if q.e.cfg.RecvPath != RecvZcrx {
		return nil
	}
	var err error
	if cqe32 {
		if err = zcrxProbe(); err == nil {
			q.zx().r, err = zcrx.New(u, zcrx.Config{NoDev: true, AreaSize: q.e.cfg.ZcrxAreaSize})
		}
		if err != nil {
			q.zx().reason.Store(&err)
		}
	} else if p := q.zx().reason.Load(); p != nil {
		err = *p
	}
	if err != nil && q.e.cfg.NoFallback {
		return zcrxUnavailable(q.idx, err)
	}
	return nil
}

// zcrxPart is the index of the queue's zcrxQueue in queue.parts.
var zcrxPart = registerQueuePart(func() queuePart { return new(zcrxQueue) })

// wantsCQE32 and ringMade make the zcrx state a ringSetupPart: the io_uring backend asks
// them as it makes the queue's ring (zcrxWanted, setupZcrx).
func (zx *zcrxQueue) wantsCQE32(q *queue) bool { return q.zcrxWanted() }
func (zx *zcrxQueue) ringMade(q *queue, u *loop.URing, cqe32 bool) error {
	return q.setupZcrx(u, cqe32)
}

// zx is the queue's zcrx state.
func (q *queue) zx() *zcrxQueue { return q.parts[zcrxPart].(*zcrxQueue) }

// stats adds the queue's zcrx counters to s.
func (zx *zcrxQueue) stats(s *Stats) {
	s.Recv.BytesZcrx += zx.bytes.Load()
	s.Recv.ZcrxFallbacks += zx.fallbacks.Load()
	if p := zx.reason.Load(); p != nil && s.Recv.ZcrxFallback == "" {
		s.Recv.ZcrxFallback = (*p).Error()
	}
	if zx.r != nil {
		s.Recv.ZcrxQueues++
	}
	zx.mu.Lock()
	rs := append([]*zcrx.Receiver{zx.r}, zx.nic...)
	zx.mu.Unlock()
	for _, r := range rs {
		if r == nil {
			continue
		}
		st := r.Stats()
		s.Recv.ZcrxAreaStalls += st.AreaStalls
		switch {
		case st.NoDev:
			s.Recv.BytesZcrxCopied += st.Bytes
		case st.KernelStats:
			s.Recv.BytesZcrxCopied += st.KernelCopyBytes
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

func init() { features.recvSetup[RecvZcrx] = (*Conn).setupZcrx }

// setupZcrx chooses the connection's receive path when RecvZcrx is asked for (loop only):
// its listener's NIC-bound instance (already set), the queue's device-less one, or the ring.
func (c *Conn) setupZcrx() {
	if c.rx != nil {
		return
	}
	if c.q.zx().r == nil || c.q.be.name() != BackendIOUring {
		if c.q.zx().reason.Load() == nil {
			err := fmt.Errorf("backend %v: %w", c.q.be.name(), errs.NotSupported("zcrx receive path", "the io_uring backend", nil))
			c.q.zx().reason.CompareAndSwap(nil, &err)
		}
		c.q.zx().fallbacks.Add(1)
		return
	}
	c.rx = &zcrxConn{c: c, r: c.q.zx().r}
}

// arm starts a stream (the backend's armRecv).
func (zx *zcrxConn) arm(ringBackend) {
	c := zx.c
	s, err := zx.r.Recv(c.fd, zx)
	if err != nil {
		// Only a receiver gone with its ring refuses: the queue is closing.
		c.gotEOF(err)
		return
	}
	zx.s = s
	c.recvStarted()
	c.opStarted()
}

// stop cancels the armed stream (the backend's stopRecv): its End follows, at once when the
// stream was waiting for area buffers, else with the kernel's last completion.
func (zx *zcrxConn) stop(ringBackend) {
	if zx.s == nil || zx.inStop {
		return
	}
	zx.inStop = true
	zx.s.Cancel()
	zx.inStop = false
}

// finish: nothing to let go (the area is the queue's; its buffers go back by Release).
func (zx *zcrxConn) finish() {}

// Data implements zcrx.Handler: one completion, a view of the area.
func (zx *zcrxConn) Data(s *zcrx.Stream, b []byte, buf zcrx.Buf) {
	c := zx.c
	c.q.zx().bytes.Add(uint64(len(b)))
	c.deliver(Data{n: len(b), src: newZcrxData(buf, len(b))})
	if !c.ended() && !zx.inStop {
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
	c.recvEnded()
	c.opEnded()
	if c.ended() {
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
	if zx.inStop || c.ended() {
		return // the caller of stop goes on
	}
	c.checkCredit()
	if c.inClose() {
		c.advanceClose()
		return
	}
	if !c.recvArmed {
		c.armRecv()
	}
}

// zcrxData is a dataSource: a buffer of a zcrx area, which belongs to the kernel's zcrx
// instance and goes back to it (through the refill ring) once, when the last reference
// lets go: the delivered Data (this value's own reference), the Data Retain and Slice make
// (*zcrxRef), and the sends of SendData (a seg's ext), which send from the area itself
// without copying. The receiving connection's credit (MaxRecvHeld) stays charged until
// then, so a relay over zcrx is flow-controlled as one over ring buffers.
type zcrxData struct {
	b    zcrx.Buf
	n    int          // the completion's bytes (the credit is charged for them)
	refs atomic.Int32 // references not yet released (this one included)
	done atomic.Bool  // this reference (the delivered Data's) was released
}

func newZcrxData(b zcrx.Buf, n int) *zcrxData {
	z := &zcrxData{b: b, n: n}
	z.refs.Store(1)
	return z
}

func (z *zcrxData) bytes() []byte {
	if z.done.Load() {
		return nil
	}
	return z.b.Bytes()
}

func (z *zcrxData) credit(Data) int64 { return zcrxCredit(z.n) }

func (z *zcrxData) send(c *Conn, d Data) error { return c.sendZcrx(d) }

func (z *zcrxData) retain(Data) (dataSource, error) { return z.newRef(&z.done) }

func (z *zcrxData) release(d Data) error {
	if !z.done.CompareAndSwap(false, true) {
		return memreg.ErrStale
	}
	z.put(d.c)
	return nil
}

// newRef is one more reference, made from a live one (from: its done flag; a misuse racing
// that reference's Release is refused).
func (z *zcrxData) newRef(from *atomic.Bool) (*zcrxRef, error) {
	if from.Load() {
		return nil, fmt.Errorf("zc: retain: %w", memreg.ErrStale)
	}
	z.refs.Add(1)
	if from.Load() {
		z.refs.Add(-1) // released meanwhile: never the last (that Release's put is to come)
		return nil, fmt.Errorf("zc: retain: %w", memreg.ErrStale)
	}
	return &zcrxRef{z: z}, nil
}

// put drops one reference; the last gives the buffer back and, when c is the connection it
// was charged to, its credit.
func (z *zcrxData) put(c *Conn) {
	if z.refs.Add(-1) != 0 {
		return
	}
	z.b.Release()
	if c != nil {
		c.releaseHeld(zcrxCredit(z.n))
	}
}

// zcrxRef is a further reference to a zcrx buffer: Data from Retain or Slice, or a send's
// hold on it (seg.ext).
type zcrxRef struct {
	z    *zcrxData
	c    *Conn // the connection charged for the buffer (a send's hold: Data's own is d.c)
	done atomic.Bool
}

func (r *zcrxRef) bytes() []byte {
	if r.done.Load() {
		return nil
	}
	return r.z.b.Bytes()
}

func (r *zcrxRef) credit(Data) int64 { return zcrxCredit(r.z.n) }

func (r *zcrxRef) send(c *Conn, d Data) error { return c.sendZcrx(d) }

// segBytes and segDone make a send's hold a segOwner (segExt): the hold's release gives the
// buffer back, and the credit with the last reference.
func (r *zcrxRef) segBytes() []byte { return r.bytes() }

func (r *zcrxRef) segDone(*Conn, seg, bool) { r.release(Data{c: r.c}) }

func (r *zcrxRef) retain(Data) (dataSource, error) { return r.z.newRef(&r.done) }

func (r *zcrxRef) release(d Data) error {
	if !r.done.CompareAndSwap(false, true) {
		return memreg.ErrStale
	}
	r.z.put(d.c)
	return nil
}

// sendZcrx is SendData of zcrx Data: the send references the area itself (a hold on the
// buffer, seg.ext, which keeps it from the refill ring) and the buffer goes back, with the
// receiving connection's credit, when the send (and its zero-copy notification) is done.
func (c *Conn) sendZcrx(d Data) error {
	if c.q.be.name() == BackendShim {
		// The shim sends only from memory registered with it: copy.
		return c.sendCopy(d)
	}
	src, err := d.src.retain(d)
	if err != nil {
		return c.opErr("send", err) // a released Data: memreg.ErrStale
	}
	hold := src.(*zcrxRef)
	hold.c = d.c
	d.Release() // the send's hold keeps the buffer
	var sum uint64
	if dbg := c.e.dbg; dbg != nil && dbg.buffers() {
		sum = dbg.sum(hold.bytes()[:d.off+d.n]) // what dbg.sent reads back: from the start
	}
	c.e.shareCtr.zcrxSent.Add(uint64(d.n))
	s := extSeg(hold, int32(d.off), int32(d.off+d.n))
	s.src, s.sum, s.shared = d.c, sum, true
	return c.enqueue(s)
}

// zcrxCredit is the receive credit a zcrx Data takes: the area pages it occupies (the
// kernel puts each completion in buffers of a page).
func zcrxCredit(n int) int64 {
	page := os.Getpagesize()
	return int64((n + page - 1) &^ (page - 1))
}

// ---- a NIC RX queue per listener (ListenOptions.ZcrxNIC) --------------------------------

// zcrxListener is a listener's NIC-bound zcrx: hwq's binding of the listener's address to
// a dedicated RX queue (header split, RSS carve-out, ntuple rule), a zcrx instance bound to
// that queue on queue 0's ring, and its imports into every other queue's ring (a
// connection's packets land in the one area whichever queue serves it).
type zcrxListener struct {
	b     *hwq.Binding
	recvs []*zcrx.Receiver // per queue index
	err   error            // why the listener's connections do not use the NIC
}

// setupZcrxNIC binds the listener's flows to a NIC RX queue when ListenOptions.ZcrxNIC asks
// for it. A refusal (hwq's, or the driver's at registration) leaves the listener on the
// queues' own receive path, visibly (Listener.Stats().ZcrxNICFallback); with NoFallback it fails
// Listen.
func (l *Listener) setupZcrxNIC(nic string) (*zcrxListener, error) {
	if nic == "" {
		return nil, nil
	}
	e := l.e
	if e.cfg.RecvPath != RecvZcrx {
		return nil, fmt.Errorf("ListenOptions.ZcrxNIC needs Config.RecvPath = RecvZcrx: %w", ErrInvalid)
	}
	if e.onAnyLoop() {
		return nil, fmt.Errorf("binding a NIC queue waits for every queue: %w", ErrWouldBlock)
	}
	zx := &zcrxListener{}
	err := l.bindZcrxNIC(zx, nic)
	if err == nil {
		return zx, nil
	}
	zx.err = err
	if e.cfg.NoFallback {
		return zx, zcrxUnavailable(-1, err)
	}
	return zx, nil
}

func init() {
	features.zcrxNIC = func(l *Listener, o *ListenOptions) (listenerPart, error) {
		zx, err := l.setupZcrxNIC(o.ZcrxNIC)
		if zx == nil {
			return nil, err
		}
		return zx, err
	}
}

func (l *Listener) bindZcrxNIC(zx *zcrxListener, nic string) error {
	e := l.e
	if e.backend != BackendIOUring {
		return errs.NotSupported("zcrx on a NIC queue", "the io_uring backend", fmt.Errorf("backend %v", e.backend))
	}
	if l.addr == nil {
		return fmt.Errorf("listener without an address: %w", ErrInvalid)
	}
	b, err := hwq.Bind(nic, hwq.Flow{Local: l.addr.AddrPort()}, hwq.BindOptions{Queue: -1})
	if err != nil {
		return err
	}
	recvs := make([]*zcrx.Receiver, len(e.queues))
	undo := func(err error) error {
		for _, r := range recvs {
			if r != nil {
				r.Close() // the kernel keeps the instance until the ring closes; it takes nothing
			}
		}
		b.Close()
		return err
	}
	for i, q := range e.queues {
		r := q.caps.ring
		if r == nil {
			return undo(&NotSupportedError{What: "zcrx on the " + e.backend.String() + " backend", Need: "the io_uring backend"})
		}
		u := r.uring()
		if i == 0 {
			recvs[0], err = zcrx.New(u, zcrx.Config{IfIndex: b.Ifindex, RxQueue: int(b.Queue), AreaSize: e.cfg.ZcrxAreaSize})
		} else {
			recvs[i], err = recvs[0].Share(u)
		}
		if err != nil {
			return undo(err)
		}
	}
	for i, q := range e.queues {
		q.zx().mu.Lock()
		q.zx().nic = append(q.zx().nic, recvs[i])
		q.zx().mu.Unlock()
	}
	zx.b, zx.recvs = b, recvs
	return nil
}

// accepted makes an accepted connection receive through the listener's NIC-bound instance
// on its queue (loop only).
func (zx *zcrxListener) accepted(c *Conn) {
	if zx.recvs != nil {
		c.rx = &zcrxConn{c: c, r: zx.recvs[c.q.idx]}
	}
}

// close undoes the NIC binding (the listener closes). Connections already accepted keep
// receiving into the area: their packets then reach it through the kernel's copy.
func (zx *zcrxListener) close() {
	if zx.b != nil {
		zx.b.Close()
	}
}

// stats fills ListenerStats.ZcrxNIC and ZcrxNICFallback.
func (zx *zcrxListener) stats(s *ListenerStats) {
	s.ZcrxNIC = zx.b
	if zx.err != nil {
		s.ZcrxNICFallback = zx.err.Error()
	}
}
