package zc_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"

	"github.com/zcnet/zcnet/zc"
)

// A relay as the README writes it: accept, DialAsync the backend, then zc.Relay forwards
// both ways with SendData. The backend here answers, half-closes, and only then reads the
// client's upload: the relay must pass the half-close on and keep forwarding the other way.
func Example_relay() {
	e, err := zc.New(zc.Config{Queues: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()

	// The backend, on Go's net: "hello", FIN, then count the upload.
	backend, _ := net.Listen("tcp", "127.0.0.1:0")
	defer backend.Close()
	uploaded := make(chan int64, 1)
	go func() {
		c, err := backend.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte("hello"))
		c.(*net.TCPConn).CloseWrite()
		n, _ := io.Copy(io.Discard, c)
		uploaded <- n
	}()
	backendAddr := backend.Addr().String()
	relayAddr := "127.0.0.1:0"

	// relay:begin
	l, err := e.Listen("tcp", relayAddr, func(front *zc.Conn) zc.Handler {
		front.SetReceivePaused(true) // until the backend is connected
		e.DialAsync(context.Background(), "tcp", backendAddr, zc.HandlerFuncs{},
			func(back *zc.Conn, err error) { // on back's queue goroutine
				if err != nil {
					front.Close()
					return
				}
				// Both ways by the cheapest path (splice where it can); each side's FIN
				// is passed on after what is queued, and the pair closes once both sides
				// ended (or either failed).
				zc.Relay(front, back)
			})
		return zc.HandlerFuncs{}
	})
	// relay:end
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()

	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	answer, err := io.ReadAll(c) // up to the backend's FIN, passed on by the relay
	fmt.Printf("%q %v\n", answer, err)
	upload := bytes.Repeat([]byte("relay "), 8<<20/6)
	if _, err := c.Write(upload); err != nil {
		fmt.Println(err)
		return
	}
	c.(*net.TCPConn).CloseWrite()
	fmt.Println(<-uploaded == int64(len(upload)))
	// Output:
	// "hello" <nil>
	// true
}
