package zc

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/zcnet/zcnet/memreg"
)

// FanOutPolicy says what a FanOut does with a subscriber that has its bound of bytes
// queued (FanOutOptions.MaxQueued) when a message is published.
type FanOutPolicy uint8

const (
	// FanOutPause refuses the whole message: Publish returns ErrWouldBlock and queues it for
	// nobody; OnReady runs once every subscriber is back under half its bound (or gone).
	FanOutPause FanOutPolicy = iota
	// FanOutDrop skips the slow subscriber for this message (FanOutStats.Drops).
	FanOutDrop
	// FanOutClose closes the slow subscriber (FanOutStats.Closes) and goes on without it.
	FanOutClose
)

func (p FanOutPolicy) String() string {
	switch p {
	case FanOutPause:
		return "pause"
	case FanOutDrop:
		return "drop"
	case FanOutClose:
		return "close"
	}
	return fmt.Sprintf("FanOutPolicy(%d)", uint8(p))
}

// FanOutOptions configure a FanOut.
type FanOutOptions struct {
	Policy FanOutPolicy
	// MaxQueued bounds the bytes one subscriber may have queued (Conn.Queued: its sends
	// not yet sent, whoever queued them) before the policy applies (default: the
	// subscriber's Config.MaxQueuedBytes). A published message may take a subscriber past
	// it by one message: the bound is checked before each message. What the queue has not
	// yet handed to the kernel counts too, so under FanOutDrop and FanOutClose the bound
	// must also hold a burst of publishing for the queue's own latency, or subscribers that
	// keep up are dropped or closed with the slow ones (a tester's 1 KiB messages, 8 per
	// millisecond: 32 KiB dropped fast readers' messages, 256 KiB none).
	MaxQueued int
	// OnReady (FanOutPause) runs once after a Publish returned ErrWouldBlock, when every
	// subscriber is under half its bound again (or was removed, or closed), or the FanOut
	// closed: publish again from there. It runs on the queue goroutine of the subscriber that drained last (or on
	// the goroutine that removed it) and must not block: an event-loop publisher posts to
	// its own connection (Conn.Post), a goroutine publisher signals a channel.
	OnReady func()
}

// FanOutStats are a FanOut's counters.
type FanOutStats struct {
	Subscribers int    // subscribers now
	Published   uint64 // messages published (queued for at least one subscriber, or none)
	Deliveries  uint64 // message × subscriber sends queued
	Drops       uint64 // message × subscriber skipped by FanOutDrop
	Closes      uint64 // subscribers closed by FanOutClose
	Gone        uint64 // subscribers removed because they closed or their send failed
	Pauses      uint64 // Publish calls refused with ErrWouldBlock (FanOutPause)
	BytesShared uint64 // bytes queued as shared sends (one buffer, every subscriber)
}

// FanOut publishes messages to many subscriber connections, each message one buffer sent
// to all of them without a copy (Shared), each subscriber bounded by MaxQueued bytes with
// the policy the caller picked for a slow one; memory never grows without bound (a message's
// buffer is held until the slowest subscriber sent it, and the bound caps how much any one
// of them lags). Its methods may be called from any goroutine, handlers included.
//
// Add takes over the subscriber's handler: the FanOut wraps it (every event still reaches
// it), to hear when the subscriber drained (OnWritable) and when it closed (OnClose:
// the subscriber leaves). SetHandler on a subscriber fails with ErrInvalid: Remove it first. A
// subscriber that half-closed its sending side, or whose send fails, leaves the FanOut
// (FanOutStats.Gone); one whose peer half-closed stays.
type FanOut struct {
	opt FanOutOptions

	mu      sync.Mutex
	subs    []*fanSub // in Add order (a subscriber's index is fanSub.i)
	byConn  map[*Conn]*fanSub
	closed  bool
	blocked bool // a Publish was refused: OnReady is owed
	lagging int  // while blocked: subscribers still over half their bound

	published, deliveries, drops, closes, gone, pauses, shared atomic.Uint64
}

// fanSub is one subscriber, and the handler that wraps its own.
type fanSub struct {
	f     *FanOut
	c     *Conn
	i     int
	inner Handler // the subscriber's handler (set on its queue goroutine)
	// left: removed (the wrapper only passes events on); lag: counted in f.lagging
	left, lag bool
	retries   int // install's tries while the connection has no handler yet
}

