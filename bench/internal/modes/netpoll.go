package modes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudwego/netpoll"

	"github.com/zcnet/zcnet/bench/internal/frame"
	"github.com/zcnet/zcnet/bench/internal/harness"
)

func init() {
	registered = append(registered, Netpoll{})
}

// Netpoll is cloudwego/netpoll (the event loop under Kitex and Hertz), written the way
// its guide and examples write it: a server is an EventLoop whose OnRequest handler
// reads with the nocopy Reader (Next, then Release) and answers through the Writer
// (WriteBinary, Flush); OnPrepare sets up each accepted connection; clients dial with
// DialConnection and use the same Reader/Writer, blocking, one goroutine per
// connection. The poller count is runtime.GOMAXPROCS(0) (the guide's advice for heavy
// I/O, SetNumLoops, now spelled Configure(Config{PollerNum}): one per CPU the process may
// use). The listener is a net.Listener with
// MPTCP off (the guide allows either kind; netpoll.CreateListener would take Go 1.26's
// MPTCP default).
//
// Bulk senders WriteBinary a whole frame (netpoll references it, no copy) and Flush
// it, which returns once the kernel took every byte; the small-message stream
// collects messages with Malloc and Flushes every 4 KiB (as a bufio.Writer does for
// net). The server reads whatever netpoll buffered (it chooses its read sizes, not
// Case.RecvBuf).
type Netpoll struct{}

// Name implements harness.Mode.
func (Netpoll) Name() string { return "netpoll" }

// Available implements harness.Mode.
func (Netpoll) Available() error { return nil }

// Supports implements harness.ScenarioSupporter: netpoll's model (an RPC event loop)
// fits everything but HTTP (net/http does not run on it: the http and wrk scenarios) and
// the file send.
func (Netpoll) Supports(s harness.Scenario) bool {
	return s != harness.HTTP && s != harness.HTTPWrk && s != harness.FileSend
}

var netpollLoops sync.Once

func setNetpollLoops() {
	netpollLoops.Do(func() { _ = netpoll.Configure(netpoll.Config{PollerNum: runtime.GOMAXPROCS(0)}) })
}

// npStreamFlush is the batch the small-message stream sender flushes at.
const npStreamFlush = 4096

type npKey struct{}

// Server implements harness.Mode.
func (Netpoll) Server(ctx context.Context, c harness.Case, m *harness.Meter, ready func(string)) error {
	setNetpollLoops()
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(ctx, "tcp", c.Addr)
	if err != nil {
		return err
	}
	var fail errs
	var wg sync.WaitGroup
	wg.Add(c.Conns)
	var accepted atomic.Int64
	prepare := func(conn netpoll.Connection) context.Context {
		if accepted.Add(1) > int64(c.Conns) {
			conn.Close() // not ours
			return context.Background()
		}
		v := m.NewVerifier()
		_ = conn.AddCloseCallback(func(netpoll.Connection) error {
			if err := v.Close(); err != nil {
				fail.set(err)
			}
			wg.Done()
			return nil
		})
		return context.WithValue(context.Background(), npKey{}, v)
	}
	handle := func(ctx context.Context, conn netpoll.Connection) error {
		v, _ := ctx.Value(npKey{}).(*frame.Verifier)
		if v == nil {
			return conn.Close()
		}
		r := conn.Reader()
		if c.Scenario.OneWay() {
			p, err := r.Next(r.Len())
			if err == nil {
				err = v.Feed(p)
			}
			r.Release()
			if err != nil {
				fail.set(err)
				return conn.Close()
			}
			return nil
		}
		p, err := r.Next(c.Size) // waits for the whole request
		if err != nil {
			if !errors.Is(err, netpoll.ErrEOF) && !errors.Is(err, netpoll.ErrConnClosed) {
				fail.set(fmt.Errorf("read request: %w", err))
			}
			return conn.Close()
		}
		if err := v.Feed(p); err != nil {
			r.Release()
			fail.set(err)
			return conn.Close()
		}
		w := conn.Writer()
		_, err = w.WriteBinary(p)
		if err == nil {
			err = w.Flush()
		}
		r.Release()
		if err != nil {
			fail.set(fmt.Errorf("write response: %w", err))
			return conn.Close()
		}
		return nil
	}
	evl, err := netpoll.NewEventLoop(handle, netpoll.WithOnPrepare(prepare))
	if err != nil {
		ln.Close()
		return err
	}
	served := make(chan error, 1)
	go func() { served <- evl.Serve(ln) }()
	ready(ln.Addr().String())
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case err := <-served:
		return fmt.Errorf("netpoll serve: %w", err)
	}
	m.Stop()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = evl.Shutdown(sctx)
	return fail.get()
}

// Client implements harness.Mode.
func (Netpoll) Client(_ context.Context, c harness.Case, m *harness.Meter) error {
	setNetpollLoops()
	conns := make([]netpoll.Connection, 0, c.Conns)
	for range c.Conns {
		conn, err := netpoll.DialConnection("tcp", c.Addr, 10*time.Second)
		if err != nil {
			for _, conn := range conns {
				conn.Close()
			}
			return fmt.Errorf("dial %s: %w", c.Addr, err)
		}
		conns = append(conns, conn)
	}
	m.Start()
	var wg sync.WaitGroup
	errs := make([]error, len(conns))
	for i, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			if c.Scenario.RequestResponse() {
				errs[i] = npEchoClient(c, m, conn)
			} else {
				errs[i] = npSource(c, m, conn)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func npSource(c harness.Case, m *harness.Meter, conn netpoll.Connection) error {
	src := m.NewSource()
	w := conn.Writer()
	if c.Scenario == harness.Stream {
		frame := make([]byte, c.Size)
		src.Fill(frame)
		for {
			src.Stamp(frame)
			buf, err := w.Malloc(c.Size)
			if err != nil {
				return fmt.Errorf("malloc: %w", err)
			}
			copy(buf, frame)
			src.Sent()
			stop := m.Stopped()
			if stop || w.MallocLen() >= npStreamFlush {
				if err := w.Flush(); err != nil {
					return fmt.Errorf("flush: %w", err)
				}
			}
			if stop {
				return nil
			}
		}
	}
	buf := make([]byte, c.Size)
	src.Fill(buf)
	for {
		src.Stamp(buf)
		if _, err := w.WriteBinary(buf); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		if err := w.Flush(); err != nil { // returns once the kernel has every byte
			return fmt.Errorf("flush: %w", err)
		}
		src.Sent()
		if m.Stopped() {
			return nil
		}
	}
}

func npEchoClient(c harness.Case, m *harness.Meter, conn netpoll.Connection) error {
	src, v, rec := m.NewSource(), m.NewVerifier(), m.NewRecorder()
	req := make([]byte, c.Size)
	src.Fill(req)
	r, w := conn.Reader(), conn.Writer()
	for {
		src.Stamp(req)
		t0 := time.Now()
		if _, err := w.WriteBinary(req); err != nil {
			return fmt.Errorf("write request: %w", err)
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("flush request: %w", err)
		}
		src.Sent()
		p, err := r.Next(c.Size)
		if err != nil {
			return fmt.Errorf("read response: %w", err)
		}
		rec.Add(time.Since(t0))
		err = v.Feed(p)
		r.Release()
		if err != nil {
			return err
		}
		if m.Stopped() {
			return nil
		}
	}
}
