package zc_test

// A length-prefixed frame server on ReadSelf connections, as a user writes it from the
// godoc: many clients each checked byte by byte, and Engine.Close under its traffic.

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
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zcnet/zcnet/zc"
)

// TestFrameServerManyClients: many clients (more than the send pool serves at once: 4 buffers),
// some pipelining and reading late, some half-closing first, some resetting mid-request;
// every answer is checked byte by byte and every server goroutine returns.
func TestFrameServerManyClients(t *testing.T) {
	eachBackend(t, func(t *testing.T, b zc.Backend) {
		checkLeaks(t)
		e := userEngine(t, zc.Config{Queues: 1, Backend: b, NoFallback: true,
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
	c.SetDeadline(time.Now().Add(userBound))
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

// TestEngineCloseMidTraffic: Engine.Close while every client is sending and reading;
// every server goroutine's Read or Write returns, each answer a client got is whole and
// right, and Close returns.
func TestEngineCloseMidTraffic(t *testing.T) {
	eachBackend(t, func(t *testing.T, b zc.Backend) {
		checkLeaks(t)
		e := userEngine(t, zc.Config{Queues: 2, Backend: b, NoFallback: true,
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
				c.SetDeadline(time.Now().Add(userBound))
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
			case <-time.After(userBound):
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
			c.SetReadDeadline(time.Now().Add(userBound))
			b, _ = io.ReadAll(c)
			c.Close()
		case <-time.After(userBound):
		}
		p.got <- b
	}()
}

func (p *probePeer) result(t *testing.T) []byte {
	select {
	case b := <-p.got:
		return b
	case <-time.After(2 * userBound):
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
			c.SetReadDeadline(time.Now().Add(userBound))
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
