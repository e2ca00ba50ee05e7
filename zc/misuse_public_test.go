package zc_test

// Programs written from README.md and `go doc ./zc` alone, as a user of the ReadSelf API,
// Conn.ReadFrom and the net.Conn face would write them, and the misuses such a user makes:
// every call must end in correct behaviour or a typed error, with no panic, hang, lost or
// duplicated byte, leaked descriptor or goroutine (issue 18, session 9 probe).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/caps"
	"github.com/zcnet/zcnet/zc/netconn"
)

// probeBound is how long any wait of these tests may take before the test fails with a
// goroutine dump: generous, never an assertion about speed.
const probeBound = 60 * time.Second

// within runs fn and fails the test (with every goroutine's stack) if it does not return
// within probeBound.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(probeBound):
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("%s: still waiting after %v\n%s", what, probeBound, buf[:n])
	}
}

func probeFDs() int {
	e, _ := os.ReadDir("/proc/self/fd")
	return len(e)
}

// probeLeaks records the descriptors and goroutines now and, at the test's end, waits (up to
// probeBound) for both to come back to those counts.
func probeLeaks(t *testing.T) {
	fds, gs := probeFDs(), runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(probeBound)
		for {
			f, g := probeFDs(), runtime.NumGoroutine()
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

func probeEngine(t *testing.T, cfg zc.Config) *zc.Engine {
	t.Helper()
	e, err := zc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// probeBackends runs fn on the io_uring and the plain backend (ReadSelf needs one of them).
func probeBackends(t *testing.T, fn func(t *testing.T, b zc.Backend)) {
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
			c.SetReadDeadline(time.Now().Add(probeBound))
			p, err := readFrame(r)
			if err != nil {
				s.end(err)
				return
			}
			c.SetWriteDeadline(time.Now().Add(probeBound))
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

// TestProbeS9FrameServer: many clients (more than the send pool serves at once: 4 buffers),
// some pipelining and reading late, some half-closing first, some resetting mid-request;
// every answer is checked byte by byte and every server goroutine returns.
func TestProbeS9FrameServer(t *testing.T) {
	probeBackends(t, func(t *testing.T, b zc.Backend) {
		probeLeaks(t)
		e := probeEngine(t, zc.Config{Queues: 1, Backend: b, NoFallback: true,
			SendBufSize: 4096, SendBufs: 2, SendPoolMax: 4 * 4096, MaxQueuedBytes: 8192})
		s := startFrameServer(t, e)
		const clients, reqs = 32, 12
		var wg sync.WaitGroup
		errc := make(chan error, clients)
		for i := 0; i < clients; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				errc <- frameClient(s.ln.Addr().String(), i, reqs)
			}(i)
		}
		within(t, "clients", wg.Wait)
		close(errc)
		for err := range errc {
			if err != nil {
				t.Error(err)
			}
		}
		within(t, "server goroutines", s.wait)
		t.Logf("ends: %v", s.ends)
		for k, n := range s.ends {
			if k == "deadline" || k == "closed" {
				t.Errorf("%d connections ended with %s: %v", n, k, s.ends)
			}
		}
		if err := s.ln.Close(); err != nil {
			t.Error(err)
		}
		within(t, "engine close", func() {
			if err := e.Close(); err != nil {
				t.Error(err)
			}
		})
	})
}

// frameClient runs one client of kind i%4: 0 one request at a time, 1 pipelines every
// request and reads the answers late, 2 pipelines and half-closes before reading,
// 3 resets in the middle of a request.
func frameClient(addr string, i, reqs int) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	rng := rand.New(rand.NewSource(int64(i)))
	msgs := make([][]byte, reqs)
	for j := range msgs {
		msgs[j] = make([]byte, 1+rng.Intn(20000))
		rng.Read(msgs[j])
	}
	check := func(j int, br *bufio.Reader) error {
		p, err := readFrame(br)
		if err != nil {
			return fmt.Errorf("client %d answer %d: %w", i, j, err)
		}
		if !bytes.Equal(p, frameAnswer(msgs[j])) {
			return fmt.Errorf("client %d answer %d: wrong bytes (%d, want %d)", i, j, len(p), len(msgs[j]))
		}
		return nil
	}
	br := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(probeBound))
	switch i % 4 {
	case 0:
		for j := range msgs {
			if err := writeFrame(c, msgs[j]); err != nil {
				return err
			}
			if err := check(j, br); err != nil {
				return err
			}
		}
	case 1, 2:
		werr := make(chan error, 1)
		go func() {
			for j := range msgs {
				if err := writeFrame(c, msgs[j]); err != nil {
					werr <- err
					return
				}
			}
			if i%4 == 2 {
				werr <- c.(*net.TCPConn).CloseWrite()
				return
			}
			werr <- nil
		}()
		if i%4 == 1 {
			time.Sleep(100 * time.Millisecond) // a slow reader: the server's writes wait
		}
		for j := range msgs {
			if err := check(j, br); err != nil {
				return err
			}
		}
		if err := <-werr; err != nil {
			return err
		}
		if i%4 == 2 {
			if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
				return fmt.Errorf("client %d: after the last answer %d bytes, %v; want EOF", i, n, err)
			}
		}
	case 3:
		for j := 0; j < 3; j++ {
			if err := writeFrame(c, msgs[j]); err != nil {
				return err
			}
			if err := check(j, br); err != nil {
				return err
			}
		}
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], 1000)
		c.Write(hdr[:])
		c.Write(msgs[3][:1])
		c.(*net.TCPConn).SetLinger(0)
	}
	return nil
}

