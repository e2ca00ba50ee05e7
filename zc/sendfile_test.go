package zc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// streamFile writes n bytes of the stream seeded with seed to a new file and returns it
// (open for reading) with its content.
func streamFile(t *testing.T, seed uint64, n int) (*os.File, []byte) {
	t.Helper()
	data := make([]byte, n)
	newStreamGen(seed).fill(data)
	path := filepath.Join(t.TempDir(), fmt.Sprintf("f%d", seed))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, data
}

// sendFileConn dials a Go net peer with h and returns the connection and the peer's side.
func sendFileConn(t *testing.T, cfg Config, h Handler) (*Engine, *Conn, net.Conn) {
	t.Helper()
	e := newEngine(t, cfg)
	c, p := dialPeer(t, e, h)
	return e, c, p
}

type writableCounter struct {
	HandlerFuncs
	n      atomic.Int64
	closed chan error
}

func (w *writableCounter) OnWritable(*Conn) { w.n.Add(1) }
func (w *writableCounter) OnClose(_ *Conn, err error) {
	if w.closed != nil {
		w.closed <- err
	}
}

// TestSendFileOrder: SendFile ranges interleaved with Write, Send and SendData-free sends
// arrive in the order they were queued, on every backend that runs here.
func TestSendFileOrder(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) { testSendFileOrder(t, Config{Backend: be, Queues: 1}, 1) })
}

func testSendFileOrder(t *testing.T, cfg Config, scale int) {
	f, data := streamFile(t, 1, 5<<20+123)
	_, c, p := sendFileConn(t, cfg, HandlerFuncs{})
	var want bytes.Buffer
	write := func(s string) {
		if _, err := c.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
		want.WriteString(s)
	}
	sendFile := func(off, n int64) {
		if err := c.SendFile(f, off, n); err != nil {
			t.Fatal(err)
		}
		want.Write(data[off : off+n])
	}
	write("head ")
	sendFile(10, 1000)
	b, err := c.BufferWait(0)
	if err != nil {
		t.Fatal(err)
	}
	k := copy(b.Bytes(), "sent buffer ")
	if err := c.Send(b, k); err != nil {
		t.Fatal(err)
	}
	want.WriteString("sent buffer ")
	sendFile(0, int64(len(data)))
	write("middle ")
	sendFile(4096, 1)
	sendFile(int64(len(data))-7, 7)
	write("tail")
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("got %d bytes, want %d; first difference at %d", len(got), want.Len(), firstDiff(got, want.Bytes()))
	}
	if st := c.e.Stats(); st.Send.BytesFile != uint64(1000+len(data)+1+7) {
		t.Errorf("Stats.Send.BytesFile %d", st.Send.BytesFile)
	}
}

// countSocketFDs counts the process's socket descriptors (a queue's watch epoll, made by the
// first wait and kept with the queue, is not one).
func countSocketFDs() int {
	e, _ := os.ReadDir("/proc/self/fd")
	n := 0
	for _, f := range e {
		if l, _ := os.Readlink("/proc/self/fd/" + f.Name()); strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestSendFileSlowReader: a 64 MiB file to a peer that waits, then reads slowly: every byte
// arrives, the queue counts the file against MaxQueuedBytes, and OnWritable follows the
// drain. The descriptor duplicated for the send is closed at the end.
func TestSendFileSlowReader(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) { testSendFileSlowReader(t, Config{Backend: be, Queues: 1}, 1) })
}

func testSendFileSlowReader(t *testing.T, cfg Config, scale int) {
	f, data := streamFile(t, 2, 64<<20/scale)
	h := &writableCounter{}
	_, c, p := sendFileConn(t, cfg, h)
	fds := countSocketFDs()
	if err := c.SendFile(f, 0, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if q := c.Queued(); q == 0 || q > len(data) {
		t.Errorf("Queued %d after SendFile of %d", q, len(data))
	}
	time.Sleep(100 * time.Millisecond)
	if err := checkStream(io.LimitReader(&slowReader{r: p}, int64(len(data))), 2, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for (h.n.Load() == 0 || countSocketFDs() > fds) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if h.n.Load() == 0 {
		t.Error("no OnWritable after the file drained")
	}
	if n := countSocketFDs(); n > fds {
		t.Errorf("%d sockets before sending, %d after: the duplicate stays", fds, n)
	}
}

// TestSendFileClosedMidSend: the caller closes its file right after SendFile: the bytes
// still go out (SendFile holds its own descriptor).
func TestSendFileClosedMidSend(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) { testSendFileClosedMidSend(t, Config{Backend: be, Queues: 1}, 1) })
}

func testSendFileClosedMidSend(t *testing.T, cfg Config, scale int) {
	f, data := streamFile(t, 3, 16<<20/scale)
	_, c, p := sendFileConn(t, cfg, HandlerFuncs{})
	if err := c.SendFile(f, 0, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c.CloseWrite()
	if err := checkStream(p, 3, int64(len(data))); err != nil {
		t.Fatal(err)
	}
}

// TestSendFileTruncated: the file shrinks while it is sent: the connection fails with an
// error matching io.ErrUnexpectedEOF and the peer sees a short stream. What remains of the
// file arrives intact; bytes past the new end that were in flight may have been zeroed by
// the truncation (sendfile sends page-cache pages by reference, as Go's net does).
func TestSendFileTruncated(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) { testSendFileTruncated(t, Config{Backend: be, Queues: 1}, 1) })
}

