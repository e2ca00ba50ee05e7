package zc

import (
	"errors"
	"fmt"
	"github.com/zcnet/zcnet/zc/internal/be/fake"
	"io"
	"unsafe"

	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/zc/internal/becontract"
)

// FanOuts in the interleaving test (interleave_test.go): some seeds run one to three
// FanOuts, each with a random policy and bound and its own publisher connection
// ("fan-pub"), and subscriber connections ("fan-sub") that join a random non-empty set of
// them (added from the accept function whenever they arrive, so some join late and some
// after a fan ended). A publisher publishes in one of three ways:
//
//   - buf: Buffer, fill, Publish (ErrExhausted → OnWritable);
//   - shared: Buffer, fill, NewShared, PublishShared, then its own Release (which must
//     succeed: the FanOut holds references of its own);
//   - data: what its peer sends, received Data published with PublishData, whole or split
//     in two Slices (two messages over one buffer, the second at an offset);
//
// under FanOutPause ErrWouldBlock → OnReady posts the pump (a data publisher keeps the
// refused Data and pauses its receiving meanwhile). Now and then a publisher Removes one of
// its fan's subscribers mid-stream. A fan ends when its publisher is done (or fails): the
// FanOut closes; a subscriber is closed gracefully by the test once every fan it joined
// ended or removed it.
//
// Checked as the fake kernel takes a subscriber's bytes (takeFan): every send segment is a
// published message of a fan the subscriber joined; each fan's messages go out in its
// publishing order, each once, whole, with the message's bytes; none published before the
// subscriber was added or after it was removed; a message skipped only under FanOutDrop. At
// the end, per subscriber and fan: one that stayed and closed cleanly got every message of
// its window (published between Add and its Remove or the fan's end) under pause and close,
// one FanOutClose closed got a gap-free prefix; per fan: Published is the messages
// recorded, and Drops lies between the messages the clean subscribers missed (each was a
// drop, trailing ones included: a drop after a subscriber's last message shows only there)
// and those every subscriber missed; no drops or closes under the other policies; a clean
// publisher published all it meant to.

// Publishing modes.
const (
	fanBuf = iota
	fanShared
	fanData
)

var fanModeNames = [...]string{"buf", "shared", "data"}

// simFan is one FanOut and the log of what was published.
type simFan struct {
	s       *simRun
	id      int
	f       *FanOut
	policy  FanOutPolicy
	mode    int
	key     int64       // buf, shared: the stream the messages are cut from
	msgs    []simFanMsg // published, in order
	pubOff  int64
	pub     *simConn
	pubH    *simFanPub
	subs    []*fanSubState
	ended   bool
	skipped int // messages the subscribers' streams skipped (FanOutDrop)
	// joined: subscribers accepted so far. A publisher accepted before the first one waits
	// for it (held: buf and shared modes do not pump, data mode does not receive), so
	// that most messages have someone to go to.
	planned, joined int
	held            bool
}

// simFanMsg: bytes off..off+n of stream key, at offset base of its buffer.
type simFanMsg struct{ key, off, n, base int64 }

// fanBufKey names where a message starts: its buffer and the offset in it.
type fanBufKey struct {
	p   *byte
	off int64
}

type fanRef struct {
	sf  *simFan
	idx int
}

// fanSubState is one subscriber in one fan.
type fanSubState struct {
	sf *simFan
	r  *simConn
	// window: the messages published while it was in, [start, end); end -1: still in
	start, end int
	next       int // the next message it may get
	got        int // messages it got whole
}

// newSimFan draws a FanOut for the seed (loop-independent: made before the queue runs).
func (s *simRun) newSimFan() error {
	sf := &simFan{s: s, id: len(s.fans), policy: FanOutPolicy(s.Rng.IntN(3)), mode: s.Rng.IntN(3), key: s.Rng.Int64N(1 << 40)}
	opt := FanOutOptions{Policy: sf.policy}
	if s.Rng.IntN(2) == 0 {
		opt.MaxQueued = 1 + s.Rng.IntN(3*2048)
	}
	if sf.policy == FanOutPause {
		opt.OnReady = func() {
			if p := sf.pub; p != nil && p.c != nil {
				p.c.Post(func() { sf.pubH.pump(p.c) })
			}
		}
	}
	f, err := NewFanOut(opt)
	if err != nil {
		return err
	}
	sf.f = f
	s.fans = append(s.fans, sf)
	if s.fanBufs == nil {
		s.fanBufs = map[fanBufKey]fanRef{}
	}
	return nil
}