// TestProbeS9EngineCloseMidTraffic: Engine.Close while every client is sending and reading;
// every server goroutine's Read or Write returns, each answer a client got is whole and
// right, and Close returns.
func TestProbeS9EngineCloseMidTraffic(t *testing.T) {
	probeBackends(t, func(t *testing.T, b zc.Backend) {
		probeLeaks(t)
		e := probeEngine(t, zc.Config{Queues: 2, Backend: b, NoFallback: true,
			SendBufSize: 4096, SendBufs: 2, SendPoolMax: 4 * 4096, CloseTimeout: time.Second})
		s := startFrameServer(t, e)
		const clients = 12
		var wg sync.WaitGroup
		var mu sync.Mutex
		answered := 0
		bad := []error{}
		started := make(chan struct{}, clients)
		for i := 0; i < clients; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				c, err := net.Dial("tcp", s.ln.Addr().String())
				if err != nil {
					mu.Lock()
					bad = append(bad, err)
					mu.Unlock()
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(probeBound))
				br := bufio.NewReader(c)
				msg := bytes.Repeat([]byte{byte(i)}, 3000+i)
				for j := 0; ; j++ {
					if j == 2 {
						started <- struct{}{}
					}
					if writeFrame(c, msg) != nil {
						return
					}
					p, err := readFrame(br)
					if err != nil {
						if errors.Is(err, os.ErrDeadlineExceeded) {
							mu.Lock()
							bad = append(bad, fmt.Errorf("client %d hangs: %w", i, err))
							mu.Unlock()
						}
						return
					}
					if !bytes.Equal(p, frameAnswer(msg)) {
						mu.Lock()
						bad = append(bad, fmt.Errorf("client %d: wrong answer %d", i, j))
						mu.Unlock()
						return
					}
					mu.Lock()
					answered++
					mu.Unlock()
				}
			}(i)
		}
		for i := 0; i < clients; i++ {
			select {
			case <-started:
			case <-time.After(probeBound):
				t.Fatal("clients did not start")
			}
		}
		within(t, "engine close", func() {
			err := e.Close()
			if err != nil && !errors.Is(err, zc.ErrCloseTimeout) {
				t.Errorf("Engine.Close: %v", err)
			}
		})
		within(t, "server goroutines", s.wait)
		within(t, "clients", wg.Wait)
		for _, err := range bad {
			t.Error(err)
		}
		t.Logf("%d answers; ends %v", answered, s.ends)
		for k := range s.ends {
			if k == "deadline" {
				t.Errorf("a server goroutine waited for its deadline: %v", s.ends)
			}
		}
	})
}

// probePeer is a Go net peer that reads everything a zc connection sends once go is
// closed (it does not read before, so a sender fills the socket buffers and waits).
type probePeer struct {
	ln   net.Listener
	conn chan net.Conn
	got  chan []byte
}

func newProbePeer(t *testing.T) *probePeer {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		// A small receive buffer (accepted sockets inherit it), so that a sender
		// waits for the peer well before MaxQueuedBytes.
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10)
		})
		return errors.Join(err, serr)
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p := &probePeer{ln: ln, conn: make(chan net.Conn, 1), got: make(chan []byte, 1)}
	go func() {
		c, err := ln.Accept()
		if err == nil {
			p.conn <- c
		}
	}()
	return p
}

// start reads the peer's side to EOF in the background; result returns what it read.
func (p *probePeer) start() {
	go func() {
		var b []byte
		select {
		case c := <-p.conn:
			c.SetReadDeadline(time.Now().Add(probeBound))
			b, _ = io.ReadAll(c)
			c.Close()
		case <-time.After(probeBound):
		}
		p.got <- b
	}()
}

