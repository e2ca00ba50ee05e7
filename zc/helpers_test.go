package zc

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/zcnet/zcnet/tcpglue"
)

// netAccepted listens on e's net.Listener face, connects a plain socket to it and accepts:
// the peer and the accepted net.Conn (the listener closes with the test).
func netAccepted(t *testing.T, e *Engine) (*tcpglue.Socket, net.Conn) {
	t.Helper()
	ln, err := e.NetListen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := dialPlain(t, ln.Addr().String())
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return s, nc
}

// engineDump describes every queue's connections (for failure messages), gathered on each
// loop.
func engineDump(e *Engine) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "engine %v: %+v\n", e.backend, e.Stats())
	for _, q := range e.queues {
		ch := make(chan string, 1)
		err := q.Post(func() {
			s := fmt.Sprintf("queue %d: %d conns, send pool %d/%d free\n", q.idx, len(q.conns), q.send.Free(), q.send.Buffers())
			for _, c := range q.conns {
				c.mu.Lock()
				out, queued, kicked := len(c.out), c.queued, c.kicked
				c.mu.Unlock()
				s += fmt.Sprintf("  conn %v: pend %d out %d queued %d kicked %v ops %d zwait %d armed %v paused %b held %d eof %v life %v fdClosed %v\n",
					c.raddr, c.pendLen(), out, queued, kicked, c.ops, c.zwaitLen(), c.recvArmed, c.paused, c.held.Load(), c.eof, c.st.Life(), c.st.SockClosed())
			}
			ch <- s
		})
		if err != nil {
			fmt.Fprintf(&sb, "queue %d: %v\n", q.idx, err)
			continue
		}
		select {
		case s := <-ch:
			sb.WriteString(s)
		case <-time.After(2 * time.Second):
			fmt.Fprintf(&sb, "queue %d: loop not responding\n", q.idx)
		}
	}
	return sb.String()
}

// waitSendBuffersBack waits until every send buffer of e's pools is free again.
func waitSendBuffersBack(t testing.TB, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		free, total := 0, 0
		for _, q := range e.queues {
			free += q.send.Free()
			total += q.send.Buffers()
		}
		if free == total {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d send buffers back\n%s", free, total, engineDump(e))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var (
	timeNow         = time.Now
	timeMillisecond = time.Millisecond
)