// NewFanOut returns an empty FanOut. A Policy it does not know, a negative MaxQueued, and
// FanOutPause without OnReady are ErrInvalid.
func NewFanOut(opt FanOutOptions) (*FanOut, error) {
	if opt.Policy > FanOutClose {
		return nil, fmt.Errorf("zc: fan-out policy %v: %w", opt.Policy, ErrInvalid)
	}
	if opt.Policy == FanOutPause && opt.OnReady == nil {
		return nil, fmt.Errorf("zc: fan-out: FanOutPause needs OnReady (what tells a paused publisher to go on): %w", ErrInvalid)
	}
	if opt.MaxQueued < 0 {
		return nil, fmt.Errorf("zc: fan-out MaxQueued %d: %w", opt.MaxQueued, ErrInvalid)
	}
	return &FanOut{opt: opt, byConn: map[*Conn]*fanSub{}}, nil
}

// Add subscribes c (from any goroutine; from the accept function too). It fails with
// ErrClosed when the FanOut or c is closed (or closing) and ErrInvalid when c is already a
// subscriber, or a Relay forwards it (its handler is the relay's, and the FanOut's sends
// would interleave with the relay's). A subscriber must belong to the engine whose buffers (or Data) are published:
// a send to one of another engine fails (ErrForeignBuffer) and it leaves (Gone).
func (f *FanOut) Add(c *Conn) error {
	if c == nil {
		return fmt.Errorf("zc: fan-out add: nil connection: %w", ErrInvalid)
	}
	if c.isClosing() {
		return c.opErr("fanout", ErrClosed)
	}
	s := &fanSub{f: f, c: c}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return c.opErr("fanout", ErrClosed)
	}
	if _, ok := f.byConn[c]; ok {
		f.mu.Unlock()
		return c.opErr("fanout", fmt.Errorf("already a subscriber: %w", ErrInvalid))
	}
	if !c.rd.Wrap() { // a Relay reads it (remove unwraps, once)
		f.mu.Unlock()
		return c.opErr("fanout", c.readerErr())
	}
	s.i = len(f.subs)
	f.subs = append(f.subs, s)
	f.byConn[c] = s
	f.mu.Unlock()
	if c.q.OnLoop() && c.h != nil {
		s.install()
		return nil
	}
	// Off the queue, or from the accept function (the handler is not in place yet): on the
	// queue goroutine, next.
	if err := c.q.Post(s.install); err != nil {
		f.remove(s, false)
		return c.opErr("fanout", ErrClosed)
	}
	return nil
}

// install wraps the subscriber's handler (on its queue goroutine).
func (s *fanSub) install() {
	c := s.c
	s.f.mu.Lock()
	left := s.left
	s.f.mu.Unlock()
	if left {
		return // removed before it was installed: the handler stays its own
	}
	if c.ended() || c.inClose() {
		s.f.remove(s, true)
		return
	}
	if c.h == nil {
		// still no handler (a connection still dialing): try again once its handler is in
		// place; a connection never given one leaves
		if s.retries++; s.retries < 1000 && c.q.Post(s.install) == nil {
			return
		}
		s.f.remove(s, true)
		return
	}
	s.inner = c.h
	c.h = s
	s.f.drained(s) // a drain before we listened would be lost otherwise
}

// Remove unsubscribes c (its handler is its own again); it reports whether c was a
// subscriber. Sends already queued on c still go out.
func (f *FanOut) Remove(c *Conn) bool {
	f.mu.Lock()
	s := f.byConn[c]
	f.mu.Unlock()
	if s == nil {
		return false
	}
	return f.remove(s, false)
}

// remove takes s out (gone: it closed or failed); it reports whether s was still in.
func (f *FanOut) remove(s *fanSub, gone bool) bool {
	f.mu.Lock()
	if s.left {
		f.mu.Unlock()
		return false
	}
	s.left = true
	s.c.rd.Unwrap()
	last := len(f.subs) - 1
	f.subs[s.i] = f.subs[last]
	f.subs[s.i].i = s.i
	f.subs[last] = nil
	f.subs = f.subs[:last]
	delete(f.byConn, s.c)
	if gone {
		f.gone.Add(1)
	}
	ready := f.unlagLocked(s)
	f.mu.Unlock()
	// Give the connection its own handler back (when ours is on top: a wrapper under
	// another FanOut's only passes events on from now).
	unwrap := func() {
		if s.c.h == Handler(s) && s.inner != nil {
			s.c.h = s.inner
		}
	}
	if s.c.q.OnLoop() {
		unwrap()
	} else {
		s.c.q.Post(unwrap) // a closed queue: the connection is gone, nothing to give back
	}
	if ready {
		f.ready()
	}
	return true
}

