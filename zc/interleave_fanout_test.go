package zc

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/zcnet/zcnet/memreg"
)

// FanOut in the interleaving test (interleave_test.go): some seeds run one FanOut with a
// random policy and bound, a publisher connection ("fan-pub": Buffer, fill, Publish on the
// loop; ErrExhausted → OnWritable, ErrWouldBlock → OnReady) and subscriber connections
// ("fan-sub", added from the accept function whenever they arrive). When the publisher is
// done (or fails) the FanOut closes and the test closes every subscriber gracefully.
//
// Checked, as the fake kernel takes each subscriber's bytes (takeFan): every send segment is
// a published message's buffer, messages go out in publishing order, each once, each from
// its first byte to its last, with the message's bytes; a message is skipped only under
// FanOutDrop (counted; the sum may not exceed FanOutStats.Drops). At the end a subscriber
// that stayed to the end and closed cleanly got every message published after it was added
// (FanOutPause, FanOutClose) or those less the ones dropped (FanOutDrop); one that FanOutClose
// closed got a gap-free prefix.

// simFan is a seed's FanOut and the log of what was published.
type simFan struct {
	f       *FanOut
	policy  FanOutPolicy
	key     int64
	msgs    []simFanMsg   // published, in order: bytes off..off+n of the key's stream
	byBuf   map[*byte]int // a published buffer → its message (the buffer's current one)
	pubOff  int64
	pub     *simConn
	pubH    *simFanPub
	subs    []*simConn
	ended   bool
	skipped int // messages the subscribers' streams skipped (FanOutDrop)
}

type simFanMsg struct{ off, n int64 }

