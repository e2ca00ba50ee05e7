package zc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/kmod"
	"github.com/zcnet/zcnet/kmod/shim"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// The shim backend over the real module. These need /dev/zcshim: they run in the VM
// (make vmtest sets ZCSHIM_VM and ZCSHIM_KO) and skip only where the module is truly
// absent outside it.

func needShim(t *testing.T) {
	t.Helper()
	err := shimAvailable()
	if err != nil && os.Getenv("ZCSHIM_VM") != "" && os.Getenv("ZCSHIM_KO") != "" {
		if lerr := kmod.Load(os.Getenv("ZCSHIM_KO")); lerr != nil && !errors.Is(lerr, kmod.ErrAlreadyLoaded) {
			t.Fatalf("load %s: %v", os.Getenv("ZCSHIM_KO"), lerr)
		}
		err = shimAvailable()
	}
	if err == nil {
		shimKlogMark()
		t.Cleanup(func() { shimKlogCheck(t) })
		return
	}
	if os.Getenv("ZCSHIM_VM") != "" || !errors.Is(err, ErrNotSupported) {
		t.Fatalf("shim unusable: %v", err)
	}
	t.Skipf("%v: the shim backend's tests run in the VM (make vmtest)", err)
}

func shimCfg() Config {
	return Config{Backend: BackendShim, Queues: 2, SendBufs: 64, RecvBufs: 64, NoPin: true, MaxQueuedBytes: 1 << 20}
}

func TestShimEchoSmall(t *testing.T) {
	needShim(t)
	srv, cli := newPair(t, shimCfg())
	if st := cli.Stats(); st.Backend != "shim" || st.Queues != cli.Config().Queues {
		t.Fatalf("backend %q with %d queues (want shim, %d)", st.Backend, st.Queues, cli.Config().Queues)
	}
	c, k := dialEcho(t, srv, cli, 11)
	if q := c.q.idx; q < 0 || q >= cli.Config().Queues {
		t.Fatalf("conn on queue %d", q)
	}
	if _, err := c.Write([]byte("hello world")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("timeout: got %d bytes, stats %+v\nclient:\n%sserver:\n%s", k.n, cli.Stats(), shimDump(cli), shimDump(srv))
	}
	if k.n != 11 {
		t.Fatalf("got %d bytes", k.n)
	}
	c.Close()
	<-c.Done()
}

// TestShimBulk: 16 MiB of random-sized Sends echoed back, SHA-256 end to end; every byte
// counted as zero-copy or copied once its notification arrived, and every buffer back.
func TestShimBulk(t *testing.T) {
	needShim(t)
	srv, cli := newPair(t, shimCfg())
	const total = 16 << 20
	c, k := dialEcho(t, srv, cli, total)
	sendRandomEchoed(t, c, k, total, 3, 120*time.Second)
	c.Close()
	<-c.Done()
	cs := c.Stats()
	if cs.BytesSentZC+cs.BytesZCCopied != total || cs.SendZCOps == 0 || cs.NotifsPending != 0 || cs.BytesRecv != total {
		t.Fatalf("conn counters: %+v", cs)
	}
	st := cli.Stats()
	if st.Backend != "shim" || st.Send.BytesCopy != 0 || st.Recv.BytesShim != total {
		t.Fatalf("engine counters: %+v", st)
	}
	waitSendBuffersBack(t, cli)
	t.Logf("client %+v", st)
	t.Logf("server %+v", srv.Stats())
}

// TestShimManyConns: concurrent connections over both queues, Write and Send mixed with
// plenty of tiny messages, each stream checksummed.
func TestShimManyConns(t *testing.T) {
	needShim(t)
	cfg := shimCfg()
	cfg.SendBufs, cfg.RecvBufs = 256, 256
	srv, cli := newPair(t, cfg)
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const conns, each = 12, 2 << 20
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := echoExchange(cli, l.Addr().String(), each, uint64(100+i)); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("server %+v", srv.Stats())
}

