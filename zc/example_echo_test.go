package zc_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"

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

// TestReadmeEcho: README.md's echo is Example_echo's, line for line.
func TestReadmeEcho(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_echo_test.go")
	if err != nil {
		t.Fatal(err)
	}
	norm := func(s, begin, end string) string {
		i, j := strings.Index(s, begin), strings.Index(s, end)
		if i < 0 || j < i {
			t.Fatalf("markers %q..%q not found", begin, end)
		}
		var out []string
		for _, l := range strings.Split(s[i+len(begin):j], "\n") {
			l = strings.Join(strings.Fields(l), " ")
			if l != "" && !strings.HasPrefix(l, "```") {
				out = append(out, l)
			}
		}
		return strings.Join(out, "\n")
	}
	ex := norm(string(src), "// echo:begin", "// echo:end")
	doc := norm(string(readme), "<!-- echo:begin -->", "<!-- echo:end -->")
	if ex != doc {
		t.Fatalf("README.md's echo differs from Example_echo's:\nREADME:\n%s\n\nexample:\n%s", doc, ex)
	}
}