// unlagLocked: s no longer holds the publisher back; it reports whether OnReady is due.
func (f *FanOut) unlagLocked(s *fanSub) bool {
	if !s.lag {
		return false
	}
	s.lag = false
	f.lagging--
	if f.blocked && f.lagging == 0 {
		f.blocked = false
		return true
	}
	return false
}

func (f *FanOut) ready() {
	if f.opt.OnReady != nil {
		f.opt.OnReady()
	}
}

// bound is s's MaxQueued.
func (f *FanOut) bound(c *Conn) int {
	if f.opt.MaxQueued > 0 {
		return f.opt.MaxQueued
	}
	return c.e.cfg.MaxQueuedBytes
}

// drained: s's sends made progress (its OnWritable, or its install).
func (f *FanOut) drained(s *fanSub) {
	f.mu.Lock()
	if !s.lag || s.left {
		f.mu.Unlock()
		return
	}
	q := s.c.Queued()
	ready := false
	if q <= f.bound(s.c)/2 {
		ready = f.unlagLocked(s)
	}
	f.mu.Unlock()
	if ready {
		f.ready()
	}
}

// Publish sends the first n bytes of b to every subscriber, one buffer shared by all
// (b must come from the engine's send pool: Conn.Buffer). It takes ownership of b, except
// when it returns ErrWouldBlock (FanOutPause: a subscriber is at its bound; nothing was
// queued, b is still the caller's; OnReady follows). After Close it returns ErrClosed and
// releases b. Buffer errors are NewShared's.
func (f *FanOut) Publish(b memreg.Buf, n int) error {
	var sh *Shared
	err := f.publish(func() (*Shared, error) {
		var err error
		sh, err = NewShared(b, n)
		return sh, err
	})
	if sh != nil {
		sh.Release() // the sends hold it now
	} else if errors.Is(err, ErrClosed) {
		b.Release()
	}
	return err
}

// PublishData sends received bytes to every subscriber without copying them: d's buffer
// is shared by every send and returns (with the receiving connection's receive credit)
// when the last is done, so a publisher connection whose messages wait in slow
// subscribers' queues stops receiving at its MaxRecvHeld. It releases d, except when it
// returns ErrWouldBlock (FanOutPause; d is still the caller's: keep it, pause the
// publisher's receiving if need be, and publish it again from OnReady). Data that cannot
// be shared with a fan-out's sends (mapped or zcrx Data: a fan-out sends memreg buffers
// only) is refused with ErrNotSupported and left with the caller, to copy into a buffer
// and Publish.
func (f *FanOut) PublishData(d Data) error {
	if _, ref := d.src.(*refData); d.src != nil && !ref {
		return fmt.Errorf("zc: fan-out of mapped or zcrx Data (copy it into a buffer and Publish): %w", ErrNotSupported)
	}
	if d.n == 0 {
		d.Release()
		return fmt.Errorf("zc: fan-out: %w", ErrEmpty)
	}
	var sh *Shared
	taken := false
	err := f.publish(func() (*Shared, error) {
		var err error
		taken = true
		sh, err = sharedData(d)
		return sh, err
	})
	if sh != nil {
		sh.Release()
	} else if errors.Is(err, ErrClosed) && !taken {
		d.Release()
	}
	return err
}

// sharedData turns ring Data into a Shared (d is consumed).
func sharedData(d Data) (*Shared, error) {
	if r, ok := d.src.(*refData); ok {
		return &Shared{ref: r.ref(), off: d.off, n: d.n, tag: r.ref().Region().Pool().Tag()}, nil
	}
	r, err := d.Retain()
	if err != nil {
		d.Release()
		return nil, err
	}
	d.Release() // r holds the buffer (and the receive credit) now
	ref := r.src.(*refData).ref()
	return &Shared{ref: ref, n: r.n, tag: ref.Region().Pool().Tag()}, nil
}

