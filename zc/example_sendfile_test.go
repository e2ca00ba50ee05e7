package zc_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

	"github.com/zcnet/zcnet/zc"
)

// A file streamed to a client: a header with Write, the file's bytes with SendFile
// (sendfile(2) from the page cache, in order with the Write), then the FIN.
func ExampleConn_SendFile() {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()

	dir, _ := os.MkdirTemp("", "sendfile")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "greeting.txt")
	os.WriteFile(path, []byte("hello from the page cache\n"), 0o600)

	// The client, on Go's net.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()

	c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), zc.HandlerFuncs{})
	if err != nil {
		fmt.Println(err)
		return
	}
	f, err := os.Open(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	// sendfile:begin
	st, _ := f.Stat()
	// A header, then the file, in order. Here (not on a queue goroutine) a Write waits for
	// send buffers; in a handler it returns ErrWouldBlock instead: keep the request and
	// send from OnWritable (see ExampleWritable).
	if _, err := c.Write([]byte("200 OK\n")); err != nil {
		fmt.Println(err)
		return
	}
	if err := c.SendFile(f, 0, st.Size()); err != nil {
		fmt.Println(err)
		return
	}
	f.Close() // SendFile holds its own descriptor
	c.CloseWrite()
	// sendfile:end
	fmt.Print(<-got)
	fmt.Println(e.Stats().Send.BytesFile, "bytes by sendfile")
	// Output:
	// 200 OK
	// hello from the page cache
	// 26 bytes by sendfile
}
