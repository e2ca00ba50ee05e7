package zc

import (
	"testing"
	"time"
)

// TestMappedPauseResumeSameTurn: a connection on the mapped receive path paused and resumed
// in one loop turn (both posted from another goroutine) while its readiness poll is armed:
// the pause cancels the poll, the resume finds it still armed (the cancel is in flight) and
// arms nothing, so the cancelled poll's completion must arm it again. Before that fix the
// connection never received again (found by TestSendDataCopyAllOrNothing, 1 run in ~50).
func TestMappedPauseResumeSameTurn(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		e := newEngine(t, Config{Queues: 1, Backend: b, NoFallback: true, RecvPath: RecvMapped})
		got := make(chan int, 64)
		subs, clients := subscribers(t, e, 1, func() Handler {
			return HandlerFuncs{Data: func(c *Conn, d Data) { got <- d.Len(); d.Release() }}
		})
		c, peer := subs[0], clients[0]
		for round := 0; round < 50; round++ {
			// The poll is armed now (nothing to read): pause and resume in one turn.
			if err := c.Post(func() {
				c.SetReceivePaused(true)
				c.SetReceivePaused(false)
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := peer.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			select {
			case <-got:
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: no data after a pause and resume in one turn\n%s", round, engineDump(e))
			}
		}
	})
}
