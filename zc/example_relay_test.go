package zc_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"

	"github.com/zcnet/zcnet/zc"
)

// A relay as the README writes it: accept, DialAsync the backend, forward both ways with
// SendData. The engine's flow control does the rest.
func Example_relay() {
	e, err := zc.New(zc.Config{Queues: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()

	// The backend: an echo server on Go's net.
	backend, _ := net.Listen("tcp", "127.0.0.1:0")
	defer backend.Close()
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			go func() { // an echo (not io.Copy: its splice keeps pipes cached in the process)
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						c.Write(buf[:n])
					}
					if err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	backendAddr := backend.Addr().String()

	l, err := e.Listen("tcp", "127.0.0.1:0", func(front *zc.Conn) zc.Handler {
		front.SetReceivePaused(true) // until the backend is connected
		e.DialAsync(context.Background(), "tcp", backendAddr, zc.HandlerFuncs{
			Data: func(_ *zc.Conn, d zc.Data) { front.SendData(d) },
			// The backend is done: pass its FIN on (after what is queued), then close.
			EOF:   func(back *zc.Conn, _ error) { front.CloseWrite(); back.Close() },
			Close: func(*zc.Conn, error) { front.Close() },
		}, func(back *zc.Conn, err error) {
			if err != nil {
				front.Close()
				return
			}
			front.SetHandler(zc.HandlerFuncs{
				Data:  func(_ *zc.Conn, d zc.Data) { back.SendData(d) },
				EOF:   func(*zc.Conn, error) { back.CloseWrite() },
				Close: func(*zc.Conn, error) { back.Close() },
			})
			front.SetReceivePaused(false)
		})
		return zc.HandlerFuncs{}
	})
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
	msg := bytes.Repeat([]byte("relay "), 100000)
	go func() { c.Write(msg); c.(*net.TCPConn).CloseWrite() }()
	got, err := io.ReadAll(c)
	fmt.Println(len(got) == len(msg), bytes.Equal(got, msg), err)
	// Output: true true <nil>
}