// PublishShared sends sh to every subscriber (sh stays the caller's: Release it when done
// publishing). Under FanOutPause, when a subscriber is at its bound it queues nothing and
// returns ErrWouldBlock (OnReady follows).
func (f *FanOut) PublishShared(sh *Shared) error {
	if sh == nil || !sh.ref.Valid() {
		return fmt.Errorf("zc: fan-out: %w", memreg.ErrStale)
	}
	return f.publish(func() (*Shared, error) { return sh, nil })
}

// publish admits a message (the FanOut is open; under FanOutPause nobody is at its bound),
// then makes it (mk runs only once admitted, so a refused message stays the caller's) and
// queues it for every subscriber.
func (f *FanOut) publish(mk func() (*Shared, error)) error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return fmt.Errorf("zc: fan-out: %w", ErrClosed)
	}
	if f.blocked {
		f.pauses.Add(1)
		f.mu.Unlock()
		return fmt.Errorf("zc: fan-out: a subscriber is at its bound: %w", ErrWouldBlock)
	}
	if f.opt.Policy == FanOutPause {
		over := false
		for _, s := range f.subs {
			q, b := s.c.Queued(), f.bound(s.c)
			if q >= b {
				over = true
			}
			if q > b/2 && !s.lag {
				// it holds the publisher back until it drained to half its bound
				s.lag = true
				f.lagging++
			}
		}
		if over {
			f.blocked = true
			f.pauses.Add(1)
			f.mu.Unlock()
			return fmt.Errorf("zc: fan-out: a subscriber is at its bound: %w", ErrWouldBlock)
		}
		// nobody at its bound: the lag marks were for a pause that did not happen
		for _, s := range f.subs {
			if s.lag {
				s.lag = false
				f.lagging--
			}
		}
	}
	sh, err := mk()
	if err != nil {
		f.mu.Unlock()
		return err
	}
	f.published.Add(1)
	var failed, slow []*fanSub
	sent := uint64(0)
	for _, s := range f.subs {
		if f.opt.Policy != FanOutPause && s.c.Queued() >= f.bound(s.c) {
			slow = append(slow, s)
			continue
		}
		if err := sh.send(s.c); err != nil {
			failed = append(failed, s)
			continue
		}
		sent++
	}
	f.mu.Unlock()
	if sent > 0 {
		f.deliveries.Add(sent)
		f.shared.Add(sent * uint64(sh.n))
		if e, ok := sh.tag.(*Engine); ok {
			e.shareCtr.sends.Add(sent)
			e.shareCtr.bytes.Add(sent * uint64(sh.n))
		}
	}
	for _, s := range slow {
		if f.opt.Policy == FanOutDrop {
			f.drops.Add(1)
			continue
		}
		if f.remove(s, false) {
			f.closes.Add(1)
			s.c.Close()
		}
	}
	for _, s := range failed {
		f.remove(s, true)
	}
	return nil
}

// Close removes every subscriber (their handlers are their own again; they stay open)
// and makes later Publish calls fail with ErrClosed. A second Close returns ErrClosed.
func (f *FanOut) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return fmt.Errorf("zc: fan-out: %w", ErrClosed)
	}
	f.closed = true
	wake := f.blocked // a paused publisher hears of it (its next Publish: ErrClosed)
	f.blocked = false
	subs := append([]*fanSub(nil), f.subs...)
	f.mu.Unlock()
	for _, s := range subs {
		f.remove(s, false)
	}
	if wake {
		f.ready()
	}
	return nil
}

// Stats returns the FanOut's counters.
func (f *FanOut) Stats() FanOutStats {
	f.mu.Lock()
	n := len(f.subs)
	f.mu.Unlock()
	return FanOutStats{
		Subscribers: n,
		Published:   f.published.Load(), Deliveries: f.deliveries.Load(), Drops: f.drops.Load(),
		Closes: f.closes.Load(), Gone: f.gone.Load(), Pauses: f.pauses.Load(),
		BytesShared: f.shared.Load(),
	}
}

// The wrapper: every event reaches the subscriber's own handler.

func (s *fanSub) OnData(c *Conn, d Data) { s.inner.OnData(c, d) }

func (s *fanSub) OnEOF(c *Conn, err error) { s.inner.OnEOF(c, err) }

func (s *fanSub) OnClose(c *Conn, err error) {
	s.f.remove(s, true)
	s.inner.OnClose(c, err)
}

func (s *fanSub) OnWritable(c *Conn) {
	s.f.drained(s)
	if w, ok := s.inner.(Writable); ok {
		w.OnWritable(c)
	}
}