// planFans adds the fan roles to the plan: n FanOuts, each with a publisher, and
// subscribers each joining some of them, all accepted among the other roles in any order.
func (s *simRun) planFans() error {
	n := 1 + s.Rng.IntN(3)
	var roles []*simConn
	for range n {
		if err := s.newSimFan(); err != nil {
			return err
		}
		roles = append(roles, &simConn{s: s, kind: "fan-pub", pubFan: s.fans[len(s.fans)-1]})
	}
	for range 1 + s.Rng.IntN(3+2*n) {
		r := &simConn{s: s, kind: "fan-sub"}
		for _, sf := range s.fans {
			if s.Rng.IntN(2) == 0 {
				r.subFans = append(r.subFans, sf)
			}
		}
		if len(r.subFans) == 0 {
			r.subFans = []*simFan{s.fans[s.Rng.IntN(len(s.fans))]}
		}
		for _, sf := range r.subFans {
			sf.planned++
		}
		roles = append(roles, r)
	}
	for _, r := range roles {
		i := s.Rng.IntN(len(s.plan) + 1)
		s.plan = append(s.plan[:i], append([]*simConn{r}, s.plan[i:]...)...)
	}
	return nil
}

// acceptFan sets a fan role's connection up (the accept function, loop only).
func (s *simRun) acceptFan(r *simConn, c *Conn) Handler {
	switch r.kind {
	case "fan-pub":
		sf := r.pubFan
		h := &simFanPub{simBase: simBase{r}, fan: sf}
		sf.pub, sf.pubH = r, h
		if sf.mode == fanData {
			r.total = r.fc.InTotal // it publishes what its peer sends
		}
		if sf.held = sf.joined == 0 && sf.planned > 0; sf.held {
			if sf.mode == fanData {
				c.SetReceivePaused(true)
			}
		} else if sf.mode != fanData {
			c.Post(func() { h.pump(c) })
		}
		return h
	default: // fan-sub
		for _, sf := range r.subFans {
			st := &fanSubState{sf: sf, r: r, start: len(sf.msgs), end: -1}
			st.next = st.start
			r.fanSubs = append(r.fanSubs, st)
			r.fc.Other = true
			sf.subs = append(sf.subs, st)
			if err := sf.f.Add(c); err != nil {
				if !errors.Is(err, ErrClosed) {
					r.failf("FanOut.Add: %v", err)
				}
				st.end = st.start // the fan ended already: nothing to receive from it
			}
			sf.joined++
			if sf.held {
				sf.held = false
				pc, ph := sf.pub.c, sf.pubH
				if sf.mode == fanData {
					pc.Post(func() { pc.SetReceivePaused(false) })
				} else {
					pc.Post(func() { ph.pump(pc) })
				}
			}
		}
		s.subDone(r)
		return &simFanSub{simBase{r}}
	}
}

// subDone closes a subscriber once every fan it joined ended or removed it (loop only).
func (s *simRun) subDone(r *simConn) {
	for _, st := range r.fanSubs {
		if st.end < 0 {
			return
		}
	}
	if !r.closing && r.closes == 0 && !r.c.isClosing() { // (FanOutClose closed it already)
		r.fc.Tracef("Close (its fans ended)")
		r.closing = true
		r.c.Close()
	}
}

// end closes the FanOut; its subscribers' windows end (loop only).
func (sf *simFan) end() {
	if sf.ended {
		return
	}
	sf.ended = true
	sf.f.Close()
	for _, st := range sf.subs {
		if st.end < 0 {
			st.end = len(sf.msgs)
			sf.s.subDone(st.r)
		}
	}
}

