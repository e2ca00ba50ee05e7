package zc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/zc"
)

// streamer sends total bytes from registered send buffers, loop-driven: it fills and
// sends buffers until MaxQueuedBytes are queued, then returns; OnWritable calls it again
// once less than half of that is queued. Stopping at MaxQueuedBytes, rather than taking
// buffers until the pool runs dry, keeps the few buffers in use warm in the CPU's cache
// and leaves the rest of the pool to the queue's other connections.
type streamer struct {
	zc.HandlerFuncs
	left, max int
	next      byte
}

func (s *streamer) OnWritable(c *zc.Conn) { s.pump(c) }

func (s *streamer) pump(c *zc.Conn) {
	for s.left > 0 && c.Queued() < s.max {
		b, err := c.Buffer()
		if errors.Is(err, memreg.ErrExhausted) {
			return // every buffer is out: OnWritable comes when one is back
		}
		if err != nil {
			c.Close()
			return
		}
		p := b.Bytes()[:min(len(b.Bytes()), s.left)]
		for i := range p {
			p[i] = s.next
			s.next++
		}
		if err := c.Send(b, len(p)); err != nil {
			c.Close()
			return
		}
		s.left -= len(p)
	}
	if s.left == 0 {
		c.Close() // what is queued still goes out, then the FIN
	}
}

// A stream sender in the event-loop style: Post starts it on the connection's queue
// goroutine, OnWritable keeps it going, nothing blocks.
func ExampleWritable() {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	got := make(chan string)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		data, err := io.ReadAll(c)
		bad := 0
		for i, v := range data {
			if v != byte(i) {
				bad++
			}
		}
		got <- fmt.Sprintf("%d bytes, %d wrong, %v", len(data), bad, err)
	}()

	s := &streamer{left: 32 << 20, max: e.Config().MaxQueuedBytes}
	c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), s)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Post(func() { s.pump(c) }); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(<-got)
	<-c.Done()
	// Output: 33554432 bytes, 0 wrong, <nil>
}
