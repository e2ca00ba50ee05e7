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

func init() { newDebugHooks = newDebug }

// newDebug makes an engine's debugHooks (nil when opt asks for nothing: a typed nil would
// not be).
func newDebug(e *Engine, opt DebugOptions) debugHooks {
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
	if d.held != nil {
		go d.watchHeld()
	}
}

func (d *debugState) close() { close(d.stop) }

func (d *debugState) buffers() bool { return d.opt.Buffers }

func (d *debugState) sum(p []byte) uint64 { return debugSum(p) }

func (d *debugState) stats(s *Stats) {
	s.Debug.Misuses, s.Debug.SlowHandlerCalls, s.Debug.DataHeldLong = d.misuses.Load(), d.slow.Load(), d.heldLong.Load()
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

// sent verifies a sent segment's checksum as its buffer comes back.
func (d *debugState) sent(c *Conn, s seg) {
	if s.sum == 0 {
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

// taken verifies that a send buffer just taken from the pool was not written since it
// returned there.
func (d *debugState) taken(b memreg.Buf, c *Conn) {
	if !d.opt.Buffers {
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

// poolOptions keeps the pools mapped after Close and poisons free send buffers (Buffers).
func (d *debugState) poolOptions(o memreg.PoolOptions, send bool) memreg.PoolOptions {
	if d.opt.Buffers {
		o.KeepMapped = true
		if send {
			o.Scrub = scrubSend
		}
	}
	return o
}

// handlerRan runs after a handler call that started at t0 (SlowHandler).
func (d *debugState) handlerRan(c *Conn, method string, t0 time.Time) {
	if el := time.Since(t0); el > d.opt.SlowHandler {
		d.slow.Add(1)
		d.report(&MisuseError{Kind: "slow handler", Addr: tcpAddr(c.raddr),
			Detail: fmt.Sprintf("%s ran %v (handlers must not block: every connection of the queue waited)", method, el.Round(time.Microsecond))})
	}
}

// slowHandler says whether handler calls are timed.
func (d *debugState) slowHandler() bool { return d.opt.SlowHandler > 0 }

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

// delivered records Data delivered to a handler (HeldData).
func (d *debugState) delivered(c *Conn, dd Data) {
	if d.held == nil || (dd.src == nil && !dd.buf.Valid()) {
		return
	}
	d.heldMu.Lock()
	d.held[heldKey(dd)] = &heldEntry{at: time.Now(), addr: tcpAddr(c.raddr)}
	d.heldMu.Unlock()
}

// released forgets released Data (Data never tracked is a no-op).
func (d *debugState) released(dd Data) {
	if d.held == nil {
		return
	}
	d.heldMu.Lock()
	delete(d.held, heldKey(dd))
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
