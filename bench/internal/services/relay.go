package services

import (
	"cmp"
	"context"
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

// relayNet is the relay Go users write: a goroutine per direction, io.Copy between the
// two *net.TCPConns (the kernel splices: no user copy), CloseWrite when a direction ends,
// both closed when both ended.
func relayNet(ctx context.Context, c harness.Case, m *harness.Meter, ready func(string)) error {
	return serveNet(ctx, c, m, ready, func(front *net.TCPConn) error {
		back, err := dialNet(ctx, c.Backend)
		if err != nil {
			return err
		}
		defer back.Close()
		errs := make(chan error, 2)
		pipe := func(dst, src *net.TCPConn) {
			_, err := io.Copy(dst, src)
			dst.CloseWrite()
			errs <- err
		}
		go pipe(back, front)
		go pipe(front, back)
		return cmp.Or(<-errs, <-errs)
	})
}

// zcRelay joins a relay's two connections: the one function to switch when zc offers a
// cheaper forwarding path (splice through the ring).
var zcRelay = func(front, back *zc.Conn) error {
	_, err := zc.Relay(front, back)
	return err
}

// relayZC is the relay zc's Example_relay teaches: accept, pause the front until the
// backend is connected, DialAsync the backend, zc.Relay both ways from DialAsync's done
// function.
func relayZC(ctx context.Context, c harness.Case, m *harness.Meter, ready func(string)) error {
	e, err := zc.New(zcConfig())
	if err != nil {
		return err
	}
	defer e.Close()
	fail := newFirstErr()
	var wg sync.WaitGroup
	wg.Add(c.Conns)
	var accepted atomic.Int32
	l, err := e.Listen("tcp", c.Addr, func(front *zc.Conn) zc.Handler {
		if accepted.Add(1) > int32(c.Conns) {
			return nil // not ours
		}
		m.Start()
		front.SetReceivePaused(true) // until the backend is connected
		err := e.DialAsync(ctx, "tcp", c.Backend, zc.HandlerFuncs{}, func(back *zc.Conn, err error) {
			if err == nil {
				err = zcRelay(front, back)
			}
			if err != nil {
				fail.set(fmt.Errorf("relay: %w", err))
				front.Close()
				wg.Done()
				return
			}
			go func() { <-front.Done(); <-back.Done(); wg.Done() }()
		})
		if err != nil {
			fail.set(err)
			wg.Done()
			return nil
		}
		return zc.HandlerFuncs{}
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

// relayClient drives a relay: it runs the backend (listening at c.Backend) and c.Conns
// clients; on each connection the client and the backend send c.Total bytes of frames
// each way at once and check everything they receive, to the last frame (Relay); or the
// backend answers first, half-closes and then reads the whole upload (RelayHalfClose).
func relayClient(ctx context.Context, c harness.Case, m *harness.Meter) error {
	return relayClientDial(ctx, c, m, func(ctx context.Context) (halfCloser, error) { return dialNet(ctx, c.Addr) })
}

// halfCloser is a connection that can end its sending side alone: *net.TCPConn, and the
// TLS connections of relay-tls (*tls.Conn: close_notify, then a shutdown).
type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// relayClientDial is relayClient with the client connections from dial (relay-tls: TLS
// clients); the backend is plain TCP.
func relayClientDial(ctx context.Context, c harness.Case, m *harness.Meter, dial func(context.Context) (halfCloser, error)) error {
	frames := uint64(max(1, c.Total/int64(c.Size)))
	hc := c.Scenario == harness.RelayHalfClose
	bl, err := listenNet(ctx, c.Backend)
	if err != nil {
		return fmt.Errorf("backend: %w", err)
	}
	defer bl.Close()
	var open closers
	defer open.closeAll()
	open.add(bl)
	fail := newFirstErr()
	fail.onErr = open.closeAll
	var pause maxGap
	defer func() { m.Note("longest_pause_ms", pause.ms()) }()
	var wg sync.WaitGroup
	// The backend.
	wg.Add(c.Conns)
	go func() {
		for i := range c.Conns {
			bc, err := bl.AcceptTCP()
			if err != nil {
				fail.set(fmt.Errorf("backend accept: %w", err))
				for range c.Conns - i {
					wg.Done()
				}
				return
			}
			open.add(bc)
			go func() {
				defer wg.Done()
				defer bc.Close()
				if hc {
					// Answer, half-close, then read the upload to its end.
					if err := sendFrames(bc, m, c.Size, frames); err != nil {
						fail.set(fmt.Errorf("backend send: %w", err))
						return
					}
					bc.CloseWrite()
					fail.set(recvFrames(bc, m, c.Size, frames, "upload", &pause))
					return
				}
				fail.set(both(bc, m, c.Size, frames, "upload", &pause))
			}()
		}
	}()
	conns := make([]halfCloser, c.Conns)
	for i := range conns {
		if conns[i], err = dial(ctx); err != nil {
			fail.set(fmt.Errorf("connection %d of %d: %w", i+1, c.Conns, err))
			wg.Wait()
			return fail.get()
		}
		open.add(conns[i])
	}
	m.Start()
	wg.Add(c.Conns)
	for _, cc := range conns {
		go func() {
			defer wg.Done()
			if hc {
				// The answer to its end (the relay passed the backend's FIN on), then
				// the upload.
				if err := recvFrames(cc, m, c.Size, frames, "download", &pause); err != nil {
					fail.set(err)
					return
				}
				if err := sendFrames(cc, m, c.Size, frames); err != nil {
					fail.set(fmt.Errorf("upload after the backend's FIN: %w", err))
					return
				}
				cc.CloseWrite()
				// The relay closes once both sides ended.
				_, _ = io.Copy(io.Discard, cc)
				return
			}
			fail.set(both(cc, m, c.Size, frames, "download", &pause))
		}()
	}
	wg.Wait()
	m.Stop()
	return fail.get()
}

// both sends frames on c and receives as many at the same time.
func both(c halfCloser, m *harness.Meter, size int, frames uint64, what string, pause *maxGap) error {
	sent := make(chan error, 1)
	go func() {
		err := sendFrames(c, m, size, frames)
		if err == nil {
			err = c.CloseWrite()
		}
		sent <- err
	}()
	err := recvFrames(c, m, size, frames, what, pause)
	return errors.Join(err, <-sent)
}

// sendFrames writes frames frames of size bytes.
func sendFrames(c halfCloser, m *harness.Meter, size int, frames uint64) error {
	src := m.NewSource()
	buf := make([]byte, size)
	src.Fill(buf)
	for range frames {
		src.Stamp(buf)
		if _, err := c.Write(buf); err != nil {
			return err
		}
		src.Sent()
	}
	return nil
}

// recvFrames checks the stream up to its EOF, which must come after exactly frames
// frames; pause keeps the longest wait for bytes once the first arrived.
func recvFrames(c halfCloser, m *harness.Meter, size int, frames uint64, what string, pause *maxGap) error {
	v := m.NewVerifier()
	buf := make([]byte, max(size, 64<<10))
	var last time.Time
	for {
		n, err := c.Read(buf)
		if now := time.Now(); n > 0 {
			if !last.IsZero() {
				pause.add(now.Sub(last))
			}
			last = now
		}
		if n > 0 {
			if ferr := v.Feed(buf[:n]); ferr != nil {
				return fmt.Errorf("%s: %w", what, ferr)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%s after %d of %d frames: %w", what, v.Frames(), frames, err)
		}
	}
	if err := v.Close(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if v.Frames() != frames {
		return fmt.Errorf("%w: %s ended after %d of %d frames", frame.ErrCorrupt, what, v.Frames(), frames)
	}
	return nil
}

// maxGap keeps the longest of many durations (the longest a receiver waited for bytes in
// the middle of a stream: a stall shows there). Safe for concurrent use.
type maxGap struct{ ns atomic.Int64 }

func (g *maxGap) add(d time.Duration) {
	for {
		old := g.ns.Load()
		if int64(d) <= old || g.ns.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

func (g *maxGap) ms() string {
	return strconv.FormatFloat(float64(g.ns.Load())/1e6, 'f', 1, 64)
}
