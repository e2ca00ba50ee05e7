package netconn_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/netconn"
)

// net/http on the net.Conn face, as the README writes it: a server on Listen, a client of
// Go's net.
func Example() {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello over zc\n")
	})

	// netlisten:begin
	ln, err := netconn.Listen(e, "tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	go http.Serve(ln, handler) // returns once ln (or the engine) is closed
	// netlisten:end
	defer ln.Close()

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		fmt.Println(err)
		return
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Print(string(body))
	fmt.Println(err)
	// Output:
	// hello over zc
	// <nil>
}

// A client on the face: Dial returns a net.Conn (here to a server of Go's net that echoes a
// line), and Zc gives the zc.Conn underneath (counters, socket options).
func ExampleDial() {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	go func() {
		c, err := srv.Accept()
		if err == nil {
			line, _ := bufio.NewReader(c).ReadString('\n') // an echo of one line
			c.Write([]byte(line))
			c.Close()
		}
	}()

	c, err := netconn.Dial(context.Background(), e, "tcp", srv.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	fmt.Fprintln(c, "hello")
	line, err := bufio.NewReader(c).ReadString('\n')
	fmt.Print(line)
	fmt.Println(err, c.Zc().Stats().BytesRecv)
	// Output:
	// hello
	// <nil> 6
}