// newSimFan draws a FanOut for the seed (loop-independent: made before the queue runs).
func (s *simRun) newSimFan() error {
	sf := &simFan{policy: FanOutPolicy(s.rng.IntN(3)), key: s.rng.Int64N(1 << 40), byBuf: map[*byte]int{}}
	opt := FanOutOptions{Policy: sf.policy}
	if s.rng.IntN(2) == 0 {
		opt.MaxQueued = 1 + s.rng.IntN(3*2048)
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
	s.fan = sf
	return nil
}

// acceptFan sets a fan role's connection up (the accept function, loop only).
func (s *simRun) acceptFan(r *simConn, c *Conn) Handler {
	sf := s.fan
	switch r.kind {
	case "fan-pub":
		h := &simFanPub{simBase: simBase{r}, fan: sf}
		sf.pub, sf.pubH = r, h
		c.Post(func() { h.pump(c) })
		return h
	default: // fan-sub
		sf.subs = append(sf.subs, r)
		r.fc.fan, r.fc.fanIdx = sf, len(sf.msgs)
		r.fanStart = len(sf.msgs)
		if err := sf.f.Add(c); err != nil {
			if !errors.Is(err, ErrClosed) {
				r.failf("FanOut.Add: %v", err)
			}
			r.closing = true // the fan ended already: nothing to receive
			c.Close()
		}
		return &simFanSub{simBase{r}}
	}
}

// end closes the FanOut and every subscriber still open (loop only).
func (sf *simFan) end() {
	if sf.ended {
		return
	}
	sf.ended = true
	sf.f.Close()
	for _, r := range sf.subs {
		if !r.closing && r.closes == 0 && !r.c.isClosing() { // (FanOutClose closed it already)
			r.fc.tracef("Close (fan ended)")
			r.closing = true
			r.c.Close()
		}
	}
}

// simFanPub publishes total bytes in messages of random sizes, then ends the fan and closes.
type simFanPub struct {
	simBase
	fan *simFan
}

func (h *simFanPub) OnWritable(c *Conn) { h.pump(c) }

func (h *simFanPub) OnClose(c *Conn, err error) {
	h.simBase.OnClose(c, err)
	h.fan.end()
}

func (h *simFanPub) pump(c *Conn) {
	r, sf := h.r, h.fan
	if r.closes > 0 || r.closing || sf.ended {
		return
	}
	for r.published < r.total {
		b, err := c.Buffer()
		if errors.Is(err, memreg.ErrExhausted) {
			return // OnWritable follows
		}
		if err != nil {
			h.unexpected(c, "Buffer", err)
			return
		}
		n := int(min(int64(len(b.Bytes())), r.total-r.published))
		if r.s.rng.IntN(2) == 0 {
			n = 1 + r.s.rng.IntN(n)
		}
		fakeStream(b.Bytes()[:n], sf.key, sf.pubOff)
		ptr := unsafe.SliceData(b.Bytes())
		idx := len(sf.msgs)
		sf.msgs = append(sf.msgs, simFanMsg{off: sf.pubOff, n: int64(n)})
		sf.byBuf[ptr] = idx
		err = sf.f.Publish(b, n)
		if errors.Is(err, ErrWouldBlock) {
			sf.msgs = sf.msgs[:idx]
			delete(sf.byBuf, ptr)
			b.Release() // still ours; OnReady brings us back
			return
		}
		if err != nil {
			h.unexpected(c, "Publish", err)
			return
		}
		sf.pubOff += int64(n)
		r.published += int64(n)
	}
	sf.end()
	h.close(c)
}

// simFanSub is a subscriber: it checks what its peer sends and sends only what the FanOut
// queues for it.
type simFanSub struct{ simBase }

// takeFan checks p, the next bytes of segment s (whose buffer is d) a subscriber's send
// takes (the fake kernel's take).
func (k *fakeKernel) takeFan(fc *fconn, s seg, d, p []byte) bool {
	sf := fc.fan
	idx, ok := sf.byBuf[unsafe.SliceData(d)]
	if !ok {
		k.failf("%v: a subscriber sends a buffer that was not published", fc)
		return false
	}
	pos := int64(s.off)
	switch {
	case idx < fc.fanIdx:
		k.failf("%v: message %d sent again or out of order (next is %d)", fc, idx, fc.fanIdx)
		return false
	case idx > fc.fanIdx:
		if fc.fanPos != 0 || pos != 0 {
			k.failf("%v: message %d cut short at %d (message %d starts at %d)", fc, fc.fanIdx, fc.fanPos, idx, pos)
			return false
		}
		if sf.policy != FanOutDrop {
			k.failf("%v: messages %d..%d skipped under %v", fc, fc.fanIdx, idx-1, sf.policy)
			return false
		}
		for j := fc.fanIdx; j < idx; j++ {
			fc.fanSkipped += sf.msgs[j].n
			sf.skipped++
		}
		fc.fanIdx = idx
	}
	if pos != fc.fanPos {
		k.failf("%v: message %d: bytes from %d taken, %d expected", fc, idx, pos, fc.fanPos)
		return false
	}
	m := sf.msgs[idx]
	if pos+int64(len(p)) > m.n || !fakeMatches(p, sf.key, m.off+pos) {
		k.failf("%v: message %d: bytes %d..%d are not the message's", fc, idx, pos, pos+int64(len(p)))
		return false
	}
	fc.fanPos += int64(len(p))
	if fc.fanPos == m.n {
		fc.fanIdx++
		fc.fanPos = 0
	}
	return true
}

// checkFan checks a fan role at the end (simRun.check); it returns the problems found.
func (s *simRun) checkFan(r *simConn) []string {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	fc, sf := r.fc, s.fan
	clean := r.c.closeErr == nil && !fc.reset && !s.engineClosed
	switch r.kind {
	case "fan-pub":
		if clean && r.published != r.total {
			bad("publisher closed without error after %d of %d bytes", r.published, r.total)
		}
	case "fan-sub":
		var since int64
		for _, m := range sf.msgs[r.fanStart:] {
			since += m.n
		}
		if !clean {
			break // failed or reset: a checked prefix
		}
		if fc.fanPos != 0 {
			bad("subscriber closed cleanly inside message %d (%d bytes of it)", fc.fanIdx, fc.fanPos)
		}
		if !r.closing {
			break // closed by FanOutClose: a checked prefix of whole messages
		}
		switch {
		case sf.policy == FanOutDrop && fc.kAcc+fc.fanSkipped > since:
			bad("subscriber got %d bytes and skipped %d of the %d published since it was added", fc.kAcc, fc.fanSkipped, since)
		case sf.policy != FanOutDrop && fc.kAcc != since:
			bad("subscriber stayed to the end but got %d of the %d bytes published since it was added (%v)", fc.kAcc, since, sf.policy)
		}
	}
	return errs
}

// checkFanTotals checks the FanOut's counters against what the subscribers saw.
func (s *simRun) checkFanTotals() []string {
	sf := s.fan
	if sf == nil {
		return nil
	}
	st := sf.f.Stats()
	if uint64(sf.skipped) > st.Drops {
		return []string{fmt.Sprintf("subscribers skipped %d messages, FanOutStats.Drops %d", sf.skipped, st.Drops)}
	}
	if sf.policy != FanOutClose && st.Closes != 0 || sf.policy != FanOutDrop && st.Drops != 0 {
		return []string{fmt.Sprintf("%v FanOut: %d closes, %d drops", sf.policy, st.Closes, st.Drops)}
	}
	return nil
}
