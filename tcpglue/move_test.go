package tcpglue

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestTryWriteOutQueue: TryWrite on a non-blocking socket takes what fits and then says 0
// with no error; OutQueue counts the bytes sent and not yet acknowledged (the peer never
// reads, so they stay); after Close both refuse with net.ErrClosed.
func TestTryWriteOutQueue(t *testing.T) {
	c, s := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{Nonblock: true})
	_ = s
	if _, err := c.SetSendBuffer(4096); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 64<<10)
	total := 0
	for range 1000 {
		n, err := c.TryWrite(p)
		if err != nil {
			t.Fatalf("TryWrite: %v", err)
		}
		if n == 0 {
			break
		}
		total += n
	}
	if n, err := c.TryWrite(p); n != 0 || err != nil {
		t.Fatalf("TryWrite on a full socket: %d, %v (want 0, nil)", n, err)
	}
	if total == 0 {
		t.Fatal("TryWrite took nothing")
	}
	q, err := c.OutQueue()
	if err != nil || q <= 0 || q > total {
		t.Fatalf("OutQueue = %d, %v (written %d)", q, err, total)
	}
	c.Close()
	if _, err := c.TryWrite(p); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("TryWrite after Close: %v", err)
	}
	if _, err := c.OutQueue(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("OutQueue after Close: %v", err)
	}
}

// TestSendFileSpliceFrom: SendFile sends a file's range and advances the offset, 0 at the
// file's end; SpliceFrom moves a pipe's bytes into the socket and says EAGAIN on an empty
// pipe; the peer reads exactly those bytes.
func TestSendFileSpliceFrom(t *testing.T) {
	c, s := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{Nonblock: true})
	data := bytes.Repeat([]byte("0123456789abcdef"), 1024)
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	off := int64(100)
	n, err := c.SendFile(int(f.Fd()), &off, 1000)
	if err != nil || n != 1000 || off != 1100 {
		t.Fatalf("SendFile: %d, %v, offset %d", n, err, off)
	}
	end := int64(len(data))
	if n, err := c.SendFile(int(f.Fd()), &end, 10); n != 0 || err != nil {
		t.Fatalf("SendFile at the end: %d, %v", n, err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if _, err := c.SpliceFrom(p[0], 100); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("SpliceFrom an empty pipe: %v", err)
	}
	unix.Write(p[1], []byte("spliced"))
	if n, err := c.SpliceFrom(p[0], 100); n != 7 || err != nil {
		t.Fatalf("SpliceFrom: %d, %v", n, err)
	}
	var ve *ValueError
	if _, err := c.SendFile(int(f.Fd()), &off, 0); !errors.As(err, &ve) || off != 1100 {
		t.Fatalf("SendFile of 0 bytes: %v (offset %d)", err, off)
	}
	if _, err := c.SpliceFrom(p[0], -1); !errors.As(err, &ve) {
		t.Fatalf("SpliceFrom of -1 bytes: %v", err)
	}
	if _, err := c.SpliceFrom(int(f.Fd()), 10); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("SpliceFrom a file that is no pipe: %v", err)
	}
	c.Shutdown(unix.SHUT_WR)
	got, err := io.ReadAll(readerOf(s))
	if err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{}, data[100:1100]...), "spliced"...)
	if !bytes.Equal(got, want) {
		t.Fatalf("the peer read %d bytes, want %d", len(got), len(want))
	}
	c.Close()
	if _, err := c.SendFile(int(f.Fd()), &off, 10); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("SendFile after Close: %v", err)
	}
	if _, err := c.SpliceFrom(p[0], 10); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("SpliceFrom after Close: %v", err)
	}
}