// TestShimRecvStarved: more connections than receive buffers (each waiting connection
// holds one posted RECV): connections wait their turn for a buffer and every stream still
// arrives intact.
func TestShimRecvStarved(t *testing.T) {
	needShim(t)
	cfg := shimCfg()
	cfg.RecvBufs = 8
	srv, cli := newPair(t, cfg)
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const conns, each = 20, 512 << 10
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-finished:
		case <-time.After(20 * time.Second):
			t.Logf("stuck after 20s:\nclient:\n%sserver:\n%s", shimDump(cli), shimDump(srv))
		}
	}()
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := echoExchange(cli, l.Addr().String(), each, uint64(300+i)); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%v\nclient:\n%sserver:\n%s", err, shimDump(cli), shimDump(srv))
	}
}

// TestShimEngineCloseBusy: Engine.Close with connections still sending and receiving
// finishes every connection (OnClose, Done) and gives everything back to the module.
func TestShimEngineCloseBusy(t *testing.T) {
	needShim(t)
	cfg := shimCfg()
	cfg.CloseTimeout = 200 * time.Millisecond
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var conns []*Conn
	closed := make(chan error, 8)
	for i := 0; i < 8; i++ {
		c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{Close: func(c *Conn, err error) { closed <- err }})
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		go func() {
			p := make([]byte, 256<<10)
			for {
				if _, err := c.Write(p); err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	// The writers never stop and the echoes are not read: a close may give up after
	// CloseTimeout (in a TCG guest it does), and then Close and that OnClose say so.
	cerr := cli.Close()
	if cerr != nil && !errors.Is(cerr, ErrCloseTimeout) {
		t.Fatal(cerr)
	}
	for i, c := range conns {
		select {
		case <-c.Done():
		default:
			t.Fatalf("conn %d not done after Engine.Close", i)
		}
	}
	if len(closed) != len(conns) {
		t.Fatalf("%d OnClose calls for %d conns", len(closed), len(conns))
	}
	timedOut := 0
	for range conns {
		if err := <-closed; errors.Is(err, ErrCloseTimeout) {
			timedOut++
		}
	}
	if (cerr != nil) != (timedOut > 0) {
		t.Fatalf("Engine.Close = %v, but %d OnClose reported ErrCloseTimeout", cerr, timedOut)
	}
	t.Logf("Engine.Close took %v (%d closes gave up)", time.Since(start), timedOut)
}

// TestShimWritable: a Writable sender streams from OnWritable on the queue goroutine
// (started with Conn.Post), also with only two small send buffers, which come back only at
// their notifications.
func TestShimWritable(t *testing.T) {
	needShim(t)
	for _, tc := range []struct {
		name       string
		bufs, size int
		total      int
	}{{"default", 64, 64 << 10, 16 << 20}, {"two-buffers", 2, 4096, 2 << 20}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newEngine(t, shimCfg())
			cfg := shimCfg()
			cfg.SendBufs, cfg.SendBufSize = tc.bufs, tc.size
			cli := newEngine(t, cfg)
			c, k := streamCollected(t, srv, cli, tc.total, 60*time.Second, func() string { return shimDump(cli) })
			if k.n != tc.total || !bytes.Equal(k.sum.h.Sum(nil), streamedSum(tc.total)) {
				t.Fatal("streamed data differs")
			}
			c.Close()
			<-c.Done()
		})
	}
}

// TestShimForeignBuffer: buffers of another queue are copied into this queue's registered
// ones, in order; buffers of another engine are refused.
func TestShimForeignBuffer(t *testing.T) {
	needShim(t)
	testForeignBuffers(t, shimCfg())
}

// TestShimPeerCloses and TestShimPeerReset run the io_uring backend's tests over the shim.
func TestShimPeerCloses(t *testing.T) {
	needShim(t)
	testPeerClosesMidStream(t, shimCfg())
}

func TestShimPeerReset(t *testing.T) {
	needShim(t)
	testPeerReset(t, shimCfg())
}