func testSendFileTruncated(t *testing.T, cfg Config, scale int) {
	f, data := streamFile(t, 4, 32<<20/scale)
	h := &writableCounter{closed: make(chan error, 1)}
	_, c, p := sendFileConn(t, cfg, h)
	if err := c.SendFile(f, 0, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f.Name(), 1<<20); err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(p) // a reset may end it
	keep := min(len(got), 1<<20)
	if len(got) >= len(data) || !bytes.Equal(got[:keep], data[:keep]) {
		t.Fatalf("peer got %d bytes (want a short stream, its first %d bytes the file's)", len(got), keep)
	}
	select {
	case err := <-h.closed:
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("OnClose(%v), want io.ErrUnexpectedEOF", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("connection not closed")
	}
}

// TestSendFileMisuse: bad arguments, closed files and closed connections are typed errors;
// nothing is queued and no descriptor leaks.
func TestSendFileMisuse(t *testing.T) { testSendFileMisuse(t, Config{Queues: 1}) }

func testSendFileMisuse(t *testing.T, cfg Config) {
	f, _ := streamFile(t, 5, 1000)
	closed, _ := streamFile(t, 6, 10)
	closed.Close()
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	// The stream file again, opened write-only and O_PATH: sendfile(2) cannot read either
	// (it failed later, in OnClose, with EBADF).
	wonly, err := os.OpenFile(f.Name(), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer wonly.Close()
	opath, err := os.OpenFile(f.Name(), unix.O_PATH, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer opath.Close()
	_, c, _ := sendFileConn(t, cfg, HandlerFuncs{})
	fds := countFDs()
	for _, tc := range []struct {
		name   string
		f      *os.File
		off, n int64
		want   []error
	}{
		{"nil file", nil, 0, 1, []error{ErrInvalid}},
		{"closed file", closed, 0, 1, []error{ErrInvalid, os.ErrClosed}},
		{"directory", dir, 0, 1, []error{ErrInvalid}},
		{"write-only file", wonly, 0, 1, []error{ErrInvalid}},
		{"O_PATH file", opath, 0, 1, []error{ErrInvalid}},
		{"negative offset", f, -1, 1, []error{ErrInvalid}},
		{"negative length", f, 0, -1, []error{ErrInvalid}},
		{"empty", f, 0, 0, []error{ErrEmpty}},
		{"beyond EOF", f, 500, 501, []error{ErrInvalid, io.ErrUnexpectedEOF}},
		{"offset beyond EOF", f, 2000, 1, []error{ErrInvalid, io.ErrUnexpectedEOF}},
	} {
		err := c.SendFile(tc.f, tc.off, tc.n)
		for _, w := range tc.want {
			if !errors.Is(err, w) {
				t.Errorf("%s: %v, want %v", tc.name, err, w)
			}
		}
	}
	if q := c.Queued(); q != 0 {
		t.Errorf("%d bytes queued by refused sends", q)
	}
	if n := countFDs(); n != fds {
		t.Errorf("%d descriptors before, %d after the refused sends", fds, n)
	}
	c.CloseWrite()
	if err := c.SendFile(f, 0, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("after CloseWrite: %v, want ErrClosed", err)
	}
	c.Close()
	<-c.Done()
	if err := c.SendFile(f, 0, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// TestSendFileEngineClose: Engine.Close while files are being sent to peers that do not
// read: Close returns, and every duplicated descriptor is closed.
func TestSendFileEngineClose(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) { testSendFileEngineClose(t, Config{Backend: be, Queues: 1}, 1) })
}

func testSendFileEngineClose(t *testing.T, cfg Config, scale int) {
	f, data := streamFile(t, 7, 8<<20/scale)
	cfg.Queues, cfg.CloseTimeout = 2, 200*time.Millisecond
	e := newEngine(t, cfg)
	var peers []net.Conn
	var conns []*Conn
	for range 4 {
		c, p := dialPeer(t, e, HandlerFuncs{})
		peers = append(peers, p)
		conns = append(conns, c)
	}
	// After the close: the connections' and the peers' sockets gone as well.
	fds := countFDs() - 2*len(conns)
	for _, c := range conns {
		for range 4 {
			if err := c.SendFile(f, 0, int64(len(data))); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(50 * time.Millisecond)
	// The peers never read: every close gives up after CloseTimeout, and Close says so.
	if err := e.Close(); !errors.Is(err, ErrCloseTimeout) {
		t.Fatalf("Engine.Close = %v, want ErrCloseTimeout", err)
	}
	for _, p := range peers {
		p.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for countFDs() > fds && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := countFDs(); n > fds {
		t.Errorf("%d descriptors before, %d after Close", fds, n)
		listFDs(t)
	}
}

func listFDs(t *testing.T) {
	e, _ := os.ReadDir("/proc/self/fd")
	for _, f := range e {
		l, _ := os.Readlink("/proc/self/fd/" + f.Name())
		t.Logf("fd %s -> %s", f.Name(), l)
	}
}

// TestSendFileOnLoop: SendFile from the connection's queue goroutine (a posted function, as
// a handler would) queues and returns at once; the bytes follow a Write made there too.
func TestSendFileOnLoop(t *testing.T) {
	eachBackend(t, func(t *testing.T, be Backend) { testSendFileOnLoop(t, Config{Backend: be, Queues: 1}, 1) })
}

func testSendFileOnLoop(t *testing.T, cfg Config, scale int) {
	f, data := streamFile(t, 8, 3<<20)
	_, c, p := sendFileConn(t, cfg, HandlerFuncs{})
	errc := make(chan error, 1)
	if err := c.Post(func() {
		if _, err := c.Write([]byte("hdr")); err != nil {
			errc <- err
			return
		}
		errc <- c.SendFile(f, 0, int64(len(data)))
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	c.CloseWrite()
	got, err := io.ReadAll(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(got[:3]) != "hdr" || !bytes.Equal(got[3:], data) {
		t.Fatalf("got %d bytes, want hdr + %d", len(got), len(data))
	}
}
