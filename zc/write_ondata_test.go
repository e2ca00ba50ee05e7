package zc

import (
	"io"
	"testing"
	"time"
)

// TestWriteDuringOnData: while the loop runs a connection's OnData, a Write does not ask
// which thread it runs on (Conn.inData): a Write from another goroutine meanwhile is
// staged (not written directly) and leaves in order with the handler's own Write once
// OnData returns; after OnData an idle connection's Write from another goroutine goes out
// directly again (where the backend writes directly at all).
func TestWriteDuringOnData(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		e := newEngine(t, Config{Queues: 1, Backend: b, NoFallback: true, SendPath: SendCopy})
		in, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		first := true
		c, peer := dialPeer(t, e, HandlerFuncs{Data: func(c *Conn, d Data) {
			d.Release()
			if !first {
				return
			}
			first = false
			in <- struct{}{}
			<-release
			_, err := c.Write([]byte("B")) // on the loop, behind the other goroutine's "A"
			done <- err
		}})
		if _, err := peer.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-in:
		case <-time.After(10 * time.Second):
			t.Fatal("no OnData")
		}
		direct0 := e.Stats().Send.DirectWrites
		if n, err := c.Write([]byte("A")); n != 1 || err != nil {
			t.Fatalf("Write from another goroutine during OnData = %d, %v", n, err)
		}
		if d := e.Stats().Send.DirectWrites; d != direct0 {
			t.Errorf("a Write during OnData was written directly (DirectWrites %d → %d)", direct0, d)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatalf("the handler's Write: %v", err)
		}
		got := make([]byte, 2)
		peer.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(peer, got); err != nil || string(got) != "AB" {
			t.Fatalf("the peer read %q, %v; want \"AB\"", got, err)
		}
		// OnData has returned and everything was sent: a Write from here is direct again.
		deadline := time.Now().Add(10 * time.Second)
		for c.Queued() > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		direct1 := e.Stats().Send.DirectWrites
		if n, err := c.Write([]byte("C")); n != 1 || err != nil {
			t.Fatalf("Write after OnData = %d, %v", n, err)
		}
		if _, err := io.ReadFull(peer, got[:1]); err != nil || got[0] != 'C' {
			t.Fatalf("the peer read %q, %v; want \"C\"", got[:1], err)
		}
		if c.inData.Load() {
			t.Error("inData still set after OnData returned")
		}
		if d := e.Stats().Send.DirectWrites; d <= direct1 {
			t.Errorf("an idle connection's Write after OnData was not written directly (DirectWrites %d → %d)", direct1, d)
		}
	})
}
