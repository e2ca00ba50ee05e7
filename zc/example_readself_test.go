package zc_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/zcnet/zcnet/zc"
)

// A request/response server that reads its sockets itself (ListenOptions.ReadSelf): a
// goroutine per connection reads lines with bufio over Conn.Read (read(2) in Go's poller, as
// over a *net.TCPConn) and answers with Conn.Write; zc never receives for these
// connections, so the handler has nothing to do but report the close.
func ExampleListenOptions_readSelf() {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	// readself:begin
	serve := func(c *zc.Conn) {
		defer c.Close()
		r := bufio.NewReader(c) // *zc.Conn is an io.Reader on a ReadSelf connection
		for {
			c.SetReadDeadline(time.Now().Add(time.Minute)) // an idle client goes away
			line, err := r.ReadString('\n')
			if err != nil {
				return // io.EOF, the deadline, Close or Engine.Close
			}
			if _, err := c.Write([]byte(strings.ToUpper(line))); err != nil {
				return
			}
		}
	}
	ln, err := e.Listen("tcp", "127.0.0.1:0",
		func(c *zc.Conn) zc.Handler {
			go serve(c)
			return zc.HandlerFuncs{}
		}, zc.ListenOptions{ReadSelf: true})
	// readself:end
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ln.Close()

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for _, q := range []string{"hello\n", "zero copy\n"} {
		conn.Write([]byte(q))
		a, err := br.ReadString('\n')
		fmt.Printf("%q %v\n", a, err)
	}
	// Output:
	// "HELLO\n" <nil>
	// "ZERO COPY\n" <nil>
}
