package zc

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/testutil"
)

// TestZcrxHeldData: Config.Debug.HeldData tracks Data by its owner, so zcrx Data (a buffer of
// the area, not of the ring) held too long is reported, and Data released at once is not.
// Where zcrx is refused (this host) the Data is ring Data and the same holds.
func TestZcrxHeldData(t *testing.T) {
	want := zcrxExpected(t)
	const bound = 50 * time.Millisecond
	m := &misuses{}
	e := newEngine(t, Config{Queues: 1, RecvPath: RecvZcrx, ZcrxAreaSize: 256 << 10,
		Debug: DebugOptions{HeldData: bound, OnMisuse: m.add}})
	var (
		keep atomic.Bool
		mu   sync.Mutex
		kept []Data
		got  atomic.Int64
	)
	c, peer := dialPeer(t, e, HandlerFuncs{Data: func(_ *Conn, d Data) {
		if keep.Load() {
			mu.Lock()
			kept = append(kept, d) // never released (until the end): the misuse
			mu.Unlock()
			return
		}
		got.Add(int64(d.Len()))
		d.Release()
	}})
	// Released at once: nothing to report, even after the watcher looked several times.
	const first = 64 << 10
	if _, err := peer.Write(make([]byte, first)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the first bytes received", func() bool { return got.Load() == first })
	time.Sleep(4 * bound)
	if n := e.Stats().Debug.DataHeldLong; n != 0 {
		t.Fatalf("%d Data reported held though each was released at once: %v", n, m.errs)
	}
	keep.Store(true)
	if _, err := peer.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the held Data counted", func() bool { return e.Stats().Debug.DataHeldLong > 0 })
	// The report follows the count (the watcher counts, then calls OnMisuse).
	testutil.Eventually(t, "the held Data reported", func() bool { return m.has("Data held") })
	mu.Lock()
	for _, d := range kept {
		if _, zx := d.src.(*zcrxData); zx != want {
			t.Errorf("held Data from zcrx: %v, want %v", zx, want)
		}
		d.Release()
	}
	mu.Unlock()
	if want && e.Stats().Recv.BytesZcrx == 0 {
		t.Errorf("no bytes through zcrx")
	}
	c.Close()
	<-c.Done()
}
