package netconn

import (
	"testing"
	"time"

	"github.com/zcnet/zcnet/zc"
)

// TestNetConnDeadlineAllocs: the deadline setters net/http calls on every request (four read
// deadlines, one write deadline: doc/notes/issue-29-s13-face29b.md) allocate nothing on the
// direct path, as on Go's net; on the ring path a setter that changes nothing allocates
// nothing either; on the direct path a Read that fails on its deadline allocates nothing
// after the first. Against the old code: 6 allocations for net/http's five calls on either
// path (each call's t moved to the heap by a &t in the setter, the face's and zc.Conn's
// SetWriteDeadline both).
func TestNetConnDeadlineAllocs(t *testing.T) {
	for _, be := range lifetimeBackends {
		for _, ring := range []bool{false, true} {
			name := be.String() + "/direct"
			if ring {
				name = be.String() + "/ring"
			}
			t.Run(name, func(t *testing.T) {
				e := newEngine(t, zc.Config{Backend: be, NoFallback: true, Queues: 1})
				_, c := netAccepted(t, e, Options{Ring: ring})
				longAgo := time.Unix(1, 0)
				if !ring {
					got := testing.AllocsPerRun(200, func() {
						c.SetReadDeadline(time.Now().Add(time.Minute)) // ReadHeaderTimeout
						c.SetReadDeadline(time.Time{})                 // the whole request's
						c.SetReadDeadline(longAgo)                     // abortPendingRead
						c.SetReadDeadline(time.Time{})
						c.SetWriteDeadline(time.Time{})
					})
					if got != 0 {
						t.Errorf("net/http's deadline setters of one request: %v allocations, want 0", got)
					}
				}
				c.SetReadDeadline(time.Time{})
				c.SetWriteDeadline(time.Time{})
				got := testing.AllocsPerRun(200, func() {
					c.SetReadDeadline(time.Time{})
					c.SetWriteDeadline(time.Time{})
					c.SetDeadline(time.Time{})
				})
				if got != 0 {
					t.Errorf("unchanged deadlines: %v allocations, want 0", got)
				}
				// The deadlines still work: a Read with one in the past times out at once.
				c.SetReadDeadline(longAgo)
				if _, err := c.Read(make([]byte, 1)); !isTimeout(err) {
					t.Errorf("Read after a past deadline: %v, want a timeout", err)
				}
				// net/http's background Read, ended by a past deadline on every request: its
				// error is made once per connection (Go's net allocates one each time).
				if !ring { // (the ring path's wait allocates once per Read: not net/http's default)
					b := make([]byte, 1)
					got := testing.AllocsPerRun(100, func() { c.Read(b) })
					if got != 0 {
						t.Errorf("Read after a past deadline: %v allocations, want 0", got)
					}
				}
				c.SetWriteDeadline(longAgo)
				if _, err := c.Write([]byte("x")); !isTimeout(err) {
					t.Errorf("Write after a past deadline: %v, want a timeout", err)
				}
			})
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(interface{ Timeout() bool })
	return ok && ne.Timeout()
}