// maybeRemove: now and then the publisher removes one of the fan's subscribers mid-stream.
func (sf *simFan) maybeRemove() {
	s := sf.s
	if s.Rng.IntN(64) != 0 {
		return
	}
	var in []*fanSubState
	for _, st := range sf.subs {
		if st.end < 0 {
			in = append(in, st)
		}
	}
	if len(in) == 0 {
		return
	}
	st := in[s.Rng.IntN(len(in))]
	if sf.f.Remove(st.r.c) {
		st.end = len(sf.msgs)
		s.fanRemoves++
		st.r.fc.Tracef("removed from fan %d at message %d", sf.id, st.end)
		s.subDone(st.r)
	}
}

// record logs a message about to be published; unrecord takes it back (refused).
func (sf *simFan) record(p *byte, m simFanMsg) {
	sf.s.fanBufs[fanBufKey{p, m.base}] = fanRef{sf, len(sf.msgs)}
	sf.msgs = append(sf.msgs, m)
}

func (sf *simFan) unrecord(p *byte, base int64) {
	sf.msgs = sf.msgs[:len(sf.msgs)-1]
	delete(sf.s.fanBufs, fanBufKey{p, base})
}

// simFanPub publishes total bytes in messages of random sizes, then ends its fan and closes.
type simFanPub struct {
	simBase
	fan     *simFan
	pending []Data // data mode: refused by PublishData (FanOutPause), published from OnReady
	paused  bool   // data mode: receiving paused while pending
}

func (h *simFanPub) OnWritable(c *Conn) { h.pump(c) }

func (h *simFanPub) OnClose(c *Conn, err error) {
	h.simBase.OnClose(c, err)
	for _, d := range h.pending {
		d.Release()
	}
	h.pending = nil
	h.fan.end()
}

func (h *simFanPub) pump(c *Conn) {
	r, sf := h.r, h.fan
	if r.closes > 0 || r.closing || sf.ended {
		return
	}
	if sf.mode == fanData {
		h.pumpData(c)
		return
	}
	for r.published < r.total {
		sf.maybeRemove()
		b, err := c.Buffer()
		if errors.Is(err, memreg.ErrExhausted) {
			return // OnWritable follows
		}
		if err != nil {
			h.unexpected(c, "Buffer", err)
			return
		}
		n := int(min(int64(len(b.Bytes())), r.total-r.published))
		if r.s.Rng.IntN(2) == 0 {
			n = 1 + r.s.Rng.IntN(n)
		}
		fake.Stream(b.Bytes()[:n], sf.key, sf.pubOff)
		ptr := unsafe.SliceData(b.Bytes())
		sf.record(ptr, simFanMsg{key: sf.key, off: sf.pubOff, n: int64(n)})
		if sf.mode == fanBuf {
			err = sf.f.Publish(b, n)
			if errors.Is(err, ErrWouldBlock) {
				b.Release() // still ours; OnReady brings us back
			}
		} else {
			var sh *Shared
			sh, err = NewShared(b, n)
			if err != nil {
				sf.unrecord(ptr, 0)
				h.unexpected(c, "NewShared", err)
				return
			}
			err = sf.f.PublishShared(sh)
			// Ours either way: the FanOut's sends hold references of their own.
			if rerr := sh.Release(); rerr != nil {
				r.failf("Shared.Release after PublishShared (%v): %v", err, rerr)
			}
		}
		if errors.Is(err, ErrWouldBlock) {
			sf.unrecord(ptr, 0)
			return
		}
		if err != nil {
			sf.unrecord(ptr, 0)
			h.unexpected(c, "Publish", err)
			return
		}
		sf.pubOff += int64(n)
		r.published += int64(n)
	}
	sf.end()
	h.close(c)
}

// OnData (data mode): the peer's bytes are published, whole or as two slices.
func (h *simFanPub) OnData(c *Conn, d Data) {
	r, sf := h.r, h.fan
	off := r.recvd
	h.checkData(c, d)
	if sf.mode != fanData || r.closing || sf.ended {
		d.Release()
		return
	}
	if d.Len() > 1 && r.s.Rng.IntN(3) == 0 {
		a := 1 + r.s.Rng.IntN(d.Len()-1)
		d1, err1 := d.Slice(0, a)
		d2, err2 := d.Slice(a, d.Len()-a)
		d.Release()
		if err1 != nil || err2 != nil {
			h.unexpected(c, "Slice", errors.Join(err1, err2))
			return
		}
		h.queue(d1, off)
		h.queue(d2, off+int64(a))
	} else {
		h.queue(d, off)
	}
	h.pumpData(c)
}

