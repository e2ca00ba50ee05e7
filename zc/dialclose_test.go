package zc

import (
	"context"
	"errors"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// synDropTarget returns the address of a loopback listener that drops SYNs: backlog 1, never
// accepting, its accept queue filled by plain connects. Connects to it stay in flight (the
// kernel retransmits the SYN for minutes).
func synDropTarget(t *testing.T) string {
	t.Helper()
	l, err := tcpglue.Listen("tcp", "127.0.0.1:0", tcpglue.ListenOptions{Backlog: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ap, err := l.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	// The accept queue holds backlog+1 connections; a third connect's SYN is dropped. The
	// fillers connect without blocking.
	for i := 0; i < 3; i++ {
		s, err := tcpglue.NewSocket(unix.AF_INET, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if err := s.Connect(ap); err != nil && !errors.Is(err, unix.EINPROGRESS) {
			t.Fatal(err)
		}
	}
	// Check that a connect now really hangs.
	probe, err := tcpglue.NewSocket(unix.AF_INET, true)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	if err := probe.Connect(ap); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	var soerr error
	probe.Control(func(fd int) error {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, _ := unix.Poll(pfd, 200)
		if n > 0 {
			soerr = errors.New("the probe connect completed: SYNs are not dropped")
		}
		return nil
	})
	if soerr != nil {
		t.Fatal(soerr)
	}
	return ap.String()
}

func countFDs() int {
	e, _ := os.ReadDir("/proc/self/fd")
	return len(e)
}

// TestDialInFlightEngineClose: Engine.Close while Dials (no deadline) and DialAsyncs are
// stuck on a SYN-dropping target: every Dial returns ErrClosed, every DialAsync's done runs
// with ErrClosed, Close returns, and nothing leaks; 20 rounds.
func TestDialInFlightEngineClose(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		testDialInFlightEngineClose(t, Config{Backend: b, Queues: 2, NoPin: true}, 20)
	})
}

func testDialInFlightEngineClose(t *testing.T, cfg Config, rounds int) {
	target := synDropTarget(t)
	fds, gs := countFDs(), runtime.NumGoroutine()
	regions, rings := memreg.OpenRegions(), uring.OpenRings()
	const dials = 4
	for round := 0; round < rounds; round++ {
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2*dials)
		var wg sync.WaitGroup
		for i := 0; i < dials; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := e.Dial(context.Background(), "tcp", target, HandlerFuncs{})
				if c != nil {
					c.Close()
					err = errors.New("dial to a SYN-dropping target connected")
				}
				errs <- err
			}()
			err := e.DialAsync(context.Background(), "tcp", target, HandlerFuncs{}, func(c *Conn, err error) {
				if c != nil {
					c.Close()
					err = errors.New("async dial to a SYN-dropping target connected")
				}
				errs <- err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		// Let the connects start (vary the moment: sometimes Close races the start).
		time.Sleep(time.Duration(round%4) * 10 * time.Millisecond)
		closed := make(chan error, 1)
		go func() { closed <- e.Close() }()
		if err := waitHang(t, closed, "Engine.Close with dials in flight", func() string { return "" }); err != nil {
			t.Fatalf("round %d: Engine.Close = %v", round, err)
		}
		for i := 0; i < 2*dials; i++ {
			err := waitHang(t, errs, "a dial in flight at Engine.Close", func() string { return "" })
			var oe *OpError
			if !errors.Is(err, ErrClosed) || !errors.As(err, &oe) || oe.Op != "dial" {
				t.Fatalf("round %d: dial in flight at Engine.Close returned %v, want a dial *OpError matching ErrClosed", round, err)
			}
		}
		wg.Wait()
	}
	// Nothing leaked (closes finish asynchronously: a few seconds' grace).
	deadline := time.Now().Add(5 * time.Second)
	for {
		nf, ng, nr, nu := countFDs(), runtime.NumGoroutine(), memreg.OpenRegions(), uring.OpenRings()
		if nf <= fds && ng <= gs && nr <= regions && nu <= rings {
			t.Logf("after %d rounds: fds %d (before %d), goroutines %d (%d), regions %d (%d), rings %d (%d)", rounds, nf, fds, ng, gs, nr, regions, nu, rings)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leak after %d rounds: fds %d (before %d), goroutines %d (%d), regions %d (%d), rings %d (%d)", rounds, nf, fds, ng, gs, nr, regions, nu, rings)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDialCancelInFlight: a Dial stuck on a SYN-dropping target returns the context's error
// when the context ends, and the engine closes normally afterwards.
func TestDialCancelInFlight(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		target := synDropTarget(t)
		e := newEngine(t, Config{Backend: b, Queues: 1, NoPin: true})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			c, err := e.Dial(ctx, "tcp", target, HandlerFuncs{})
			if c != nil {
				c.Close()
			}
			done <- err
		}()
		if err := waitHang(t, done, "Dial with a deadline", func() string { return engineDump(e) }); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Dial with a 100 ms deadline to a SYN-dropping target = %v, want DeadlineExceeded", err)
		}
		if n := e.Stats().Conns; n != 0 {
			t.Fatalf("%d connections left after the cancelled dial", n)
		}
		closeEngineBounded(t, e)
	})
}
