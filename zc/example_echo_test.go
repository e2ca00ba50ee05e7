package zc_test

import (
	"bytes"
	"fmt"
	"io"
	"net"

	"github.com/zcnet/zcnet/zc"
)

// An echo server as the README writes it: received buffers are sent back as they are
// (SendData, no copy); the peer's end of stream closes the connection once the echo is out.
// The client here half-closes first and then reads everything back.
func Example_echo() {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()

	// echo:begin
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *zc.Conn) zc.Handler {
		return zc.HandlerFuncs{
			Data: func(c *zc.Conn, d zc.Data) { c.SendData(d) }, // echo without copying: the
			// receive buffer is sent as is
			EOF: func(c *zc.Conn, err error) { c.Close() },
		}
	})
	// echo:end
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
	msg := bytes.Repeat([]byte("echo "), 1<<20)
	go func() { c.Write(msg); c.(*net.TCPConn).CloseWrite() }()
	got, err := io.ReadAll(c)
	fmt.Println(bytes.Equal(got, msg), err)
	// Output: true <nil>
}