func (p *probePeer) result(t *testing.T) []byte {
	select {
	case b := <-p.got:
		return b
	case <-time.After(2 * probeBound):
		t.Fatal("peer never finished")
		return nil
	}
}

// readAll reads the peer's side to EOF.
func (p *probePeer) readAll(t *testing.T) []byte {
	p.start()
	return p.result(t)
}

// probeSource is one kind of io.Reader a user copies into a *zc.Conn.
type probeSource struct {
	name string
	// open returns the reader over want's bytes, and a function that returns what the
	// reader still had after a copy stopped (to check that no byte was lost or sent twice).
	open func(t *testing.T, want []byte) (r io.Reader, rest func() []byte)
}

var probeSources = []probeSource{
	{"file", func(t *testing.T, want []byte) (io.Reader, func() []byte) {
		f, err := os.CreateTemp(t.TempDir(), "src")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if _, err := f.Write(want); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		return f, func() []byte {
			b, err := io.ReadAll(f) // from the offset the copy left
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}},
	{"tcp", func(t *testing.T, want []byte) (io.Reader, func() []byte) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				return
			}
			c.Write(want)
			c.Close()
		}()
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, func() []byte {
			c.SetReadDeadline(time.Now().Add(probeBound))
			b, err := io.ReadAll(c)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}},
	{"bytes", func(t *testing.T, want []byte) (io.Reader, func() []byte) {
		r := bytes.NewReader(want)
		return r, func() []byte { b, _ := io.ReadAll(r); return b }
	}},
}

// TestProbeS9ReadFrom: io.Copy into a *zc.Conn from a file, a TCP connection and a
// bytes.Reader, off the queues, on ReadSelf and event-loop connections: every byte arrives
// once; a write deadline that passes mid-copy stops it with os.ErrDeadlineExceeded, what
// it reported is what the peer gets, and the source holds exactly the rest.
func TestProbeS9ReadFrom(t *testing.T) {
	probeBackends(t, func(t *testing.T, b zc.Backend) {
		probeLeaks(t)
		e := probeEngine(t, zc.Config{Queues: 1, Backend: b, NoFallback: true, MaxQueuedBytes: 256 << 10,
			SocketOptions: func(s *tcpglue.Socket) error { _, err := s.SetSendBuffer(64 << 10); return err }})
		want := make([]byte, 3<<20)
		rand.New(rand.NewSource(1)).Read(want)
		for _, src := range probeSources {
			for _, self := range []bool{false, true} {
				for _, mode := range []string{"whole", "copyN", "deadline", "moved"} {
					name := fmt.Sprintf("%s/readself=%v/%s", src.name, self, mode)
					t.Run(name, func(t *testing.T) {
						peer := newProbePeer(t)
						c, err := e.Dial(context.Background(),
							"tcp", peer.ln.Addr().String(), zc.HandlerFuncs{}, zc.DialOptions{ReadSelf: self})
						if err != nil {
							t.Fatal(err)
						}
						defer c.Close()
						r, rest := src.open(t, want)
						var n int64
						switch mode {
						case "whole":
							peer.start()
							spliced := e.Stats().Send.BytesSpliced
							within(t, "copy", func() { n, err = io.Copy(c, r) })
							if err != nil || n != int64(len(want)) {
								t.Fatalf("io.Copy: %d, %v; want %d", n, err, len(want))
							}
							// A file and a socket go by sendfile or splice, even through
							// the wrappers their WriteTo hands to io.Copy.
							if d := e.Stats().Send.BytesSpliced - spliced; src.name != "bytes" && d != uint64(n) {
								t.Errorf("%d of %d bytes spliced", d, n)
							}
						case "copyN": // an io.LimitedReader: exactly that many, the rest left in the source
							peer.start()
							within(t, "copy", func() { n, err = io.CopyN(c, r, int64(len(want)/3+1)) })
							if err != nil || n != int64(len(want)/3+1) {
								t.Fatalf("io.CopyN: %d, %v; want %d", n, err, len(want)/3+1)
							}
						case "deadline": // passes while the copy waits for a peer that does not read
							c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
							within(t, "copy", func() { n, err = io.Copy(c, r) })
							if !errors.Is(err, os.ErrDeadlineExceeded) {
								t.Fatalf("io.Copy: %d, %v; want the deadline", n, err)
							}
							var ne net.Error
							if !errors.As(err, &ne) || !ne.Timeout() {
								t.Errorf("io.Copy's error %v is no timeout net.Error", err)
							}
						case "moved": // a far deadline, moved near while the copy waits
							c.SetWriteDeadline(time.Now().Add(time.Hour))
							go func() {
								time.Sleep(200 * time.Millisecond)
								c.SetWriteDeadline(time.Now())
							}()
							within(t, "copy", func() { n, err = io.Copy(c, r) })
							if !errors.Is(err, os.ErrDeadlineExceeded) {
								t.Fatalf("io.Copy: %d, %v; want the deadline", n, err)
							}
						}
						if err := c.Close(); err != nil {
							t.Fatal(err)
						}
						if mode == "deadline" || mode == "moved" {
							peer.start() // only now: the copy had to wait
						}
						got := peer.result(t)
						if int64(len(got)) != n || !bytes.Equal(got, want[:n]) {
							t.Fatalf("peer got %d bytes (equal to the source's first: %v), copy reported %d",
								len(got), bytes.Equal(got, want[:min(len(got), len(want))]), n)
						}
						if left := rest(); !bytes.Equal(left, want[n:]) {
							t.Fatalf("the source has %d bytes left, want %d (lost or sent twice)", len(left), int64(len(want))-n)
						}
						select {
						case <-c.Done():
						case <-time.After(probeBound):
							t.Fatal("connection never closed")
						}
					})
				}
			}
		}
		t.Logf("%+v", e.Stats().Send)
	})
}

