package zc

import (
	"context"
	"errors"
	"github.com/zcnet/zcnet/zc/internal/be/fake"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
)

// Scripted cases over the fake kernel (zc/internal/be/fake): the scheduler stays off and the
// test delivers each completion itself, on the loop. The minimal forms of what the
// interleaving test found.

// fakeScript is an engine of one queue over a fake kernel whose scheduler never runs.
type fakeScript struct {
	t *testing.T
	s *simRun
	q *queue
	k *fake.Kernel
}

func newFakeScript(t *testing.T, cfg Config, epoll bool) *fakeScript {
	t.Helper()
	cfg.Queues, cfg.NoPin, cfg.CloseTimeout = 1, true, time.Hour
	s := &simRun{t: t, scale: 1, doneCh: make(chan string, 1)}
	s.MaxSteps, s.Rng, s.Epoll = 1, rand.New(rand.NewPCG(1, 1)), epoll
	e, err := startFakeEngine(cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	s.e, s.q = e, e.queues[0]
	t.Cleanup(func() {
		// Connections left open are reset when the context ends (nothing completes their
		// graceful close: the scheduler is off).
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		e.CloseContext(ctx)
	})
	s.k.Tame = true
	return &fakeScript{t: t, s: s, q: s.q, k: s.k}
}

// do runs fn on the loop, then lets the loop run a few more turns (what fn scheduled is
// flushed in the next turn, what that posted in the one after). Read the simulation's state
// only in a do: it is the loop's.
func (f *fakeScript) do(fn func()) {
	f.t.Helper()
	if err := f.q.Do(func() error { fn(); return nil }); err != nil {
		f.t.Fatal(err)
	}
	failure := ""
	for i := 0; i < 4; i++ {
		f.q.Do(func() error { failure = f.k.Failure; return nil })
	}
	if failure != "" {
		f.t.Fatalf("fake kernel: %s", failure)
	}
	if f.t.Failed() {
		f.t.FailNow() // what fn reported (t.Errorf: it ran on the loop, not the test's goroutine)
	}
}

// accept makes a connection served by h whose peer sends nothing; its stream out is key's.
func (f *fakeScript) accept(h Handler, key int64) (*Conn, *fake.Conn) {
	var c *Conn
	role := &simConn{kind: "scripted", s: f.s, ownKey: key}
	role.outKey = &role.ownKey
	f.s.l = &Listener{e: f.s.e, network: "tcp", family: unix.AF_INET, done: make(chan struct{}), accept: func(nc *Conn) Handler {
		c = nc
		fc := f.k.AddConn((*beConn)(nc), role)
		fc.OutKey, fc.SndCap, fc.Window = role.outKey, 1<<20, 1<<20
		return h
	}}
	f.do(func() {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			f.t.Error(err)
			return
		}
		unix.Close(fds[1])
		f.s.l.create(f.q, fds[0])
	})
	return c, role.fc
}

// closeRecorder is a handler that records OnClose.
type closeRecorder struct {
	HandlerFuncs
	closes int
	err    error
}

func (h *closeRecorder) OnClose(c *Conn, err error) { h.closes++; h.err = err }

// closingWrite writes n bytes of key's stream and closes: the one zero-copy send is in the
// fake kernel, the receive is cancelled (the close stopped it) and completed.
func (f *fakeScript) closingWrite(h *closeRecorder, key int64, n int) (*Conn, *fake.Conn) {
	c, fc := f.accept(h, key)
	p := make([]byte, n)
	fake.Stream(p, key, 0)
	f.do(func() {
		if w, err := c.Write(p); w != n || err != nil {
			f.t.Errorf("Write: %d, %v", w, err)
			return
		}
		c.Close()
	})
	f.do(func() {
		if fc.Sud == 0 || !fc.Szc || fc.Rud == 0 || !fc.Rcancel {
			f.t.Errorf("want a zero-copy send in flight and a cancelled receive: %s", f.s.Describe(fc))
			return
		}
		ud := fc.Rud
		f.k.Dispatch(fc, "recv", loop.Event{UD: ud, Res: -int32(unix.ECANCELED)})
	})
	return c, fc
}

// A connection closing gracefully whose last send is a zero-copy send that fails with no
// notification to come (io_uring: an early failure; the shim) must end with the error, not
// OnClose(nil): the bytes were not sent.
func TestFakeZCSendFailsWhileClosing(t *testing.T) {
	f := newFakeScript(t, Config{SendPath: SendZeroCopy, SendBufSize: 4096}, false)
	h := &closeRecorder{}
	c, fc := f.closingWrite(h, 7, 1000)
	f.do(func() {
		ud := fc.Sud
		fc.Sud = 0
		f.k.Dispatch(fc, "send-zc", loop.Event{UD: ud, Res: -int32(unix.ECONNRESET)})
	})
	f.do(func() {
		if !c.ended() || h.closes != 1 || h.err == nil {
			t.Errorf("after the failed send: finished %v, OnClose ran %d times with %v (want once, with the error)", c.ended(), h.closes, h.err)
		}
	})
}

