package zc_test

// Helpers of zc's external tests that program the public API as a user would, from
// README.md and `go doc ./zc` alone (the ReadSelf API, Conn.ReadFrom, the net.Conn face):
// every call must end in correct behaviour or a typed error, with no panic, hang, lost or
// duplicated byte, leaked descriptor or goroutine.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/caps"
)

// userBound is how long any wait of these tests may take before the test fails with a
// goroutine dump: generous, never an assertion about speed.
const userBound = 60 * time.Second

// within runs fn and fails the test (with every goroutine's stack) if it does not return
// within userBound.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(userBound):
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("%s: still waiting after %v\n%s", what, userBound, buf[:n])
	}
}

func openFDs() int {
	e, _ := os.ReadDir("/proc/self/fd")
	return len(e)
}

// checkLeaks records the descriptors and goroutines now and, at the test's end, waits (up to
// userBound) for both to come back to those counts.
func checkLeaks(t *testing.T) {
	fds, gs := openFDs(), runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(userBound)
		for {
			f, g := openFDs(), runtime.NumGoroutine()
			if f <= fds && g <= gs {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				ents, _ := os.ReadDir("/proc/self/fd")
				var names []string
				for _, e := range ents {
					l, _ := os.Readlink("/proc/self/fd/" + e.Name())
					names = append(names, e.Name()+"->"+l)
				}
				tcp, _ := os.ReadFile("/proc/self/net/tcp")
				t.Errorf("leak: %d fds (before %d: now %v), %d goroutines (before %d)\n%s\n%s", f, fds, names, g, gs, tcp, buf[:n])
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func userEngine(t *testing.T, cfg zc.Config) *zc.Engine {
	t.Helper()
	e, err := zc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// eachBackend is zc.EachBackend, skipping io_uring where the kernel has none (ReadSelf needs
// io_uring or the plain backend).
func eachBackend(t *testing.T, fn func(t *testing.T, b zc.Backend)) {
	zc.EachBackend(t, func(t *testing.T, b zc.Backend) {
		if b == zc.BackendIOUring && caps.Probe().IOUring != nil {
			t.Skip("io_uring unavailable:", caps.Probe().IOUring)
		}
		fn(t, b)
	})
}

// frame answers: each payload byte plus one.
func frameAnswer(p []byte) []byte {
	q := make([]byte, len(p))
	for i, b := range p {
		q[i] = b + 1
	}
	return q
}

func writeFrame(w io.Writer, p []byte) error {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(p)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(p)
	return err
}

func readFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	p := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	_, err := io.ReadFull(r, p)
	return p, err
}

// frameServer serves length-prefixed requests on ReadSelf connections, one goroutine each,
// with bufio over Conn.Read and deadlines on both sides. served counts the goroutines
// still running; errs gets every error other than the ends a server expects.
type frameServer struct {
	ln      *zc.Listener
	served  sync.WaitGroup
	mu      sync.Mutex
	ends    map[string]int // how connections ended, by kind
	waiting bool
}

func startFrameServer(t *testing.T, e *zc.Engine) *frameServer {
	s := &frameServer{ends: map[string]int{}}
	serve := func(c *zc.Conn) {
		defer s.served.Done()
		defer c.Close()
		r := bufio.NewReaderSize(c, 4096)
		for {
			c.SetReadDeadline(time.Now().Add(userBound))
			p, err := readFrame(r)
			if err != nil {
				s.end(err)
				return
			}
			c.SetWriteDeadline(time.Now().Add(userBound))
			if err := writeFrame(c, frameAnswer(p)); err != nil {
				s.end(err)
				return
			}
		}
	}
	ln, err := e.Listen("tcp", "127.0.0.1:0",
		func(c *zc.Conn) zc.Handler {
			s.mu.Lock() // the race detector sees no order through the sockets
			s.served.Add(1)
			s.mu.Unlock()
			go serve(c)
			return zc.HandlerFuncs{}
		}, zc.ListenOptions{ReadSelf: true})
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln
	return s
}

// wait waits for every server goroutine.
func (s *frameServer) wait() {
	s.mu.Lock() // orders the accept functions' Add before Wait
	s.waiting = true
	s.mu.Unlock()
	s.served.Wait()
}

func (s *frameServer) end(err error) {
	var kind string
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF):
		kind = "eof"
	case errors.Is(err, io.ErrUnexpectedEOF):
		kind = "unexpected eof"
	case errors.Is(err, zc.ErrClosed):
		kind = "closed"
	case errors.Is(err, os.ErrDeadlineExceeded):
		kind = "deadline"
	case errors.As(err, &ne):
		kind = "net: " + err.Error()
	default:
		kind = fmt.Sprintf("%T: %v", err, err)
	}
	s.mu.Lock()
	s.ends[kind]++
	s.mu.Unlock()
}