// TestProbeS9CopyFromReadSelf: io.Copy out of a ReadSelf connection (Conn.Read as an
// io.Reader) into a buffer, and from one ReadSelf connection into another zc connection.
func TestProbeS9CopyFromReadSelf(t *testing.T) {
	probeBackends(t, func(t *testing.T, b zc.Backend) {
		probeLeaks(t)
		e := probeEngine(t, zc.Config{Queues: 1, Backend: b, NoFallback: true})
		want := make([]byte, 2<<20)
		rand.New(rand.NewSource(2)).Read(want)
		// A ReadSelf server copies everything it reads into a zc connection to a Go peer.
		peer := newProbePeer(t)
		copied := make(chan error, 1)
		var n int64
		ln, err := e.Listen("tcp", "127.0.0.1:0",
			func(c *zc.Conn) zc.Handler {
				go func() {
					defer c.Close()
					out, err := e.Dial(context.Background(), "tcp", peer.ln.Addr().String(), zc.HandlerFuncs{})
					if err != nil {
						copied <- err
						return
					}
					n, err = io.Copy(out, c)
					out.Close()
					copied <- err
				}()
				return zc.HandlerFuncs{}
			}, zc.ListenOptions{ReadSelf: true})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cl, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			cl.Write(want)
			cl.Close()
		}()
		got := peer.readAll(t)
		within(t, "copy", func() { err = <-copied })
		if err != nil || n != int64(len(want)) || !bytes.Equal(got, want) {
			t.Fatalf("copied %d (%v), peer got %d, equal %v", n, err, len(got), bytes.Equal(got, want))
		}

		// A ReadSelf client reads into a bytes.Buffer (its ReadFrom calls Conn.Read).
		srv, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		go func() {
			c, err := srv.Accept()
			if err == nil {
				c.Write(want)
				c.Close()
			}
		}()
		c, err := e.Dial(context.Background(), "tcp", srv.Addr().String(), zc.HandlerFuncs{}, zc.DialOptions{ReadSelf: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var buf bytes.Buffer
		within(t, "copy", func() { n, err = io.Copy(&buf, c) })
		if err != nil || !bytes.Equal(buf.Bytes(), want) {
			t.Fatalf("io.Copy from a ReadSelf Conn: %d, %v, equal %v", n, err, bytes.Equal(buf.Bytes(), want))
		}
	})
}

// probePair dials a ReadSelf zc connection (or an event-loop one) to a Go net listener and
// returns both ends.
func probePair(t *testing.T, e *zc.Engine, self bool) (*zc.Conn, net.Conn) {
	t.Helper()
	return probePairH(t, e, self, zc.HandlerFuncs{})
}

func probePairH(t *testing.T, e *zc.Engine, self bool, h zc.Handler) (*zc.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), h, zc.DialOptions{ReadSelf: self})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return c, p
}

// probeIs fails unless err matches want (nil: no error).
func probeIs(t *testing.T, what string, err, want error) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Errorf("%s: %v, want no error", what, err)
		}
		return
	}
	if !errors.Is(err, want) {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
}

