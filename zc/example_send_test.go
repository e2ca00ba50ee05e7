package zc_test

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/zcnet/zcnet/zc"
)

// Starting an engine as the README writes it.
func ExampleNew() {
	// new:begin
	e, err := zc.New(zc.Config{}) // one queue per CPU, io_uring, adaptive zero-copy
	if err != nil {
		// a *zc.OpError (*zc.ConfigError for a bad Config); where io_uring is blocked New
		// falls back to zcshim, then plain, visibly: Stats().Fallback says why, and
		// Config.NoFallback forbids it
		fmt.Println(err)
		return
	}
	defer e.Close()
	// new:end
	fmt.Println(e.Config().MaxQueuedBytes > 0)
	// Output: true
}

// Sending from registered memory off the queue goroutines, as the README writes it: the
// peer (on Go's net) reads everything up to the FIN that Close sends after the bytes.
func ExampleConn_Send() {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	peer, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer peer.Close()
	got := make(chan string, 1)
	go func() {
		c, err := peer.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		b, err := io.ReadAll(c)
		got <- fmt.Sprintf("%s %v", b, err)
	}()
	conn, err := e.Dial(context.Background(), "tcp", peer.Addr().String(), zc.HandlerFuncs{})
	if err != nil {
		fmt.Println(err)
		return
	}
	payload := []byte("hello from registered memory")

	// send:begin
	// The handle is stale once Send returns; the buffer comes back to the pool when the
	// kernel is done with it (after the zero-copy notification).
	b, err := conn.BufferWait(0) // 0: wait as long as it takes for a free buffer
	if err != nil {
		fmt.Println(err)
		return
	}
	n := copy(b.Bytes(), payload)
	if err := conn.Send(b, n); err != nil {
		fmt.Println(err)
		return
	}
	// send:end
	conn.Close() // the queued bytes go out first, then the FIN
	fmt.Println(<-got)
	// Output: hello from registered memory <nil>
}
