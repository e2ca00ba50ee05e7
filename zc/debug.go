package zc

import (
	"fmt"
	"hash/crc32"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zcnet/zcnet/memreg"
)

// DebugOptions turns on checks that catch misuse of the API at a cost (Config.Debug). All
// are off by default; each finding is counted in Stats and reported to OnMisuse as a
// *MisuseError, and the engine goes on: a check never changes what is sent or received.
type DebugOptions struct {
	// Buffers checks buffer ownership. Send and SendData record a checksum of the bytes,
	// verified when the buffer comes back (after the send, or the zero-copy notification): a
	// write to a buffer after it was sent is reported ("write after Send"); SendBytes
	// likewise, verified before its done callback ("write before SendBytes' done"). Send buffers are
	// filled with a poison byte when they return to the pool and checked when handed out again
	// (Buffer, BufferWait, Write): a write after Release is reported ("write after
	// Release"). The pools' memory stays mapped after Engine.Close, so a slice kept past
	// Release writes into pages given back to the system instead of crashing the process.
	// Costs a pass over every buffer sent and handed out.
	Buffers bool
	// SlowHandler counts handler calls (OnData, OnEOF, OnWritable, posted functions,
	// DialAsync's done) that ran longer than this (Stats.Debug.SlowHandlerCalls): a handler that
	// blocks stalls every connection of its queue. 0: not timed.
	SlowHandler time.Duration
	// HeldData counts received Data held unreleased for longer than this
	// (Stats.Debug.DataHeldLong, each Data once), whichever receive path delivered it (the
	// ring, or a zcrx area): a forgotten Release stops its connection at MaxRecvHeld. 0: not
	// tracked.
	HeldData time.Duration
	// OnMisuse, if set, is called with a *MisuseError for each finding, on a queue goroutine
	// or the goroutine that found it: it must not block.
	OnMisuse func(err error)
}

// MisuseError is a misuse of the API caught by Config.Debug.
type MisuseError struct {
	Kind   string   // "write after Send", "write after Release", "slow handler", "Data held"
	Addr   net.Addr // the connection's peer, when known
	Detail string
}

func (e *MisuseError) Error() string {
	s := "zc: misuse: " + e.Kind
	if e.Addr != nil {
		s += " (" + e.Addr.String() + ")"
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// poison fills send buffers in the pool under DebugOptions.Buffers.
const poison = 0xdb

// debugState is an engine's debugging (nil when Config.Debug asks for nothing).
type debugState struct {
	e                       *Engine
	opt                     DebugOptions
	misuses, slow, heldLong atomic.Uint64
	heldMu                  sync.Mutex
	held                    map[any]*heldEntry // HeldData: Data delivered, not released (heldKey)
	stop                    chan struct{}
}

type heldEntry struct {
	at       time.Time
	addr     net.Addr
	reported bool
}

func newDebug(e *Engine, opt DebugOptions) *debugState {
	if !opt.Buffers && opt.SlowHandler <= 0 && opt.HeldData <= 0 {
		return nil
	}
	d := &debugState{e: e, opt: opt, stop: make(chan struct{})}
	if opt.HeldData > 0 {
		d.held = map[any]*heldEntry{}
	}
	return d
}

// start starts the HeldData watcher (New, once the engine runs); close stops it.
func (d *debugState) start() {
	if d != nil && d.held != nil {
		go d.watchHeld()
	}
}

func (d *debugState) close() {
	if d != nil {
		close(d.stop)
	}
}

func (d *debugState) report(err *MisuseError) {
	if d.opt.OnMisuse == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			d.e.callbackPanics.Add(1)
		}
	}()
	d.opt.OnMisuse(err)
}

// sum is a send's checksum (never 0: 0 means "not summed").
func debugSum(p []byte) uint64 { return uint64(crc32.ChecksumIEEE(p)) | 1<<32 }

