package services

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zcnet/zcnet/bench/internal/frame"
	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/zc"
)

// The fan-out protocol. A connection's first byte says what it is: 'P' the publisher,
// 'S' a subscriber (the server answers a subscriber with one byte, 'K', once it is
// registered). A message is [size u32][seq u64][payload][seq u64], size bytes in all,
// the payload fixed (fanPayload): a subscriber checks every byte with one comparison.
const (
	rolePub, roleSub, subAck = 'P', 'S', 'K'
	fanHdr                   = 12
	fanTrl                   = 8
)

// SubBacklog is the drop policy of every fan-out server: a message is dropped for a
// subscriber that has this many bytes waiting for it (net: in its channel; zc: queued on
// its connection), never queued without bound.
const SubBacklog = 64 << 10

// SlowSubscribers is how many of n subscribers read slowly (slowPause): 2%, at least one.
func SlowSubscribers(n int) int { return max(1, n/50) }

// slowPause is how long a slow subscriber sleeps after every message while the
// publisher publishes (about 500 messages per second: far behind it, so its socket
// buffers fill and the server's drop policy acts); afterwards it reads the rest at full
// speed.
const slowPause = 2 * time.Millisecond

// FanBurst is how many messages the publisher sends before it waits for the last
// subscriber (a fast one, the probe) to have them: the publisher goes as fast as the
// server delivers to its fast subscribers, as a real one would not outrun them for long,
// and the slow ones fall behind and drop (never the server's memory).
const FanBurst = 32

func fanPayload(size int) []byte {
	p := make([]byte, size-fanHdr-fanTrl)
	for i := range p {
		p[i] = byte(i*13 + 5)
	}
	return p
}

// fanoutNet is the pub/sub server Go users write: a goroutine per subscriber draining
// a bounded channel into a bufio.Writer (flushed when the channel is empty), the
// publisher's goroutine reading messages with a bufio.Reader and offering each to every
// channel (dropped where the channel is full: SubBacklog bytes).
func fanoutNet(ctx context.Context, c harness.Case, m *harness.Meter, ready func(string)) error {
	ln, err := listenNet(ctx, c.Addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	ready(ln.Addr().String())
	type sub struct {
		conn *net.TCPConn
		ch   chan []byte
	}
	var subs []*sub
	var subsDone sync.WaitGroup
	var pub *net.TCPConn
	role := make([]byte, 1)
	for range c.Conns + 1 {
		conn, err := ln.AcceptTCP()
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := io.ReadFull(conn, role); err != nil {
			return fmt.Errorf("role: %w", err)
		}
		switch role[0] {
		case roleSub:
			s := &sub{conn: conn, ch: make(chan []byte, max(1, SubBacklog/c.Size))}
			subs = append(subs, s)
			subsDone.Add(1)
			go func() {
				defer subsDone.Done()
				defer s.conn.Close()
				bw := bufio.NewWriterSize(s.conn, 64<<10) // the buffering a Go user would choose, as every baseline here
				for msg := range s.ch {
					if _, err := bw.Write(msg); err != nil {
						for range s.ch {
						}
						return
					}
					if len(s.ch) == 0 {
						if err := bw.Flush(); err != nil {
							for range s.ch {
							}
							return
						}
					}
				}
				bw.Flush()
			}()
			if _, err := conn.Write([]byte{subAck}); err != nil {
				return err
			}
		case rolePub:
			pub = conn
		default:
			return fmt.Errorf("unknown role %q", role[0])
		}
	}
	if pub == nil {
		return errors.New("no publisher")
	}
	m.Start()
	var drops uint64
	br := bufio.NewReaderSize(pub, 64<<10)
	var hdr [4]byte
	var rerr error
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if err != io.EOF {
				rerr = err
			}
			break
		}
		n := int(binary.LittleEndian.Uint32(hdr[:]))
		if n < fanHdr+fanTrl || n > 1<<20 {
			rerr = fmt.Errorf("message size %d", n)
			break
		}
		msg := make([]byte, n)
		copy(msg, hdr[:])
		if _, err := io.ReadFull(br, msg[4:]); err != nil {
			rerr = err
			break
		}
		for _, s := range subs {
			select {
			case s.ch <- msg:
			default:
				drops++
			}
		}
	}
	for _, s := range subs {
		close(s.ch)
	}
	subsDone.Wait()
	m.Stop()
	m.Note("dropped", strconv.FormatUint(drops, 10))
	return rerr
}

