package zc_test

import (
	"fmt"
	"io"
	"net"

	"github.com/zcnet/zcnet/zc"
)

// One send buffer sent on several connections without copying it: each Send queues the
// same memory, and the buffer goes back to its pool once Release was called and every send
// is done with it.
func ExampleShared() {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	joined := make(chan *zc.Conn, 3)
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *zc.Conn) zc.Handler {
		joined <- c
		return zc.HandlerFuncs{}
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	var clients []net.Conn
	var subscribers []*zc.Conn
	for range 3 {
		nc, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			fmt.Println(err)
			return
		}
		defer nc.Close()
		clients = append(clients, nc)
		subscribers = append(subscribers, <-joined)
	}
	c, msg := subscribers[0], "one buffer, three sends\n"

	b, _ := c.BufferWait(0)
	n := copy(b.Bytes(), msg)
	sh, _ := zc.NewShared(b, n)
	for _, sub := range subscribers {
		sh.Send(sub)
	}
	sh.Release()

	for i, nc := range clients {
		p := make([]byte, len(msg))
		io.ReadFull(nc, p)
		fmt.Print(i, ": ", string(p))
	}
	// Output:
	// 0: one buffer, three sends
	// 1: one buffer, three sends
	// 2: one buffer, three sends
}