// TestShimCloseStuckPeer: the peer never reads and is silent (silence: a peer that only
// stops reading answers the kernel's probes, and the close waits for it); Close gives up
// after CloseTimeout, the connection finishes and every send buffer comes back.
func TestShimCloseStuckPeer(t *testing.T) {
	needShim(t)
	cfg := shimCfg()
	cfg.CloseTimeout = 300 * time.Millisecond
	cfg.MaxQueuedBytes = 8 << 20
	e := newEngine(t, cfg)
	l, ev := listenEvents(t, newEngine(t, shimCfg()))
	c, err := e.Dial(context.Background(), "tcp", l.Addr().String(), HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	sc := recvEvent(t, ev.conn, "accept")
	sc.SetReceivePaused(true)
	chunk := make([]byte, 64<<10)
	go func() {
		for i := 0; i < 64; i++ { // 4 MiB: more than the socket buffers hold
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
	if err := sc.Socket(func(s *tcpglue.Socket) error {
		return s.Control(func(fd int) error { silence(t, fd); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.Close()
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("Close did not finish: %+v", c.Stats())
	}
	t.Logf("closed in %v with the peer not reading", time.Since(start))
	waitSendBuffersBack(t, e)
}

// TestShimCloseTimeoutReported: a close that gives up after CloseTimeout says so in OnClose
// (ErrCloseTimeout, the bytes dropped), and the peer gets a reset, not the dropped bytes.
func TestShimCloseTimeoutReported(t *testing.T) {
	needShim(t)
	testCloseTimeoutReported(t, shimCfg())
}

// TestShimWriteFromHandler: a handler's blocking call on its own queue goroutine gets
// ErrWouldBlock instead of a deadlock.
func TestShimWriteFromHandler(t *testing.T) {
	needShim(t)
	cfg := shimCfg()
	cfg.SendBufs = 4
	cfg.SendPoolMax = 4 * 64 << 10
	e := newEngine(t, cfg)
	l, ev := listenEvents(t, e)
	s := dialPlain(t, l.Addr().String())
	c := recvEvent(t, ev.conn, "accept")
	got := make(chan error, 1)
	c.SetHandler(HandlerFuncs{Data: func(c *Conn, d Data) {
		d.Release()
		var err error
		var kept []memreg.Buf
		for i := 0; i < 64 && err == nil; i++ {
			var b memreg.Buf
			b, err = c.BufferWait(time.Second) // keeps the buffers: the fifth must not wait here
			if err == nil {
				kept = append(kept, b)
			}
		}
		for _, b := range kept {
			b.Release()
		}
		got <- err
	}})
	s.Write([]byte("go"))
	if err := recvEvent(t, got, "handler"); !errors.Is(err, ErrWouldBlock) {
		t.Fatalf("BufferWait on the queue goroutine with no buffer: %v, want ErrWouldBlock", err)
	}
	c.Close()
	<-c.Done()
}

// TestShimThroughput streams 32 MiB one way with a Writable sender over each backend this
// kernel offers and logs the rates (in the VM: emulated, so compare ratios only), checking
// every stream's checksum.
func TestShimThroughput(t *testing.T) {
	needShim(t)
	const total = 32 << 20
	want := streamedSum(total)
	for _, b := range []Backend{BackendShim, BackendPlain, BackendIOUring} {
		cfg := shimCfg()
		cfg.Backend = b
		cfg.MaxQueuedBytes = 4 << 20
		srv, err := New(cfg)
		if err != nil {
			t.Logf("%v: %v", b, err)
			continue
		}
		cli, err := New(cfg)
		if err != nil {
			srv.Close()
			t.Fatal(err)
		}
		k := newCollector(total)
		l, err := srv.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return k.handler() })
		if err != nil {
			t.Fatal(err)
		}
		s := &streamer{total: total, errs: make(chan error, 1)}
		start := time.Now()
		c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), s)
		if err != nil {
			t.Fatal(err)
		}
		c.Post(func() { s.OnWritable(c) })
		select {
		case <-k.done:
		case err := <-s.errs:
			t.Fatal(err)
		case <-time.After(60 * time.Second):
			t.Fatalf("%v: timeout: %d of %d", b, k.n, total)
		}
		d := time.Since(start)
		if k.n != total || !bytes.Equal(k.sum.h.Sum(nil), want) {
			t.Fatalf("%v: streamed data differs", b)
		}
		st := cli.Stats()
		t.Logf("MEASURE zc %-8v %6.1f MB/s (32 MiB one way; send ops %d, zero-copy ops %d)", b, float64(total)/d.Seconds()/1e6, st.Send.Ops, st.Send.ZCOps)
		c.Close()
		<-c.Done()
		l.Close()
		cli.Close()
		srv.Close()
	}
}

// TestShimModuleIdle runs last: every queue, region, socket and operation of the tests above
// is gone from the module.
func TestShimModuleIdle(t *testing.T) {
	needShim(t)
	var st shim.Stats
	var err error
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, err = shim.ReadStats()
		if err != nil {
			t.Fatal(err)
		}
		// ReadStats' own open file is one context.
		if st.Contexts == 1 && st.Regions == 0 && st.PinnedPages == 0 && st.Socks == 0 && st.Notifs == 0 && st.Ops == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("module not idle after the zc tests: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("module idle: %+v", st)
}

// The kernel log is read after every shim test: BUG, WARNING, Oops or a leak report fails it.
var (
	shimKlogMu   sync.Mutex
	shimKlogSeen = map[string]bool{}
	shimKlogBad  = regexp.MustCompile(`BUG:|WARNING:|Oops|general protection|Call Trace|zcshim: LEAK|refcount_t:|list_(add|del) corruption`)
)

func shimKlog() []string {
	buf := make([]byte, 1<<20)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil || n <= 0 {
		return nil
	}
	return strings.Split(string(buf[:n]), "\n")
}

func shimKlogMark() {
	shimKlogMu.Lock()
	defer shimKlogMu.Unlock()
	for _, l := range shimKlog() {
		shimKlogSeen[l] = true
	}
}

func shimKlogCheck(t *testing.T) {
	shimKlogMu.Lock()
	defer shimKlogMu.Unlock()
	var bad []string
	for _, l := range shimKlog() {
		if !shimKlogSeen[l] {
			shimKlogSeen[l] = true
			if shimKlogBad.MatchString(l) {
				bad = append(bad, l)
			}
		}
	}
	if len(bad) > 0 {
		t.Errorf("kernel log after %s:\n%s", t.Name(), strings.Join(bad, "\n"))
	}
}

// shimDump describes the engine's state and the module's (for failure messages).
func shimDump(e *Engine) string {
	var sb strings.Builder
	sb.WriteString(engineDump(e))
	if ms, err := shim.ReadStats(); err == nil {
		sb.WriteString(fmt.Sprintf("module: %+v\n", ms))
	}
	return sb.String()
}

// SendBytes on the shim backend: the module sends only from memory registered with it, so
// the application's bytes are copied into its send buffers (BytesAppCopied), in order with
// the other sends; SendZeroCopy forbids that copy (ErrNotSupported).
func TestShimSendBytes(t *testing.T) {
	needShim(t)
	t.Run("order", func(t *testing.T) {
		cfg := shimCfg()
		testSendBytesOrder(t, cfg)
	})
	t.Run("misuse", func(t *testing.T) { testSendBytesMisuse(t, shimCfg()) })
	t.Run("sendZeroCopy", func(t *testing.T) {
		cfg := shimCfg()
		cfg.SendPath = SendZeroCopy
		e := newEngine(t, cfg)
		l, ev := listenEvents(t, e)
		dialPlain(t, l.Addr().String())
		c := recvEvent(t, ev.conn, "accept")
		if err := c.SendBytes([]byte("x"), nil); !errors.Is(err, ErrNotSupported) {
			t.Fatalf("SendBytes on the shim under SendZeroCopy = %v, want ErrNotSupported", err)
		}
	})
}