// zcFanout is the zc fan-out server's state, written the way zc's docs teach (FanOut,
// Example_fanOut): every whole message of the publisher's Data goes to every subscriber as
// one shared reference to the received buffer (Data.Slice + FanOut.PublishData: no copy,
// the buffer comes back when the slowest subscriber sent it), a slow subscriber is skipped
// (FanOutDrop at SubBacklog queued bytes), and only a message split between two Data is
// copied (into a send buffer, published as one shared buffer).
type zcFanout struct {
	size  int
	fo    *zc.FanOut
	subs  []*zc.Conn // to close at the publisher's end (every handler runs on the one queue)
	carry []byte
	m     *harness.Meter
	done  func()
	fail  func(error)
}

// fanConn is the handler of a connection before its role is known.
type fanConn struct {
	f    *zcFanout
	role byte
}

func (h *fanConn) OnData(c *zc.Conn, d zc.Data) {
	if h.role == 0 {
		h.role = d.Bytes()[0]
		switch h.role {
		case roleSub:
			d.Release()
			if _, err := c.Write([]byte{subAck}); err != nil {
				h.f.fail(err)
				c.Close()
				return
			}
			if err := h.f.fo.Add(c); err != nil {
				h.f.fail(err)
				c.Close()
				return
			}
			h.f.subs = append(h.f.subs, c)
			return
		case rolePub:
			h.f.m.Start()
			if d.Len() == 1 {
				d.Release()
				return
			}
			rest, err := d.Slice(1, d.Len()-1)
			d.Release()
			if err != nil {
				h.f.fail(err)
				c.Close()
				return
			}
			d = rest
		default:
			d.Release()
			h.f.fail(fmt.Errorf("unknown role %q", h.role))
			c.Close()
			return
		}
	}
	if h.role == rolePub {
		h.f.publish(c, d)
	} else {
		d.Release()
	}
}

// publish forwards the whole messages of d (after completing one carried over from the
// last Data) and carries a partial one over, copied. It releases d.
func (f *zcFanout) publish(c *zc.Conn, d zc.Data) {
	defer d.Release()
	b := d.Bytes()
	off := 0
	if len(f.carry) > 0 {
		// Complete the message split between the last Data and this one.
		if len(f.carry) < 4 {
			k := min(4-len(f.carry), len(b))
			f.carry = append(f.carry, b[:k]...)
			off = k
			if len(f.carry) < 4 {
				return
			}
		}
		n := int(binary.LittleEndian.Uint32(f.carry))
		if n < fanHdr+fanTrl || n > 1<<20 {
			f.fail(fmt.Errorf("message size %d", n))
			c.Close()
			return
		}
		k := min(n-len(f.carry), len(b)-off)
		f.carry = append(f.carry, b[off:off+k]...)
		off += k
		if len(f.carry) < n {
			return
		}
		f.publishCopy(c, f.carry)
		f.carry = f.carry[:0]
	}
	end := off
	for len(b)-end >= 4 {
		n := int(binary.LittleEndian.Uint32(b[end:]))
		if n < fanHdr+fanTrl || n > 1<<20 {
			f.fail(fmt.Errorf("message size %d", n))
			c.Close()
			return
		}
		if len(b)-end < n {
			break
		}
		end += n
	}
	if end > off {
		s, err := d.Slice(off, end-off)
		if err == nil {
			err = f.fo.PublishData(s) // FanOutDrop never refuses: s is taken
		}
		if err != nil {
			f.fail(err)
			c.Close()
			return
		}
	}
	f.carry = append(f.carry[:0], b[end:]...)
}