// A zero-copy send that comes back short (MSG_WAITALL: the connection failed after taking
// part of it; io_uring reports the part) while the connection closes gracefully: the rest is
// lost, so OnClose must get an error.
func TestFakeZCShortSendWhileClosing(t *testing.T) {
	f := newFakeScript(t, Config{SendPath: SendZeroCopy, SendBufSize: 4096}, false)
	h := &closeRecorder{}
	c, fc := f.closingWrite(h, 9, 1000)
	var notif uint64
	f.do(func() {
		ud := fc.Sud
		fc.Sud = 0
		if !f.k.Take(fc, 300) {
			t.Error(f.k.Failure)
			return
		}
		notif = ud
		f.k.Dispatch(fc, "send-zc", loop.Event{UD: ud, Res: 300, Flags: uring.CQEFMore})
	})
	f.do(func() {
		f.k.Dispatch(fc, "notif", loop.Event{UD: notif, Flags: uring.CQEFNotif})
	})
	f.do(func() {
		if !c.ended() || h.closes != 1 || h.err == nil {
			t.Errorf("after a short zero-copy send: finished %v, OnClose ran %d times with %v (want once, with an error: 700 bytes were lost)", c.ended(), h.closes, h.err)
		}
	})
}

// The plain backend: a send waits for EPOLLOUT (the socket buffer was full); Write on the
// loop then queues a full buffer and stages a small tail behind it (coalescing: a send is in
// flight), and the handler closes. The peer has read meanwhile, so the close's pump writes
// the queued buffers at once and leaves the staging buffer; the completion flush
// (plainWritable) of a closing connection only advanced the close, which waited for "the
// sends' completions" with no send left: the tail never went out (after CloseTimeout the
// connection would be reset, and OnClose got nil).
func TestFakePlainStagedTailAtClose(t *testing.T) {
	f := newFakeScript(t, Config{SendPath: SendCopy, SendBufSize: 4096}, true)
	h := &closeRecorder{}
	c, fc := f.accept(h, 11)
	p := make([]byte, 300+4096+217)
	fake.Stream(p, 11, 0)
	write := func(q []byte) {
		if w, err := c.Write(q); w != len(q) || err != nil {
			t.Errorf("Write: %d, %v", w, err)
			return
		}
	}
	f.do(func() {
		fc.SndCap = 100
		write(p[:300])
	})
	f.do(func() {
		if !f.k.WantOut((*beConn)(c)) || fc.KAcc != 100 {
			t.Errorf("want a send waiting for EPOLLOUT after 100 bytes: %s", f.s.Describe(fc))
			return
		}
	})
	f.do(func() {
		fc.Sndq, fc.SndCap = 0, 1<<20 // the peer read everything; EPOLLOUT not delivered yet
		write(p[300:])
		c.Close()
	})
	f.do(func() {
		if !c.ended() || h.closes != 1 || h.err != nil || fc.KAcc != int64(len(p)) {
			t.Errorf("after Close: finished %v, OnClose ran %d times with %v, %d of %d bytes sent (want all, and a clean close)\n%s",
				c.ended(), h.closes, h.err, fc.KAcc, len(p), f.s.Describe(fc))
		}
	})
}

// grantCounter counts OnWritable calls and takes (and gives back) the buffer granted.
type grantCounter struct {
	closeRecorder
	c              *Conn
	writable, took int
}

func (h *grantCounter) OnWritable(c *Conn) {
	h.writable++
	if b, err := c.Buffer(); err == nil {
		h.took++
		b.Release()
	}
}

// More connections refused a send buffer than one turn of wakeGrants serves
// (maxGrantsPerTurn): every one hears OnWritable once, with its grant, over the next turns.
func TestFakeManyGrants(t *testing.T) {
	const n = 3 * maxGrantsPerTurn / 2
	f := newFakeScript(t, Config{SendBufSize: 256, SendBufs: n, SendPoolMax: 256 * n}, false)
	holder, _ := f.accept(&closeRecorder{}, 1)
	var held []memreg.Buf
	f.do(func() {
		for i := 0; i < n; i++ {
			b, err := holder.Buffer()
			if err != nil {
				t.Errorf("Buffer %d: %v", i, err)
				return
			}
			held = append(held, b)
		}
	})
	ws := make([]*grantCounter, n)
	for i := range ws {
		ws[i] = &grantCounter{}
		ws[i].c, _ = f.accept(ws[i], int64(i+2))
	}
	f.do(func() {
		for i, h := range ws {
			if _, err := h.c.Buffer(); !errors.Is(err, memreg.ErrExhausted) {
				t.Errorf("connection %d: Buffer: %v (want exhausted)", i, err)
				return
			}
		}
	})
	f.do(func() {
		for _, b := range held {
			b.Release() // all at once: n grants
		}
	})
	f.do(func() {}) // the grants past the first turn's
	f.do(func() {
		for i, h := range ws {
			if h.writable != 1 || h.took != 1 {
				t.Errorf("connection %d: OnWritable ran %d times, took %d grants (want 1, 1)", i, h.writable, h.took)
			}
		}
		if f.q.send.Free() != n {
			t.Errorf("%d of %d send buffers free", f.q.send.Free(), n)
		}
	})
}

