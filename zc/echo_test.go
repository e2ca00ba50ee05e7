package zc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// newPair returns a server and a client engine.
func newPair(t testing.TB, cfg Config) (srv, cli *Engine) {
	return newEngine(t, cfg), newEngine(t, cfg)
}

func newEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	if cfg.Queues == 0 {
		cfg.Queues = 2
	}
	if cfg.SendBufs == 0 {
		cfg.SendBufs = 64
	}
	if cfg.RecvBufs == 0 {
		cfg.RecvBufs = 64
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// echoHandler sends back whatever it receives, buffer by buffer (event-loop API).
func echoAccept(c *Conn) Handler {
	return HandlerFuncs{
		Data: func(c *Conn, d Data) { c.SendData(d) },
		EOF:  func(c *Conn, err error) { c.Close() },
	}
}

// collector gathers everything a client connection receives.
type collector struct {
	mu   sync.Mutex
	sum  hashState
	n    int
	want int
	done chan struct{}
	err  error
	once sync.Once
}

type hashState struct {
	h interface {
		Write([]byte) (int, error)
		Sum([]byte) []byte
	}
}

func newCollector(want int) *collector {
	return &collector{want: want, done: make(chan struct{}), sum: hashState{sha256.New()}}
}

func (k *collector) handler() Handler {
	return HandlerFuncs{
		Data: func(c *Conn, d Data) {
			k.mu.Lock()
			k.sum.h.Write(d.Bytes())
			k.n += d.Len()
			n := k.n
			k.mu.Unlock()
			d.Release()
			if n >= k.want {
				k.once.Do(func() { close(k.done) })
			}
		},
		EOF: func(c *Conn, err error) {
			if err != io.EOF {
				k.err = err
			}
			k.once.Do(func() { close(k.done) })
		},
	}
}

func TestEchoSmall(t *testing.T) {
	srv, e := newPair(t, Config{})
	c, k := dialEcho(t, srv, e, 11)
	if _, err := c.Write([]byte("hello world")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("timeout: got %d bytes, stats %+v", k.n, e.Stats())
	}
	if k.n != 11 {
		t.Fatalf("got %d bytes", k.n)
	}
	c.Close()
	<-c.Done()
}

// dialEcho dials, from cli, an echo listener (echoAccept) of srv on 127.0.0.1 (closed at
// the test's end), the echoes going to a collector that waits for want bytes.
func dialEcho(t *testing.T, srv, cli *Engine, want int) (*Conn, *collector) {
	t.Helper()
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	k := newCollector(want)
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), k.handler())
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

// sendRandomEchoed sends total bytes of random data as random-sized Sends from registered
// buffers and checks that the collector k got the same stream back (SHA-256).
func sendRandomEchoed(t *testing.T, c *Conn, k *collector, total int, seed uint64, wait time.Duration) {
	t.Helper()
	want := sha256.New()
	rng := rand.New(rand.NewPCG(seed, seed+1))
	for sent := 0; sent < total; {
		b, err := c.BufferWait(wait)
		if err != nil {
			t.Fatal(err)
		}
		n := min(1+rng.IntN(len(b.Bytes())), total-sent)
		p := b.Bytes()[:n]
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		want.Write(p)
		if err := c.Send(b, n); err != nil {
			t.Fatal(err)
		}
		sent += n
	}
	select {
	case <-k.done:
	case <-time.After(wait):
		t.Fatalf("timeout: got %d of %d bytes back", k.n, total)
	}
	if k.err != nil {
		t.Fatal(k.err)
	}
	if k.n != total || !bytes.Equal(k.sum.h.Sum(nil), want.Sum(nil)) {
		t.Fatalf("got %d of %d bytes back, checksum equal=%v", k.n, total, bytes.Equal(k.sum.h.Sum(nil), want.Sum(nil)))
	}
}

func TestBulkChecksummed(t *testing.T) {
	for _, path := range []SendPath{SendAdaptive, SendCopy, SendZeroCopy} {
		t.Run(path.String(), func(t *testing.T) {
			srv, e := newPair(t, Config{SendPath: path})
			const total = 32 << 20
			c, k := dialEcho(t, srv, e, total)
			sendRandomEchoed(t, c, k, total, 1, 30*time.Second)
			c.Close()
			<-c.Done()
			st := e.Stats()
			t.Logf("%+v", st)
		})
	}
}

// streamer sends total bytes from OnWritable, on the queue goroutine.
type streamer struct {
	HandlerFuncs
	total, sent int
	errs        chan error
}

func (s *streamer) OnWritable(c *Conn) {
	for s.sent < s.total {
		b, err := c.Buffer()
		if err != nil {
			return // buffers are all in flight: OnWritable comes again
		}
		n := min(len(b.Bytes()), s.total-s.sent)
		p := b.Bytes()[:n]
		for i := range p {
			p[i] = byte(s.sent + i)
		}
		if err := c.Send(b, n); err != nil {
			s.errs <- err
			return
		}
		s.sent += n
	}
}

// streamCollected streams total bytes from cli to a listener of srv (closed at the test's
// end) that collects them: a Writable sender (streamer) started on the queue goroutine with
// Conn.Post. It waits until all arrived, failing the test on a send error or when nothing
// completes it within wait (stalled: info, when not nil, adds to the message).
func streamCollected(t *testing.T, srv, cli *Engine, total int, wait time.Duration, info func() string) (*Conn, *collector) {
	t.Helper()
	k := newCollector(total)
	l, err := srv.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return k.handler() })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	s := &streamer{total: total, errs: make(chan error, 1)}
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), s)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Post(func() { s.OnWritable(c) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.done:
	case err := <-s.errs:
		t.Fatal(err)
	case <-time.After(wait):
		extra := ""
		if info != nil {
			extra = "\n" + info()
		}
		t.Fatalf("sender stalled: %d of %d received, conn %+v%s", k.n, total, c.Stats(), extra)
	}
	return c, k
}

// streamedSum is the SHA-256 of the total bytes a streamer sends.
func streamedSum(total int) []byte {
	want := sha256.New()
	p := make([]byte, 64<<10)
	for off := 0; off < total; off += len(p) {
		for i := range p {
			p[i] = byte(off + i)
		}
		want.Write(p[:min(len(p), total-off)])
	}
	return want.Sum(nil)
}

func TestWritableStreaming(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		const total = 64 << 20
		srv, cli := newPair(t, Config{Backend: b})
		c, k := streamCollected(t, srv, cli, total, 30*time.Second, nil)
		if k.n != total || string(k.sum.h.Sum(nil)) != string(streamedSum(total)) {
			t.Fatal("streamed data differs")
		}
		c.Close()
		<-c.Done()
	})
}

// TestWritableZeroCopyFewBuffers: with SEND_ZC a buffer returns at its notification, which
// may come after the batch completed; a Writable sender with only two buffers must still be
// told when they come back (regression: it stalled forever).
func TestWritableZeroCopyFewBuffers(t *testing.T) {
	const total = 8 << 20
	srv := newEngine(t, Config{})
	cli := newEngine(t, Config{SendPath: SendZeroCopy, SendBufs: 2, SendBufSize: 4096})
	c, _ := streamCollected(t, srv, cli, total, 30*time.Second, nil)
	c.Close()
	<-c.Done()
}
