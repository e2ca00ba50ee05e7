package services

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zcnet/zcnet/bench/internal/frame"
	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/zc"
)

// A file-streaming client asks for a slice of the file with one request: [offset u64]
// [length u64]; the server sends those bytes and closes.
const fileReq = 16

// filesNet is the file server Go users write: a goroutine per connection, the file
// opened for it, io.CopyN from the *os.File (sendfile: the kernel moves the pages).
func filesNet(ctx context.Context, c harness.Case, m *harness.Meter, ready func(string)) error {
	return serveNet(ctx, c, m, ready, func(conn *net.TCPConn) error {
		var req [fileReq]byte
		if _, err := io.ReadFull(conn, req[:]); err != nil {
			return fmt.Errorf("request: %w", err)
		}
		off, n := int64(binary.LittleEndian.Uint64(req[:])), int64(binary.LittleEndian.Uint64(req[8:]))
		f, err := os.Open(c.File)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyN(conn, f, n); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		return nil
	})
}

// zcFileSend queues up to n bytes of f from off on c and returns how many it queued: 0
// with a nil error when there is no room now (OnWritable comes when there is). It is the
// pattern zc's docs teach for files: Conn.SendFile queues the whole range (sendfile(2) from
// the queue goroutine as the socket takes it, the page cache never copied into user
// memory), in order with the connection's other sends.
var zcFileSend = func(c *zc.Conn, f *os.File, off, n int64, maxQueued int) (int64, error) {
	if err := c.SendFile(f, off, n); err != nil {
		return 0, err
	}
	return n, nil
}

// fileConn streams one client's slice from the queue goroutine: the request in OnData
// starts it, OnWritable keeps it going, Close once all is queued (the FIN follows it).
type fileConn struct {
	f         *os.File
	maxQueued int
	req       []byte
	off, left int64
	started   bool
	fail      func(error)
	done      func()
}

func (h *fileConn) OnData(c *zc.Conn, d zc.Data) {
	h.req = append(h.req, d.Bytes()...) // the request may arrive in pieces
	d.Release()
	if h.started || len(h.req) < fileReq {
		return
	}
	h.started = true
	h.off, h.left = int64(binary.LittleEndian.Uint64(h.req)), int64(binary.LittleEndian.Uint64(h.req[8:]))
	h.pump(c)
}

func (h *fileConn) OnWritable(c *zc.Conn) { h.pump(c) }

func (h *fileConn) pump(c *zc.Conn) {
	if !h.started || h.left == 0 {
		return
	}
	n, err := zcFileSend(c, h.f, h.off, h.left, h.maxQueued)
	h.off += n
	h.left -= n
	if err != nil {
		h.fail(err)
		c.Close()
		return
	}
	if h.left == 0 {
		c.Close()
	}
}

func (h *fileConn) OnEOF(c *zc.Conn, err error) {
	if !h.started || h.left > 0 {
		h.fail(fmt.Errorf("client left with %d bytes to send (%v)", h.left, err))
		c.Close()
	}
}

func (h *fileConn) OnClose(c *zc.Conn, err error) { h.done() }

// filesZC is the file server in zc's event-loop style (zcFileSend driven by OnWritable),
// one *os.File shared by every connection (ReadAt).
func filesZC(c harness.Case, m *harness.Meter, ready func(string)) error {
	f, err := os.Open(c.File)
	if err != nil {
		return err
	}
	defer f.Close()
	e, err := zc.New(zcConfig())
	if err != nil {
		return err
	}
	defer e.Close()
	fail := newFirstErr()
	var wg sync.WaitGroup
	wg.Add(c.Conns)
	maxQ := e.Config().MaxQueuedBytes
	var accepted atomic.Int32
	l, err := e.Listen("tcp", c.Addr, func(conn *zc.Conn) zc.Handler {
		if accepted.Add(1) > int32(c.Conns) {
			return nil
		}
		m.Start()
		return &fileConn{f: f, maxQueued: maxQ, fail: fail.set, done: wg.Done}
	})
	if err != nil {
		return err
	}
	ready(l.Addr().String())
	wg.Wait()
	m.Stop()
	l.Close()
	return fail.get()
}

// filesClient runs c.Conns clients at once, each asking for its share of c.Total bytes
// (whole frames, slices spread over the file) and checking every frame of it; a client
// that gets no byte for harness.StallTimeout fails the case.
func filesClient(ctx context.Context, c harness.Case, m *harness.Meter) error {
	return filesClientDial(ctx, c, m, func(ctx context.Context) (net.Conn, error) { return dialNet(ctx, c.Addr) })
}

// filesClientDial is filesClient with connections from dial (files-tls: TLS clients).
func filesClientDial(ctx context.Context, c harness.Case, m *harness.Meter, dial func(context.Context) (net.Conn, error)) error {
	st, err := os.Stat(c.File)
	if err != nil {
		return err
	}
	fileFrames := st.Size() / int64(c.Size)
	per := max(1, min(fileFrames, c.Total/int64(c.Size))/int64(c.Conns))
	conns := make([]net.Conn, c.Conns)
	for i := range conns {
		if conns[i], err = dial(ctx); err != nil {
			return fmt.Errorf("client %d of %d: %w", i+1, c.Conns, err)
		}
		defer conns[i].Close()
	}
	var open closers
	for _, c := range conns {
		open.add(c)
	}
	fail := newFirstErr()
	fail.onErr = open.closeAll
	var pause maxGap
	defer func() { m.Note("longest_pause_ms", pause.ms()) }()
	var wg sync.WaitGroup
	m.Start()
	for i, conn := range conns {
		first := (int64(i) * per) % max(1, fileFrames-per+1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail.set(fetch(conn, m, c.Size, first, per, &pause))
		}()
	}
	wg.Wait()
	m.Stop()
	return fail.get()
}

func fetch(conn net.Conn, m *harness.Meter, size int, first, frames int64, pause *maxGap) error {
	var req [fileReq]byte
	binary.LittleEndian.PutUint64(req[:], uint64(first*int64(size)))
	binary.LittleEndian.PutUint64(req[8:], uint64(frames*int64(size)))
	if _, err := conn.Write(req[:]); err != nil {
		return err
	}
	v, err := frame.NewVerifierAt(size, uint64(first), nil)
	if err != nil {
		return err
	}
	defer func() { m.Count(v.Frames(), v.Bytes()) }()
	buf := make([]byte, 256<<10)
	var last time.Time
	for {
		conn.SetReadDeadline(time.Now().Add(harness.StallTimeout))
		n, err := conn.Read(buf)
		if now := time.Now(); n > 0 {
			if !last.IsZero() {
				pause.add(now.Sub(last))
			}
			last = now
		}
		if n > 0 {
			if ferr := v.Feed(buf[:n]); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			break
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("stall: no byte for %v after %d of %d frames", harness.StallTimeout, v.Frames(), frames)
		}
		if err != nil {
			return err
		}
	}
	if err := v.Close(); err != nil {
		return err
	}
	if int64(v.Frames()) != frames {
		return fmt.Errorf("%w: file slice ended after %d of %d frames", frame.ErrCorrupt, v.Frames(), frames)
	}
	return nil
}