// A zero-copy send that fails (or is cancelled) takes its segment off the queue with none of
// it sent: ConnStats.BytesDropped must count it (it counted only a short send's tail, so a
// relay's Lost and a close's Unsent missed whole segments). Both endings: -ECONNRESET with
// no notification, and -ECANCELED (an abort's cancelSend) with one.
func TestFakeZCSendFailedCountsDropped(t *testing.T) {
	for _, res := range []unix.Errno{unix.ECONNRESET, unix.ECANCELED} {
		t.Run(res.Error(), func(t *testing.T) {
			f := newFakeScript(t, Config{SendPath: SendZeroCopy, SendBufSize: 4096}, false)
			h := &closeRecorder{}
			c, fc := f.closingWrite(h, 13, 1000)
			f.do(func() {
				ud := fc.Sud
				fc.Sud = 0
				ev := loop.Event{UD: ud, Res: -int32(res)}
				if res == unix.ECANCELED {
					ev.Flags = uring.CQEFMore
				}
				f.k.Dispatch(fc, "send-zc", ev)
				if res == unix.ECANCELED {
					c.fail(c.opErr("write", unix.ECONNRESET)) // the cancel's abort: the connection failed
					f.k.Dispatch(fc, "notif", loop.Event{UD: ud, Flags: uring.CQEFNotif})
				}
			})
			f.do(func() {
				if !c.ended() || h.err == nil {
					t.Errorf("finished %v, OnClose %v (want finished, with an error)", c.ended(), h.err)
				}
				if d := c.Stats().BytesDropped; d != 1000 || fc.KAcc != 0 {
					t.Errorf("BytesDropped %d, the kernel took %d (want 1000 dropped, none taken)", d, fc.KAcc)
				}
			})
		})
	}
}

// A graceful close gives up (CloseTimeout) with a copying send waiting in the kernel for
// room: the send is cancelled (cancelSend) and its buffers stay the kernel's until it
// completes with the part it took; OnClose gets a *CloseTimeoutError whose Unsent is the
// rest, and ConnStats.BytesDropped agrees.
func TestFakeCloseTimeoutCancelsSend(t *testing.T) {
	f := newFakeScript(t, Config{SendPath: SendCopy, SendBufSize: 4096}, false)
	h := &closeRecorder{}
	c, fc := f.accept(h, 15)
	p := make([]byte, 3000)
	fake.Stream(p, 15, 0)
	f.do(func() {
		if w, err := c.Write(p); w != len(p) || err != nil {
			t.Errorf("Write: %d, %v", w, err)
		}
		c.Close()
	})
	f.do(func() {
		if fc.Sud == 0 || fc.Szc {
			t.Errorf("want a copying send in flight: %s", f.s.Describe(fc))
			return
		}
		if fc.Rud != 0 {
			f.k.Dispatch(fc, "recv", loop.Event{UD: fc.Rud, Res: -int32(unix.ECANCELED)})
		}
		c.cl.deadline = time.Now().Add(-time.Nanosecond) // CloseTimeout passed
		c.advanceClose()
		if !fc.Scancel || c.ended() {
			t.Errorf("want the send cancelled and the close waiting for it: cancel %v, finished %v", fc.Scancel, c.ended())
		}
	})
	f.do(func() {
		f.k.DoSend(fc) // the kernel had taken part of it (a third of the time the whole)
	})
	f.do(func() {
		var te *CloseTimeoutError
		if !c.ended() || !errors.As(h.err, &te) {
			t.Fatalf("finished %v, OnClose %v (want a *CloseTimeoutError)", c.ended(), h.err)
		}
		if d := c.Stats().BytesDropped; int64(te.Unsent) != 3000-fc.KAcc || d != uint64(te.Unsent) {
			t.Errorf("the kernel took %d of 3000: Unsent %d, BytesDropped %d", fc.KAcc, te.Unsent, d)
		}
	})
}