// queue adds d (bytes off.. of the peer's stream) to the messages to publish.
func (h *simFanPub) queue(d Data, off int64) {
	h.pending = append(h.pending, d)
	h.r.fc.Tracef("fan %d: queue %d bytes at %d", h.fan.id, d.Len(), off)
}

// pumpData publishes the pending Data in order; ErrWouldBlock keeps them and pauses
// receiving until OnReady.
func (h *simFanPub) pumpData(c *Conn) {
	r, sf := h.r, h.fan
	for len(h.pending) > 0 {
		sf.maybeRemove()
		d := h.pending[0]
		p := unsafe.SliceData(d.Bytes())
		base := int64(d.off)
		ptr := (*byte)(unsafe.Add(unsafe.Pointer(p), -d.off))
		off := r.published // the stream's bytes are published in order, each once
		n := d.Len()
		sf.record(ptr, simFanMsg{key: r.inKey, off: off, n: int64(n), base: base})
		err := sf.f.PublishData(d)
		if errors.Is(err, ErrWouldBlock) {
			sf.unrecord(ptr, base)
			if !h.paused {
				h.paused = true
				c.SetReceivePaused(true)
			}
			return // OnReady brings us back
		}
		h.pending = h.pending[1:]
		if err != nil {
			sf.unrecord(ptr, base)
			h.unexpected(c, "PublishData", err)
			return
		}
		r.published += int64(n)
	}
	if h.paused {
		h.paused = false
		c.SetReceivePaused(false)
	}
	if r.eof {
		sf.end()
		h.close(c)
	}
}

func (h *simFanPub) OnEOF(c *Conn, err error) {
	h.simBase.OnEOF(c, err)
	if h.fan.mode != fanData {
		return
	}
	if err != io.EOF {
		h.fan.end()
		h.close(c)
		return
	}
	if len(h.pending) == 0 {
		h.fan.end()
		h.close(c)
	}
}

// simFanSub is a subscriber: it checks what its peer sends and sends only what the FanOuts
// queue for it.
type simFanSub struct{ simBase }

func (r *simConn) fanState(sf *simFan) *fanSubState {
	for _, st := range r.fanSubs {
		if st.sf == sf {
			return st
		}
	}
	return nil
}

// takeFan checks p, the next bytes of segment s (whose buffer is d) a subscriber's send
// takes (the fake kernel's take).
func (sr *simRun) TakeOther(fc *fake.Conn, s becontract.Seg, p []byte) bool {
	k, r := sr.k, fc.Role.(*simConn)
	ptr := (*byte)(unsafe.Add(unsafe.Pointer(s.Ptr), -s.Off)) // the buffer's start
	st := r.fanCur
	var sf *simFan
	var idx int
	if st != nil {
		// Inside a message: the rest of it, from where the last send stopped.
		sf, idx = st.sf, st.next
		if m := sf.msgs[idx]; sr.fanBufs[fanBufKey{ptr, m.base}] != (fanRef{sf, idx}) || int64(s.Off) != m.base+r.fanPos {
			k.Failf("%v: fan %d message %d cut short at %d (a send of another buffer or offset follows)", fc, sf.id, idx, r.fanPos)
			return false
		}
	} else {
		ref, ok := sr.fanBufs[fanBufKey{ptr, int64(s.Off)}]
		if !ok {
			k.Failf("%v: a subscriber sends bytes that do not start a published message", fc)
			return false
		}
		sf, idx = ref.sf, ref.idx
		if st = r.fanState(sf); st == nil {
			k.Failf("%v: fan %d's message %d reached a connection that never joined it", fc, sf.id, idx)
			return false
		}
		switch {
		case idx < st.next:
			k.Failf("%v: fan %d: message %d sent again or out of order (next is %d)", fc, sf.id, idx, st.next)
			return false
		case st.end >= 0 && idx >= st.end:
			k.Failf("%v: fan %d: message %d reached the subscriber after it left (at message %d)", fc, sf.id, idx, st.end)
			return false
		case idx > st.next:
			if sf.policy != FanOutDrop {
				k.Failf("%v: fan %d: messages %d..%d skipped under %v", fc, sf.id, st.next, idx-1, sf.policy)
				return false
			}
			sf.skipped += idx - st.next
			st.next = idx
		}
	}
	m := sf.msgs[idx]
	pos := r.fanPos
	if pos+int64(len(p)) > m.n || !fake.Matches(p, m.key, m.off+pos) {
		k.Failf("%v: fan %d message %d: bytes %d..%d are not the message's", fc, sf.id, idx, pos, pos+int64(len(p)))
		return false
	}
	r.fanPos += int64(len(p))
	r.fanCur = st
	if r.fanPos == m.n {
		st.next++
		st.got++
		r.fanPos = 0
		r.fanCur = nil
	}
	return true
}

