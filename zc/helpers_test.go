package zc

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

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

// smallCfg is a small engine config of backend b (2 queues, 64 buffers per pool).
func smallCfg(b Backend) Config {
	return Config{Queues: 2, SendBufs: 64, RecvBufs: 64, Backend: b, NoPin: true, MaxQueuedBytes: 1 << 20}
}

func itoa(n int) string { return strconv.Itoa(n) }

// payload is n bytes of a pattern that does not repeat within 64 KiB.
func payload(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*131 + i>>11)
	}
	return p
}

// testBackends are the backends every backend-generic test runs on: the ones any machine
// here has (the zcshim backend needs its module: its tests are TestShim*, run by vmtest).
var testBackends = []Backend{BackendIOUring, BackendPlain}

// eachBackend runs fn as a subtest named after each of testBackends (t.Run(b.String())), so
// `-run TestX/plain` selects one backend.
func eachBackend(t *testing.T, fn func(t *testing.T, b Backend)) {
	t.Helper()
	for _, b := range testBackends {
		t.Run(b.String(), func(t *testing.T) { fn(t, b) })
	}
}
