package zc_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"

	"github.com/zcnet/zcnet/zc"
)

// Sending from the application's own memory, as the README writes it: each request is
// answered with a header line written with Write (copied into a send buffer) and a body
// sent from a slice the application keeps, with no copy into the send pool; both leave
// in one send. The callback says when the kernel no longer needs the slice.
func ExampleConn_SendBytes() {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	page := bytes.Repeat([]byte("zc"), 32<<10) // 64 KiB the application keeps
	sent := make(chan error, 1)
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *zc.Conn) zc.Handler {
		return zc.HandlerFuncs{Data: func(c *zc.Conn, d zc.Data) {
			d.Release() // any request: answer with the page
			// sendbytes:begin
			// The header is copied into a send buffer; the body goes from page itself, in
			// the same send. page must not be written until the callback runs (on this
			// queue's goroutine, like a handler: it must not block).
			fmt.Fprintf(c, "%d\n", len(page))
			if err := c.SendBytes(page, func(err error) { sent <- err }); err != nil {
				c.Close() // refused (closed connection, empty page): nothing queued
			}
			// sendbytes:end
		}}
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET\n")
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		fmt.Println(err)
		return
	}
	n, _ := strconv.Atoi(strings.TrimSpace(line))
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(n, bytes.Equal(body, page), <-sent)
	// Output: 65536 true <nil>
}