// checkFan checks a fan role at the end (simRun.check); it returns the problems found.
func (s *simRun) checkFan(r *simConn) []string {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	fc := r.fc
	clean := r.c.closeErr == nil && !fc.Reset && !s.engineClosed
	switch r.kind {
	case "fan-pub":
		if clean && r.published != r.total {
			bad("publisher (%s) closed without error after %d of %d bytes", fanModeNames[r.pubFan.mode], r.published, r.total)
		}
	case "fan-sub":
		if !clean {
			break // failed or reset: a checked prefix
		}
		if r.fanCur != nil {
			bad("subscriber closed cleanly inside fan %d's message %d (%d bytes of it)", r.fanCur.sf.id, r.fanCur.next, r.fanPos)
		}
		if !r.closing {
			// closed by FanOutClose: a checked prefix of whole messages
			byFan := false
			for _, st := range r.fanSubs {
				byFan = byFan || st.sf.policy == FanOutClose
			}
			if !byFan {
				bad("closed cleanly, yet neither the test nor a FanOutClose fan closed it")
			}
			break
		}
		for _, st := range r.fanSubs {
			if st.end < 0 {
				bad("fan %d: closed by the test while still subscribed", st.sf.id)
				continue
			}
			if miss := st.end - st.start - st.got; miss != 0 && st.sf.policy != FanOutDrop {
				bad("fan %d (%v): stayed to the end but got %d of the %d messages of its window [%d, %d)", st.sf.id, st.sf.policy, st.got, st.end-st.start, st.start, st.end)
			}
		}
	}
	return errs
}

// checkFanTotals checks each FanOut's counters against what the subscribers saw.
func (s *simRun) checkFanTotals() []string {
	var errs []string
	for _, sf := range s.fans {
		st := sf.f.Stats()
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Sprintf("fan %d (%v, %s): %s", sf.id, sf.policy, fanModeNames[sf.mode], fmt.Sprintf(format, args...)))
		}
		if st.Published != uint64(len(sf.msgs)) {
			bad("FanOutStats.Published %d, %d messages published", st.Published, len(sf.msgs))
		}
		// The messages the subscribers missed: every one a clean subscriber missed was a drop
		// (it got all that was queued for it); no drop is more than what all of them missed.
		cleanMiss, allMiss := 0, 0
		for _, ss := range sf.subs {
			end := ss.end
			if end < 0 {
				end = len(sf.msgs)
			}
			miss := end - ss.start - ss.got
			allMiss += miss
			r := ss.r
			if r.c.closeErr == nil && !r.fc.Reset && !s.engineClosed && r.closing {
				cleanMiss += miss
			}
		}
		if uint64(sf.skipped) > st.Drops {
			bad("subscribers skipped %d messages, FanOutStats.Drops %d", sf.skipped, st.Drops)
		}
		if st.Drops < uint64(cleanMiss) {
			bad("subscribers that closed cleanly missed %d messages, FanOutStats.Drops %d", cleanMiss, st.Drops)
		}
		if st.Drops > uint64(allMiss) {
			bad("FanOutStats.Drops %d, the subscribers missed only %d messages", st.Drops, allMiss)
		}
		if sf.policy != FanOutClose && st.Closes != 0 || sf.policy != FanOutDrop && st.Drops != 0 {
			bad("%d closes, %d drops", st.Closes, st.Drops)
		}
	}
	return errs
}