// publishCopy publishes one message that lay across two Data: copied into a send buffer,
// shared by every subscriber. Without a free buffer it is dropped for everyone (the
// subscribers see a gap, as a drop).
func (f *zcFanout) publishCopy(c *zc.Conn, msg []byte) {
	buf, err := c.Buffer()
	if err != nil || len(buf.Bytes()) < len(msg) {
		if err == nil {
			buf.Release()
		}
		return
	}
	n := copy(buf.Bytes(), msg)
	if err := f.fo.Publish(buf, n); err != nil {
		f.fail(err)
		c.Close()
	}
}

func (h *fanConn) OnEOF(c *zc.Conn, err error) {
	if h.role == rolePub {
		// The end of the stream: every subscriber closes once its queue is out.
		h.f.fo.Close()
		for _, s := range h.f.subs {
			s.Close()
		}
	}
	c.Close()
}

func (h *fanConn) OnClose(c *zc.Conn, err error) { h.f.done() }

// fanoutZC is the fan-out server in zc's event-loop style with zc's default Config: the
// publisher's Data is parsed in OnData and its whole messages published to every
// subscriber through a FanOut (zcFanout).
func fanoutZC(c harness.Case, m *harness.Meter, ready func(string)) error {
	e, err := zc.New(zcConfig())
	if err != nil {
		return err
	}
	defer e.Close()
	fail := newFirstErr()
	var wg sync.WaitGroup
	wg.Add(c.Conns + 1)
	fo, err := zc.NewFanOut(zc.FanOutOptions{Policy: zc.FanOutDrop, MaxQueued: SubBacklog})
	if err != nil {
		return err
	}
	f := &zcFanout{size: c.Size, fo: fo, m: m, done: wg.Done, fail: fail.set}
	var accepted atomic.Int32
	l, err := e.Listen("tcp", c.Addr, func(conn *zc.Conn) zc.Handler {
		if accepted.Add(1) > int32(c.Conns+1) {
			return nil
		}
		return &fanConn{f: f}
	})
	if err != nil {
		return err
	}
	ready(l.Addr().String())
	wg.Wait()
	m.Stop()
	l.Close()
	m.Note("dropped", strconv.FormatUint(fo.Stats().Drops, 10))
	return fail.get()
}