// TestProbeS9Misuse: the calls a user gets wrong, each answered with a typed error or
// correct behaviour.
func TestProbeS9Misuse(t *testing.T) {
	probeBackends(t, func(t *testing.T, b zc.Backend) {
		probeLeaks(t)
		e := probeEngine(t, zc.Config{Queues: 1, Backend: b, NoFallback: true})
		buf := make([]byte, 16)

		t.Run("not readself", func(t *testing.T) {
			c, _ := probePair(t, e, false)
			_, err := c.Read(buf)
			probeIs(t, "Read", err, zc.ErrInvalid)
			probeIs(t, "SetReadDeadline", c.SetReadDeadline(time.Now()), zc.ErrInvalid)
			probeIs(t, "SetWriteDeadline", c.SetWriteDeadline(time.Now().Add(time.Hour)), nil)
		})

		t.Run("on the queue", func(t *testing.T) {
			c, p := probePair(t, e, true)
			type res struct {
				n   int
				err error
				rf  error
			}
			got := make(chan res, 3)
			onQueue := func() {
				n, err := c.Read(buf)
				_, rf := c.ReadFrom(bytes.NewReader([]byte("x")))
				got <- res{n, err, rf}
			}
			probeIs(t, "Post", c.Post(onQueue), nil)
			if _, err := c.AfterFunc(time.Millisecond, onQueue); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 2; i++ {
				var r res
				within(t, "posted Read", func() { r = <-got })
				probeIs(t, "Read on the queue", r.err, zc.ErrWouldBlock)
				probeIs(t, "ReadFrom on the queue", r.rf, zc.ErrInvalid)
			}
			// With bytes waiting, a Read on the queue takes them.
			p.Write([]byte("abc"))
			time.Sleep(20 * time.Millisecond)
			probeIs(t, "Post", c.Post(onQueue), nil)
			var r res
			within(t, "posted Read", func() { r = <-got })
			if r.err != nil || string(buf[:r.n]) != "abc" {
				t.Errorf("Read on the queue with bytes waiting: %q, %v", buf[:r.n], r.err)
			}
			if c.OnQueue() {
				t.Error("OnQueue on the test goroutine")
			}
			// From an accept function, and from another connection's OnData.
			ln, err := e.Listen("tcp", "127.0.0.1:0",
				func(a *zc.Conn) zc.Handler {
					n, err := a.Read(buf)
					_, rf := a.ReadFrom(bytes.NewReader([]byte("x")))
					got <- res{n, err, rf}
					a.Close()
					return zc.HandlerFuncs{}
				}, zc.ListenOptions{ReadSelf: true})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			_, ep := probePairH(t, e, false, zc.HandlerFuncs{Data: func(_ *zc.Conn, d zc.Data) {
				d.Release()
				onQueue()
			}})
			ep.Write([]byte("go"))
			pc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			for i := 0; i < 2; i++ {
				var r res
				within(t, "Read in a handler", func() { r = <-got })
				probeIs(t, "Read in a handler", r.err, zc.ErrWouldBlock)
				probeIs(t, "ReadFrom in a handler", r.rf, zc.ErrInvalid)
			}
		})

		t.Run("readself refusals", func(t *testing.T) {
			c, p := probePair(t, e, true)
			err := c.SetReceivePaused(true)
			t.Logf("SetReceivePaused on ReadSelf: %v", err)
			err = c.SetHandler(zc.HandlerFuncs{})
			t.Logf("SetHandler on ReadSelf: %v", err)
			probeIs(t, "SetHandler(nil)", c.SetHandler(nil), zc.ErrInvalid)
			// SendFile sends on a ReadSelf connection like on any other.
			f, err := os.CreateTemp(t.TempDir(), "f")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			f.WriteString("file bytes")
			probeIs(t, "SendFile", c.SendFile(f, 0, 10), nil)
			p.SetReadDeadline(time.Now().Add(probeBound))
			got := make([]byte, 10)
			if _, err := io.ReadFull(p, got); err != nil || string(got) != "file bytes" {
				t.Errorf("SendFile on ReadSelf: %q, %v", got, err)
			}
			// Reading still works after those.
			p.Write([]byte("after"))
			c.SetReadDeadline(time.Now().Add(probeBound))
			n, err := io.ReadFull(c, buf[:5])
			if err != nil || string(buf[:n]) != "after" {
				t.Errorf("Read after the refusals: %q, %v", buf[:n], err)
			}
			// Relay is refused (the application reads c) and changes nothing: both stay
			// open until closed.
			c2, _ := probePair(t, e, false)
			_, err = zc.Relay(c, c2)
			probeIs(t, "Relay", err, zc.ErrInvalid)
			select {
			case <-c.Done():
				t.Error("a refused Relay closed the ReadSelf connection")
			case <-c2.Done():
				t.Error("a refused Relay closed the other connection")
			default:
			}
			c.Close()
			c2.Close()
			within(t, "closes", func() { <-c.Done(); <-c2.Done() })
		})

		t.Run("closewrite", func(t *testing.T) {
			// Our side half-closed: the peer sees EOF, and what it sends is still read.
			c, p := probePair(t, e, true)
			probeIs(t, "CloseWrite", c.CloseWrite(), nil)
			p.SetReadDeadline(time.Now().Add(probeBound))
			if n, err := p.Read(buf); n != 0 || err != io.EOF {
				t.Errorf("peer after CloseWrite: %d, %v", n, err)
			}
			p.Write([]byte("late"))
			p.Close()
			c.SetReadDeadline(time.Now().Add(probeBound))
			got, err := io.ReadAll(c)
			if err != nil || string(got) != "late" {
				t.Errorf("Read after CloseWrite: %q, %v", got, err)
			}
			_, err = c.Write([]byte("x"))
			if err == nil {
				t.Error("Write after CloseWrite succeeded")
			}
			t.Logf("Write after CloseWrite: %v", err)
		})

		t.Run("nil and zero", func(t *testing.T) {
			c, p := probePair(t, e, true)
			n, err := c.Read(nil)
			if n != 0 || err != nil {
				t.Errorf("Read(nil): %d, %v", n, err)
			}
			n, err = c.Read(buf[:0])
			if n != 0 || err != nil {
				t.Errorf("Read(empty): %d, %v", n, err)
			}
			var rn int64
			within(t, "ReadFrom(nil)", func() { rn, err = c.ReadFrom(nil) })
			probeIs(t, "ReadFrom(nil)", err, zc.ErrInvalid)
			_ = rn
			within(t, "ReadFrom(empty)", func() { rn, err = c.ReadFrom(bytes.NewReader(nil)) })
			if rn != 0 || err != nil {
				t.Errorf("ReadFrom(empty): %d, %v", rn, err)
			}
			var nilFile *os.File
			within(t, "ReadFrom(nil file)", func() { rn, err = c.ReadFrom(nilFile) })
			t.Logf("ReadFrom((*os.File)(nil)): %d, %v", rn, err)
			n, err = c.Write(nil)
			if n != 0 || err != nil {
				t.Errorf("Write(nil): %d, %v", n, err)
			}
			c.Wake(nil) // a nil channel: nothing to wake, must not block
			probeIs(t, "AfterFunc(nil)", func() error { _, err := c.AfterFunc(0, nil); return err }(), zc.ErrInvalid)
			// Nothing above sent or lost a byte.
			c.Write([]byte("end"))
			p.SetReadDeadline(time.Now().Add(probeBound))
			got := make([]byte, 3)
			if _, err := io.ReadFull(p, got); err != nil || string(got) != "end" {
				t.Errorf("the stream after the nil calls: %q, %v", got, err)
			}
		})

		t.Run("deadlines", func(t *testing.T) {
			c, p := probePair(t, e, true)
			for _, d := range []time.Time{time.Unix(0, 0), time.Unix(1, 0), time.Now().Add(-time.Hour), time.Time{}.Add(1)} {
				c.SetReadDeadline(d)
				var err error
				within(t, "Read past deadline", func() { _, err = c.Read(buf) })
				probeIs(t, fmt.Sprintf("Read with the deadline %v", d), err, os.ErrDeadlineExceeded)
				c.SetWriteDeadline(d)
				_, err = c.Write([]byte("x"))
				probeIs(t, fmt.Sprintf("Write with the deadline %v", d), err, os.ErrDeadlineExceeded)
				within(t, "ReadFrom past deadline", func() { _, err = c.ReadFrom(bytes.NewReader([]byte("y"))) })
				probeIs(t, fmt.Sprintf("ReadFrom with the deadline %v", d), err, os.ErrDeadlineExceeded)
			}
			for _, d := range []time.Time{time.Unix(1<<62, 0), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), {}} {
				c.SetReadDeadline(d)
				c.SetWriteDeadline(d)
				p.Write([]byte("z"))
				var n int
				var err error
				within(t, "Read far deadline", func() { n, err = c.Read(buf) })
				if n != 1 || err != nil {
					t.Errorf("Read with the deadline %v: %d, %v", d, n, err)
				}
				if _, err := c.Write([]byte("w")); err != nil {
					t.Errorf("Write with the deadline %v: %v", d, err)
				}
			}
			p.SetReadDeadline(time.Now().Add(probeBound))
			got := make([]byte, 3)
			if _, err := io.ReadFull(p, got); err != nil || string(got) != "www" {
				t.Errorf("the peer got %q, %v; want www (nothing written after a passed deadline)", got, err)
			}
			// A deadline moved while a Read waits.
			c.SetReadDeadline(time.Now().Add(time.Hour))
			go func() {
				time.Sleep(50 * time.Millisecond)
				c.SetReadDeadline(time.Now())
			}()
			var err error
			within(t, "Read with a moved deadline", func() { _, err = c.Read(buf) })
			probeIs(t, "Read with a moved deadline", err, os.ErrDeadlineExceeded)
		})

		t.Run("concurrent reads", func(t *testing.T) {
			c, p := probePair(t, e, true)
			const total = 1 << 20
			var hist [2][256]int
			var counts [2]int
			var wg sync.WaitGroup
			for r := 0; r < 2; r++ {
				wg.Add(1)
				go func(r int) {
					defer wg.Done()
					b := make([]byte, 1000+r*333)
					for {
						n, err := c.Read(b)
						for _, x := range b[:n] {
							hist[r][x]++
						}
						counts[r] += n
						if err != nil {
							return
						}
					}
				}(r)
			}
			want := make([]byte, total)
			for i := range want {
				want[i] = byte(i)
			}
			go func() {
				p.Write(want)
				p.(*net.TCPConn).CloseWrite()
			}()
			within(t, "concurrent reads", wg.Wait)
			if counts[0]+counts[1] != total {
				t.Fatalf("read %d+%d bytes, want %d", counts[0], counts[1], total)
			}
			for x := 0; x < 256; x++ {
				if hist[0][x]+hist[1][x] != total/256 {
					t.Fatalf("byte %d read %d times, want %d", x, hist[0][x]+hist[1][x], total/256)
				}
			}
		})

		t.Run("read and close", func(t *testing.T) {
			c, _ := probePair(t, e, true)
			var err error
			go func() {
				time.Sleep(50 * time.Millisecond)
				c.Close()
			}()
			within(t, "Read during Close", func() { _, err = c.Read(buf) })
			probeIs(t, "Read during Close", err, zc.ErrClosed)
			_, err = c.Read(buf)
			probeIs(t, "Read after Close", err, zc.ErrClosed)
			_, err = c.ReadFrom(bytes.NewReader([]byte("x")))
			probeIs(t, "ReadFrom after Close", err, zc.ErrClosed)
			_, err = c.Write([]byte("x"))
			probeIs(t, "Write after Close", err, zc.ErrClosed)
			probeIs(t, "SetReadDeadline after Close", c.SetReadDeadline(time.Now()), zc.ErrClosed)
			probeIs(t, "SetWriteDeadline after Close", c.SetWriteDeadline(time.Now()), zc.ErrClosed)
			probeIs(t, "second Close", c.Close(), zc.ErrClosed)
		})

		t.Run("write waits and close", func(t *testing.T) {
			// A ReadFrom and a Write waiting for a peer that does not read end at Close.
			c, _ := probePair(t, e, true)
			big := make([]byte, 64<<20)
			var werr, rerr error
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); _, werr = c.Write(big) }()
			go func() { defer wg.Done(); _, rerr = c.ReadFrom(bytes.NewReader(big)) }()
			time.Sleep(100 * time.Millisecond)
			c.Close()
			within(t, "writers at Close", wg.Wait)
			probeIs(t, "Write at Close", werr, zc.ErrClosed)
			probeIs(t, "ReadFrom at Close", rerr, zc.ErrClosed)
		})

		t.Run("after engine close", func(t *testing.T) {
			e2 := probeEngine(t, zc.Config{Queues: 1, Backend: b, NoFallback: true})
			c, p := probePair(t, e2, true)
			p.Write([]byte("kept"))
			time.Sleep(20 * time.Millisecond)
			var rerr error
			blocked := make(chan struct{})
			c2, _ := probePair(t, e2, true)
			go func() {
				defer close(blocked)
				_, rerr = c2.Read(buf)
			}()
			time.Sleep(20 * time.Millisecond)
			within(t, "Engine.Close", func() { e2.Close() })
			within(t, "Read at Engine.Close", func() { <-blocked })
			probeIs(t, "Read waiting at Engine.Close", rerr, zc.ErrClosed)
			n, err := io.ReadFull(c, buf[:4])
			if string(buf[:n]) != "kept" {
				t.Errorf("Read after Engine.Close: %q, %v; want what had arrived", buf[:n], err)
			}
			_, err = c.Read(buf)
			probeIs(t, "Read after that", err, zc.ErrClosed)
			_, err = c.ReadFrom(bytes.NewReader([]byte("x")))
			probeIs(t, "ReadFrom after Engine.Close", err, zc.ErrClosed)
			_, err = c.Write([]byte("x"))
			probeIs(t, "Write after Engine.Close", err, zc.ErrClosed)
			probeIs(t, "Post after Engine.Close", c.Post(func() {}), zc.ErrClosed)
			_, err = c.AfterFunc(time.Millisecond, func() {})
			probeIs(t, "AfterFunc after Engine.Close", err, zc.ErrClosed)
			c.Wake(make(chan struct{}, 1))
			_ = c.OnQueue()
			t.Logf("SetReadDeadline after Engine.Close: %v", c.SetReadDeadline(time.Now()))
			_, err = e2.Dial(context.Background(), "tcp", "127.0.0.1:1", zc.HandlerFuncs{}, zc.DialOptions{ReadSelf: true})
			probeIs(t, "Dial with options after Engine.Close", err, zc.ErrClosed)
			_, err = e2.Listen("tcp", "127.0.0.1:0", func(*zc.Conn) zc.Handler { return nil }, zc.ListenOptions{ReadSelf: true})
			probeIs(t, "Listen with options after Engine.Close", err, zc.ErrClosed)
		})
	})
}

