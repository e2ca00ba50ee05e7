package testutil

import (
	"io"
	"net"
	"sync"
	"time"
)

// CutConn is a TCP connection that passes writes through until Cut; then its next write
// sends only the first half of its bytes (for a TLS record layer that writes a record per
// call: the record's header and part of its body) and resets the connection (SO_LINGER 0,
// close): a peer that dies in the middle of a record.
type CutConn struct {
	*net.TCPConn
	mu  sync.Mutex
	cut bool
}

// Cut makes the next write the half-and-reset one.
func (c *CutConn) Cut() {
	c.mu.Lock()
	c.cut = true
	c.mu.Unlock()
}

func (c *CutConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	cut := c.cut
	c.mu.Unlock()
	if !cut {
		return c.TCPConn.Write(p)
	}
	if _, err := c.TCPConn.Write(p[:len(p)/2]); err != nil {
		return 0, err
	}
	time.Sleep(50 * time.Millisecond) // let the half record arrive before the reset
	c.TCPConn.SetLinger(0)
	c.TCPConn.Close()
	return len(p) / 2, io.ErrClosedPipe
}
