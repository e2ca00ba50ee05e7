package zc

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
)

// Churn and cycles: thousands of connections accepted and dialed in waves, and
// Engine open/close cycles with a connection each, leave descriptors, goroutines, registered
// regions and rings where they started. ZC_CHURN_CONNS (default 2000) and ZC_CHURN_CYCLES
// (default 50) scale it to the 10,000 and 200.

type resources struct {
	fds, goroutines     int
	regions, rings, brs int64
}

func (r resources) String() string {
	return fmt.Sprintf("fds %d, goroutines %d, regions %d, rings %d, buffer rings %d", r.fds, r.goroutines, r.regions, r.rings, r.brs)
}

func snapshot() resources {
	return resources{countFDs(), runtime.NumGoroutine(), memreg.OpenRegions(), uring.OpenRings(), uring.OpenBufRings()}
}

// waitBack waits (closes finish asynchronously: a few seconds' grace) until the resources are
// back to before, and fails with both snapshots otherwise.
func waitBack(t *testing.T, before resources, what string) resources {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		now := snapshot()
		if now.fds <= before.fds && now.goroutines <= before.goroutines && now.regions <= before.regions &&
			now.rings <= before.rings && now.brs <= before.brs {
			return now
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: resources not back: before %v; after %v", what, before, now)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestConnChurn(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testConnChurn(t, b, envInt(t, "ZC_CHURN_CONNS", 2000)) })
}

// testConnChurn: n connections dialed by one engine and accepted by another, in waves of 250
// alive at once; each echoes a message and closes (half from each side).
func testConnChurn(t *testing.T, b Backend, n int) {
	before := snapshot()
	func() {
		cfg := Config{Backend: b, Queues: 2, NoPin: true}
		srv, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		cli, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		const wave = 250
		start := time.Now()
		for done := 0; done < n; {
			k := min(wave, n-done)
			var wg sync.WaitGroup
			errs := make(chan error, k)
			for i := 0; i < k; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					col := newCollector(5)
					h := col.handler().(HandlerFuncs)
					h.EOF = func(c *Conn, err error) { c.Close() } // after our CloseWrite, the server's close
					c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), h)
					if err != nil {
						errs <- err
						return
					}
					if _, err := c.Write([]byte("churn")); err != nil {
						errs <- err
						return
					}
					select {
					case <-col.done:
					case <-time.After(20 * time.Second):
						errs <- fmt.Errorf("echo %d timed out", i)
					}
					if i%2 == 0 {
						c.Close() // we close; the server sees EOF and closes
					} else {
						c.CloseWrite() // the server closes after our EOF
					}
					select {
					case <-c.Done():
					case <-time.After(20 * time.Second):
						errs <- fmt.Errorf("connection %d not done", i)
					}
				}(done + i)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			done += k
		}
		deadline := time.Now().Add(10 * time.Second)
		for srv.Stats().Conns != 0 || cli.Stats().Conns != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("connections left: server %d, client %d\n%s", srv.Stats().Conns, cli.Stats().Conns, engineDump(srv))
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("%d connections accepted and %d dialed in %v (accepted counter %d)", n, n, time.Since(start).Round(time.Millisecond), l.Stats().Accepted)
		if l.Stats().Accepted != uint64(n) {
			t.Errorf("listener accepted %d, want %d", l.Stats().Accepted, n)
		}
	}()
	after := waitBack(t, before, "connection churn")
	t.Logf("before: %v; after: %v", before, after)
}

func TestEngineCycles(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testEngineCycles(t, b, envInt(t, "ZC_CHURN_CYCLES", 50)) })
}

// testEngineCycles: Engine open/close cycles, each with an echoed connection, and the last
// engines closed with the connection still open.
func testEngineCycles(t *testing.T, b Backend, cycles int) {
	before := snapshot()
	start := time.Now()
	for i := 0; i < cycles; i++ {
		e, err := New(Config{Backend: b, Queues: 2, NoPin: true})
		if err != nil {
			t.Fatal(err)
		}
		l, err := e.Listen("tcp", "127.0.0.1:0", echoAccept)
		if err != nil {
			t.Fatal(err)
		}
		col := newCollector(5)
		c, err := e.Dial(context.Background(), "tcp", l.Addr().String(), col.handler())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("cycle"))
		select {
		case <-col.done:
		case <-time.After(hangBound):
			t.Fatalf("cycle %d: no echo", i)
		}
		if col.err != nil && col.err != io.EOF {
			t.Fatal(col.err)
		}
		if i%2 == 0 {
			c.Close()
			l.Close()
		}
		// Odd cycles: Engine.Close closes the listener and the open connection itself.
		if err := e.Close(); err != nil {
			t.Fatalf("cycle %d: Close: %v", i, err)
		}
	}
	after := waitBack(t, before, "engine cycles")
	t.Logf("%d engine cycles in %v; before: %v; after: %v", cycles, time.Since(start).Round(time.Millisecond), before, after)
}