// fanoutClient opens c.Conns subscribers (SlowSubscribers of them pause regularly), then
// the publisher, which sends messages of c.Size bytes through a bufio.Writer until the
// run's time is up and closes; every subscriber reads to its EOF and checks every
// message: sequence numbers rising (drops are the policy), payload intact.
func fanoutClient(ctx context.Context, c harness.Case, m *harness.Meter) error {
	if c.Size < fanHdr+fanTrl+1 {
		return fmt.Errorf("fan-out messages of %d bytes: at least %d", c.Size, fanHdr+fanTrl+1)
	}
	payload := fanPayload(c.Size)
	subs := make([]*net.TCPConn, c.Conns)
	ack := make([]byte, 1)
	for i := range subs {
		conn, err := dialNet(ctx, c.Addr)
		if err != nil {
			return fmt.Errorf("subscriber %d of %d: %w", i+1, c.Conns, err)
		}
		defer conn.Close()
		subs[i] = conn
		if _, err := conn.Write([]byte{roleSub}); err != nil {
			return err
		}
		if _, err := io.ReadFull(conn, ack); err != nil || ack[0] != subAck {
			return fmt.Errorf("subscriber %d: no registration (%v)", i+1, err)
		}
	}
	pub, err := dialNet(ctx, c.Addr)
	if err != nil {
		return fmt.Errorf("publisher: %w", err)
	}
	defer pub.Close()
	var open closers
	for _, s := range subs {
		open.add(s)
	}
	open.add(pub)
	fail := newFirstErr()
	fail.onErr = open.closeAll
	var wg sync.WaitGroup
	slow := SlowSubscribers(c.Conns)
	probe := make(chan uint64, 1) // the last burst's end the probe subscriber got
	for i, conn := range subs {
		var p chan uint64
		if i == len(subs)-1 {
			p = probe
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail.set(subscribe(conn, m, c.Size, payload, i < slow, p))
		}()
	}
	m.Start()
	bw := bufio.NewWriterSize(pub, 64<<10)
	msg := make([]byte, c.Size)
	binary.LittleEndian.PutUint32(msg, uint32(c.Size))
	copy(msg[fanHdr:], payload)
	if _, err := pub.Write([]byte{rolePub}); err != nil {
		return err
	}
	var seq uint64
	// At least one burst, however short the window: a publisher descheduled past a tiny
	// window (the tests' 50 ms on a loaded machine) published nothing, and the repetition
	// had no unit of work to measure.
	for seq < FanBurst || !m.Stopped() {
		binary.LittleEndian.PutUint64(msg[4:], seq)
		binary.LittleEndian.PutUint64(msg[c.Size-fanTrl:], seq)
		if int64(seq) == c.CorruptSeq {
			msg[fanHdr] ^= 0x40
		}
		if _, err := bw.Write(msg); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		if int64(seq) == c.CorruptSeq {
			copy(msg[fanHdr:], payload)
		}
		seq++
		if seq%FanBurst == 0 {
			if err := bw.Flush(); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			// Wait for the probe to get this burst (or anything later: it can drop
			// too; after a second without word, go on).
			deadline := time.After(time.Second)
		wait:
			for {
				select {
				case got := <-probe:
					if got+1 >= seq {
						break wait
					}
				case <-deadline:
					break wait
				}
			}
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	pub.CloseWrite()
	wg.Wait()
	m.Stop()
	m.Note("published", strconv.FormatUint(seq, 10))
	return fail.get()
}

// subscribe reads and checks one subscriber's messages to its EOF; a probe (probe not
// nil) reports the sequence number of every message that ends a burst.
func subscribe(conn *net.TCPConn, m *harness.Meter, size int, payload []byte, slow bool, probe chan uint64) error {
	br := bufio.NewReaderSize(conn, 64<<10)
	msg := make([]byte, size)
	var got uint64
	next := uint64(0) // the lowest sequence number the next message may have
	defer func() { m.Count(got, got*uint64(size)) }()
	for {
		if _, err := io.ReadFull(br, msg); err != nil {
			if err == io.EOF {
				return nil
			}
			return fmt.Errorf("%w: subscriber: stream ended inside a message after %d messages: %v", frame.ErrCorrupt, got, err)
		}
		seq := binary.LittleEndian.Uint64(msg[4:])
		switch {
		case binary.LittleEndian.Uint32(msg) != uint32(size):
			return fmt.Errorf("%w: subscriber: message size %d, want %d", frame.ErrCorrupt, binary.LittleEndian.Uint32(msg), size)
		case seq < next || binary.LittleEndian.Uint64(msg[size-fanTrl:]) != seq:
			return fmt.Errorf("%w: subscriber: message %d after %d (trailer %d)", frame.ErrCorrupt, seq, next, binary.LittleEndian.Uint64(msg[size-fanTrl:]))
		case !bytes.Equal(msg[fanHdr:size-fanTrl], payload):
			return fmt.Errorf("%w: subscriber: message %d: payload damaged", frame.ErrCorrupt, seq)
		}
		next = seq + 1
		got++
		if probe != nil && seq%FanBurst == FanBurst-1 {
			select {
			case probe <- seq:
			default:
				select { // replace an older report
				case <-probe:
				default:
				}
				probe <- seq
			}
		}
		if slow && !m.Stopped() {
			time.Sleep(slowPause)
		}
	}
}