// TestWaitWritable: an empty send buffer is writable at once; a full one (the peer never
// reads) is not, and the bounded wait ends with false and no error; the peer's reading wakes
// a wait without a bound; a Close during a wait wakes it with net.ErrClosed, as does a wait
// after Close; a reset connection is an error matching unix.EPIPE.
func TestWaitWritable(t *testing.T) {
	c, s := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{Nonblock: true})
	if ok, err := c.WaitWritable(-1); !ok || err != nil {
		t.Fatalf("WaitWritable on an empty socket: %v, %v", ok, err)
	}
	fill := func(c *Socket) {
		t.Helper()
		p := make([]byte, 64<<10)
		for range 10000 {
			n, err := c.TryWrite(p)
			if err != nil {
				t.Fatalf("TryWrite: %v", err)
			}
			if n == 0 {
				return
			}
		}
		t.Fatal("the socket never filled")
	}
	if _, err := c.SetSendBuffer(4096); err != nil {
		t.Fatal(err)
	}
	fill(c)
	if ok, err := c.WaitWritable(20 * time.Millisecond); ok || err != nil {
		t.Fatalf("WaitWritable on a full socket: %v, %v (want false, nil)", ok, err)
	}
	done := make(chan error, 1)
	go func() {
		ok, err := c.WaitWritable(-1)
		if err == nil && !ok {
			err = errors.New("false without a bound")
		}
		done <- err
	}()
	go io.Copy(io.Discard, readerOf(s)) // the peer reads: room comes
	if err := <-done; err != nil {
		t.Fatalf("WaitWritable while the peer reads: %v", err)
	}

	// A Close during the wait wakes it.
	c2, s2 := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{Nonblock: true})
	if _, err := c2.SetSendBuffer(4096); err != nil {
		t.Fatal(err)
	}
	fill(c2)
	go func() {
		_, err := c2.WaitWritable(-1)
		done <- err
	}()
	for c2.refCount() == 0 {
		runtime.Gosched() // until the wait holds the descriptor
	}
	c2.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("WaitWritable woken by Close: %v", err)
	}
	if _, err := c2.WaitWritable(0); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("WaitWritable after Close: %v", err)
	}

	// The peer resets the connection.
	c3, s3 := pair(t, "tcp4", "127.0.0.1:0", ListenOptions{}, DialOptions{Nonblock: true})
	if _, err := c3.SetSendBuffer(4096); err != nil {
		t.Fatal(err)
	}
	fill(c3)
	if err := s3.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	s3.Close()
	if _, err := c3.WaitWritable(-1); !errors.Is(err, unix.EPIPE) {
		t.Fatalf("WaitWritable after the peer's reset: %v", err)
	}
	_ = s2
}

type sockReader struct{ s *Socket }

func (r sockReader) Read(p []byte) (int, error) { return r.s.Read(p) }

func readerOf(s *Socket) io.Reader { return sockReader{s} }

// TestDupV6Only: Dup gives a close-on-exec duplicate of the same socket; SetV6Only sets
// IPV6_V6ONLY both ways on an AF_INET6 socket.
func TestDupV6Only(t *testing.T) {
	s, err := NewSocket(unix.AF_INET6, false)
	if err != nil {
		t.Skipf("no IPv6: %v", err)
	}
	defer s.Close()
	for _, on := range []bool{true, false} {
		if err := s.SetV6Only(on); err != nil {
			t.Fatal(err)
		}
		v, err := s.getInt("get", unix.IPPROTO_IPV6, unix.IPV6_V6ONLY)
		if err != nil || (v != 0) != on {
			t.Fatalf("IPV6_V6ONLY = %d, %v, want %v", v, err, on)
		}
	}
	d, err := s.Dup()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(d)
	if fl, err := unix.FcntlInt(uintptr(d), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
		t.Fatalf("Dup: not close-on-exec (%v)", err)
	}
	if v, err := unix.GetsockoptInt(d, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY); err != nil || v != 0 {
		t.Fatalf("the duplicate is not the same socket: IPV6_V6ONLY %d, %v", v, err)
	}
	s.Close()
	if _, err := s.Dup(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Dup after Close: %v", err)
	}
}

// refCount is the number of calls holding the descriptor.
func (s *Socket) refCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refs
}
