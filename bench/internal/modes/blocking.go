// Package modes holds zcbench's modes: "net" (Go net.Conn, a goroutine per
// connection), "syscall" (blocking send/recv on raw file descriptors), "netpoll"
// (cloudwego/netpoll's event loop and nocopy API), and the zc modes (zc.go, zcnet.go).
// net, syscall and zc-net (zc's net.Conn face) share the blocking loops of this file.
package modes

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// stream is a blocking byte stream: Read returns what is there (at least one byte) or
// an error, io.EOF at the end; Write writes everything or fails.
type stream interface {
	io.Reader
	io.Writer
	io.Closer
}

type listener interface {
	Accept() (stream, error)
	Addr() string
	Close() error
}

// serve is the server side of every scenario over blocking streams.
func serve(c harness.Case, m *harness.Meter, ln listener, ready func(string)) error {
	defer ln.Close()
	ready(ln.Addr())
	conns := make([]stream, 0, c.Conns)
	for range c.Conns {
		s, err := ln.Accept()
		if err != nil {
			for _, s := range conns {
				s.Close()
			}
			return fmt.Errorf("accept: %w", err)
		}
		conns = append(conns, s)
	}
	ln.Close()
	return forEach(conns, func(s stream) error {
		defer s.Close()
		if c.Scenario.RequestResponse() {
			return echoServer(c, m, s)
		}
		return sink(c, m, s)
	})
}

// sink reads a one-way stream to its end.
func sink(c harness.Case, m *harness.Meter, s stream) error {
	v := m.NewVerifier()
	buf := make([]byte, c.RecvBuf)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if ferr := v.Feed(buf[:n]); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			return v.Close()
		}
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
	}
}

// echoServer sends every request back.
func echoServer(c harness.Case, m *harness.Meter, s stream) error {
	v := m.NewVerifier()
	buf := make([]byte, c.Size)
	for {
		if _, err := io.ReadFull(s, buf); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return v.Close()
			}
			return fmt.Errorf("read request: %w", err)
		}
		if err := v.Feed(buf); err != nil {
			return err
		}
		if _, err := s.Write(buf); err != nil {
			return fmt.Errorf("write response: %w", err)
		}
	}
}

// drive is the client side of every scenario over blocking streams; wbuf > 0 buffers the
// one-way senders' writes (source).
func drive(c harness.Case, m *harness.Meter, wbuf int, dial func() (stream, error)) error {
	conns := make([]stream, 0, c.Conns)
	for range c.Conns {
		s, err := dial()
		if err != nil {
			for _, s := range conns {
				s.Close()
			}
			return fmt.Errorf("dial %s: %w", c.Addr, err)
		}
		conns = append(conns, s)
	}
	m.Start()
	return forEach(conns, func(s stream) error {
		defer s.Close()
		if c.Scenario.RequestResponse() {
			return echoClient(c, m, s)
		}
		return source(c, m, s, wbuf)
	})
}

// source sends frames back to back until the meter says stop (at least one); FileSend
// sends the file instead. With wbuf > 0 (net-buf, syscall-buf) every write goes through a
// bufio.Writer of wbuf bytes. Otherwise the small-message stream over a net.Conn goes
// through a bufio.Writer of its default 4 KiB, as net.Conn users write many small
// messages, and raw sockets (syscall) and bulk writes make one write(2) per frame.
func source(c harness.Case, m *harness.Meter, s stream, wbuf int) error {
	if c.Scenario == harness.FileSend {
		return harness.SendFile(c, m, s)
	}
	var w io.Writer = s
	var bw *bufio.Writer
	if _, isNetConn := s.(net.Conn); wbuf > 0 {
		bw = bufio.NewWriterSize(s, wbuf)
		w = bw
	} else if isNetConn && c.Scenario == harness.Stream {
		bw = bufio.NewWriter(s)
		w = bw
	}
	src := m.NewSource()
	buf := make([]byte, c.Size)
	src.Fill(buf)
	for {
		src.Stamp(buf)
		if _, err := w.Write(buf); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		// Buffered frames count as sent: the flush at the end hands them over, and the
		// receiver's count is the figure.
		src.Sent()
		if m.Stopped() {
			if bw != nil {
				if err := bw.Flush(); err != nil {
					return fmt.Errorf("flush: %w", err)
				}
			}
			return nil
		}
	}
}

// echoClient keeps one request in flight and times each round trip, until the meter
// says stop (at least one).
func echoClient(c harness.Case, m *harness.Meter, s stream) error {
	src := m.NewSource()
	v := m.NewVerifier()
	rec := m.NewRecorder()
	req := make([]byte, c.Size)
	resp := make([]byte, c.Size)
	src.Fill(req)
	for {
		src.Stamp(req)
		t0 := time.Now()
		if _, err := s.Write(req); err != nil {
			return fmt.Errorf("write request: %w", err)
		}
		src.Sent()
		if _, err := io.ReadFull(s, resp); err != nil {
			return fmt.Errorf("read response: %w", err)
		}
		rec.Add(time.Since(t0))
		if err := v.Feed(resp); err != nil {
			return err
		}
		if m.Stopped() {
			return nil
		}
	}
}

// forEach runs f on every stream in its own goroutine and returns the first error.
func forEach(conns []stream, f func(stream) error) error {
	if len(conns) == 1 {
		return f(conns[0])
	}
	var wg sync.WaitGroup
	errs := make([]error, len(conns))
	for i, s := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(s)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// registered holds modes added by this package's optional files (zc.go adds the
// zc modes); it is written only by init functions.
var registered []harness.Mode

// All returns every mode of this package.
func All() []harness.Mode {
	return append([]harness.Mode{Net{}, Net{Buf: UserBatch}, Syscall{}, Syscall{Buf: UserBatch}}, registered...)
}

// errs keeps the first error of many handlers.
type errs struct {
	mu  sync.Mutex
	err error
}

func (e *errs) set(err error) {
	e.mu.Lock()
	if e.err == nil {
		e.err = err
	}
	e.mu.Unlock()
}

func (e *errs) get() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}