// TestProbeS9NetFace: net/http over the net.Conn face (zc/netconn) on both ends (the server
// on netconn.Listen, the client's transport dialing with netconn.Dial), concurrent requests with every
// body checked, then Engine.Close under traffic: Serve returns, no goroutine is left.
// nettest.TestConn runs on one engine of one queue whose send pool serves a few buffers.
func TestProbeS9NetFace(t *testing.T) {
	probeBackends(t, func(t *testing.T, b zc.Backend) {
		probeLeaks(t)
		cfg := zc.Config{Queues: 1, Backend: b, NoFallback: true, SendBufSize: 16 << 10, SendBufs: 2, SendPoolMax: 64 << 10}
		t.Run("nettest", func(t *testing.T) {
			e := probeEngine(t, cfg)
			nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
				ln, err := netconn.Listen(e, "tcp", "127.0.0.1:0")
				if err != nil {
					return nil, nil, nil, err
				}
				acc := make(chan net.Conn, 1)
				go func() {
					c, _ := ln.Accept()
					acc <- c
				}()
				c1, err = netconn.Dial(context.Background(), e, "tcp", ln.Addr().String())
				if err != nil {
					ln.Close()
					return nil, nil, nil, err
				}
				c2 = <-acc
				ln.Close()
				if c2 == nil {
					c1.Close()
					return nil, nil, nil, errors.New("no accepted connection")
				}
				return c1, c2, func() { c1.Close(); c2.Close() }, nil
			})
		})
		t.Run("http", func(t *testing.T) {
			e := probeEngine(t, cfg)
			ln, err := netconn.Listen(e, "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			served := make(chan error, 1)
			go func() {
				served <- http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					body, _ := io.ReadAll(r.Body)
					w.Write(frameAnswer(body))
				}))
			}()
			tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return netconn.Dial(ctx, e, network, addr)
			}}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: probeBound}
			var wg sync.WaitGroup
			var failed sync.Map
			stop := make(chan struct{})
			twice := make(chan struct{}, 8)
			var closing atomic.Bool
			for i := 0; i < 8; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					rng := rand.New(rand.NewSource(int64(i)))
					for j := 0; ; j++ {
						select {
						case <-stop:
							return
						default:
						}
						req := make([]byte, rng.Intn(100000))
						rng.Read(req)
						resp, err := client.Post("http://"+ln.Addr().String()+"/", "application/octet-stream", bytes.NewReader(req))
						if err != nil {
							if !closing.Load() {
								failed.Store(fmt.Sprintf("client %d request %d", i, j), err)
							}
							return // the engine closed under it
						}
						if j == 1 {
							twice <- struct{}{}
						}
						got, err := io.ReadAll(resp.Body)
						resp.Body.Close()
						if err == nil && !bytes.Equal(got, frameAnswer(req)) {
							failed.Store(fmt.Sprintf("client %d request %d", i, j), "wrong body")
							return
						}
					}
				}(i)
			}
			for i := 0; i < 8; i++ {
				within(t, "first requests", func() { <-twice })
			}
			closing.Store(true)
			within(t, "Engine.Close", func() { e.Close() })
			close(stop)
			within(t, "http clients", wg.Wait)
			var serr error
			within(t, "http.Serve", func() { serr = <-served })
			if !errors.Is(serr, net.ErrClosed) {
				t.Errorf("http.Serve after Engine.Close: %v", serr)
			}
			failed.Range(func(k, v any) bool {
				t.Errorf("%v: %v", k, v)
				return true
			})
		})
	})
}