// checkSent verifies a sent segment's checksum as its buffer comes back.
func (c *Conn) checkSent(s seg) {
	d := c.e.dbg
	if d == nil || s.sum == 0 {
		return
	}
	p := s.mem()
	if p == nil || int(s.n) > len(p) {
		return
	}
	if debugSum(p[:s.n]) != s.sum {
		d.misuses.Add(1)
		if s.kind == segApp {
			d.report(&MisuseError{Kind: "write before SendBytes' done", Addr: tcpAddr(c.raddr),
				Detail: fmt.Sprintf("the %d bytes passed to SendBytes changed before the kernel was done with them (write them only once done ran)", s.n)})
			return
		}
		d.report(&MisuseError{Kind: "write after Send", Addr: tcpAddr(c.raddr),
			Detail: fmt.Sprintf("the %d bytes of a sent buffer changed before the kernel was done with it (keep no slice of Buf.Bytes or Data.Bytes past Send/SendData)", s.n)})
	}
}

// checkPoison verifies that a send buffer just taken from the pool was not written since it
// returned there, and clears the poison.
func (q *queue) checkPoison(b memreg.Buf, c *Conn) {
	d := q.e.dbg
	if d == nil || !d.opt.Buffers {
		return
	}
	p := b.Bytes()
	for i, v := range p {
		if v != poison {
			d.misuses.Add(1)
			var addr net.Addr
			if c != nil {
				addr = tcpAddr(c.raddr)
			}
			d.report(&MisuseError{Kind: "write after Release", Addr: addr,
				Detail: fmt.Sprintf("byte %d of a free send buffer was written (a slice kept past Release or Send)", i)})
			break
		}
	}
}

// scrubSend is the send pools' memreg Scrub under DebugOptions.Buffers (the backends'
// pools: becontract.Config.Pool).
func scrubSend(p []byte) {
	for i := range p {
		p[i] = poison
	}
}

// timed runs after a handler call that started at t0 (SlowHandler).
func (c *Conn) timed(method string, t0 time.Time) {
	d := c.e.dbg
	if el := time.Since(t0); el > d.opt.SlowHandler {
		d.slow.Add(1)
		d.report(&MisuseError{Kind: "slow handler", Addr: tcpAddr(c.raddr),
			Detail: fmt.Sprintf("%s ran %v (handlers must not block: every connection of the queue waited)", method, el.Round(time.Microsecond))})
	}
}

// slowCheck says whether handler calls are timed.
func (c *Conn) slowCheck() bool { return c.e.dbg != nil && c.e.dbg.opt.SlowHandler > 0 }

// heldKey is what HeldData tracks a delivered Data by: the owner of its bytes, its ring
// buffer or its dataSource (a zcrx buffer's, or a mapped run's), which its Release (or
// SendData) gives back. Data made by Retain and Slice have owners of their own and are not
// tracked: the delivered Data's Release is the one that counts.
func heldKey(d Data) any {
	if d.src != nil {
		return d.src
	}
	return d.buf
}

// trackHeld records Data delivered to a handler (HeldData).
func (c *Conn) trackHeld(dd Data) {
	d := c.e.dbg
	if d == nil || d.held == nil || (dd.src == nil && !dd.buf.Valid()) {
		return
	}
	d.heldMu.Lock()
	d.held[heldKey(dd)] = &heldEntry{at: time.Now(), addr: tcpAddr(c.raddr)}
	d.heldMu.Unlock()
}

// untrackHeld forgets released Data (a key never tracked is a no-op).
func (d *debugState) untrackHeld(key any) {
	if d == nil || d.held == nil {
		return
	}
	d.heldMu.Lock()
	delete(d.held, key)
	d.heldMu.Unlock()
}

// watchHeld looks for Data held too long, twice per bound.
func (d *debugState) watchHeld() {
	t := time.NewTicker(max(d.opt.HeldData/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case now := <-t.C:
			var found []*MisuseError
			d.heldMu.Lock()
			for _, h := range d.held {
				if !h.reported && now.Sub(h.at) > d.opt.HeldData {
					h.reported = true
					found = append(found, &MisuseError{Kind: "Data held", Addr: h.addr,
						Detail: fmt.Sprintf("received Data unreleased for over %v (a forgotten Release stops the connection at MaxRecvHeld)", d.opt.HeldData)})
				}
			}
			d.heldMu.Unlock()
			for _, m := range found {
				d.heldLong.Add(1)
				d.report(m)
			}
		}
	}
}
