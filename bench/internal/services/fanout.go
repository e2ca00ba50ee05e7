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

// FanSendBuf is the zc fan-out server's send buffer size (Config.SendBufSize).
const (
	FanSendBuf  = 16 << 10
	FanSendPool = 128 << 20 // its Config.SendPoolMax
)

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
				bw := bufio.NewWriter(s.conn)
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

// zcSub is a subscriber connection of the zc fan-out server.
type zcSub struct {
	conn    *zc.Conn
	pending []byte // the rest of a message Write could not take at once
}

// zcDeliver sends one message to one subscriber, or drops it (false) when the
// subscriber is SubBacklog behind: the one function to switch when zc can send one
// buffer to many connections (msg lies in the publisher's received Data, or in its
// carry buffer when it spanned two). Today's best: Write copies it into the subscriber's
// send buffers (coalesced with the messages before it while a send is in flight).
var zcDeliver = func(s *zcSub, msg []byte) bool {
	if len(s.pending) > 0 || s.conn.Queued() >= SubBacklog {
		return false
	}
	n, err := s.conn.Write(msg)
	if errors.Is(err, zc.ErrWouldBlock) {
		// No send buffer free right now: the rest goes out from OnWritable.
		s.pending = append(s.pending, msg[n:]...)
		return true
	}
	return err == nil
}

func (s *zcSub) OnWritable(c *zc.Conn) {
	if len(s.pending) == 0 {
		return
	}
	n, err := c.Write(s.pending)
	s.pending = append(s.pending[:0], s.pending[n:]...)
	if err != nil && !errors.Is(err, zc.ErrWouldBlock) {
		c.Close()
	}
}

// zcFanout is the zc fan-out server's state; its handlers all run on the one queue.
type zcFanout struct {
	size  int
	subs  []*zcSub
	carry []byte
	drops uint64
	m     *harness.Meter
	done  func()
	fail  func(error)
}

// fanConn is the handler of a connection before its role is known.
type fanConn struct {
	f    *zcFanout
	role byte
	sub  *zcSub
}

func (h *fanConn) OnData(c *zc.Conn, d zc.Data) {
	defer d.Release()
	b := d.Bytes()
	if h.role == 0 {
		h.role, b = b[0], b[1:]
		switch h.role {
		case roleSub:
			h.sub = &zcSub{conn: c}
			h.f.subs = append(h.f.subs, h.sub)
			if _, err := c.Write([]byte{subAck}); err != nil {
				h.f.fail(err)
				c.Close()
			}
			return
		case rolePub:
			h.f.m.Start()
		default:
			h.f.fail(fmt.Errorf("unknown role %q", h.role))
			c.Close()
			return
		}
	}
	if h.role == rolePub {
		h.f.publish(c, b)
	}
}

// publish forwards the whole messages of b (after what was carried over from the last
// Data) and carries a partial one over, copied, as a user does today.
func (f *zcFanout) publish(c *zc.Conn, b []byte) {
	if len(f.carry) > 0 {
		f.carry = append(f.carry, b...)
		b = f.carry
	}
	for len(b) >= 4 {
		n := int(binary.LittleEndian.Uint32(b))
		if n < fanHdr+fanTrl || n > 1<<20 {
			f.fail(fmt.Errorf("message size %d", n))
			c.Close()
			return
		}
		if len(b) < n {
			break
		}
		for _, s := range f.subs {
			if !zcDeliver(s, b[:n]) {
				f.drops++
			}
		}
		b = b[n:]
	}
	f.carry = append(f.carry[:0], b...) // copy: may overlap carry itself (copy handles it)
}

func (h *fanConn) OnEOF(c *zc.Conn, err error) {
	if h.role == rolePub {
		// The end of the stream: every subscriber closes once its queue is out.
		for _, s := range h.f.subs {
			s.conn.Close()
		}
	}
	c.Close()
}

func (h *fanConn) OnWritable(c *zc.Conn) {
	if h.sub != nil {
		h.sub.OnWritable(c)
	}
}

func (h *fanConn) OnClose(c *zc.Conn, err error) { h.f.done() }

// fanoutZC is the fan-out server in zc's event-loop style: the publisher's Data is
// parsed in OnData and each message handed to zcDeliver for every subscriber.
//
// Its engine has send buffers of 16 KiB (zc's default is 64 KiB) and a send pool cap of
// 128 MiB (default 32 MiB): Write stages each subscriber's messages in buffers of its
// own, and a thousand subscribers with a burst of 32 KiB waiting each need 32 MiB (with
// 64 KiB buffers, 64 MiB), so with the defaults most of them wait for buffers (the first
// runs delivered 1,500 messages per second); these two settings are what a user who read
// Stats.Send.PoolWaits would change. Go's net keeps the same bytes in socket buffers.
func fanoutZC(c harness.Case, m *harness.Meter, ready func(string)) error {
	cfg := zcConfig()
	if cfg.SendBufSize == 0 {
		cfg.SendBufSize = FanSendBuf
	}
	if cfg.SendPoolMax == 0 {
		cfg.SendPoolMax = FanSendPool
	}
	e, err := zc.New(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	fail := newFirstErr()
	var wg sync.WaitGroup
	wg.Add(c.Conns + 1)
	f := &zcFanout{size: c.Size, m: m, done: wg.Done, fail: fail.set}
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
	m.Note("dropped", strconv.FormatUint(f.drops, 10))
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
	for !m.Stopped() {
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
