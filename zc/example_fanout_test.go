package zc_test

import (
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/zcnet/zcnet/zc"
)

// A fan-out as a pub/sub server writes it: subscribers join a FanOut as they connect, and
// each message is one buffer sent to all of them without a copy. Under FanOutPause a
// subscriber at its bound makes Publish return ErrWouldBlock (the message stays the
// publisher's) until OnReady says every subscriber drained.
func Example_fanOut() {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()

	// fanout:begin
	ready := make(chan struct{}, 1)
	fan, _ := zc.NewFanOut(zc.FanOutOptions{
		Policy:    zc.FanOutPause,
		MaxQueued: 64 << 10, // per subscriber
		OnReady: func() { // on a queue goroutine: must not block
			select {
			case ready <- struct{}{}:
			default:
			}
		},
	})
	joined := make(chan *zc.Conn, 3)
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *zc.Conn) zc.Handler {
		fan.Add(c) // leaves by itself when it closes
		joined <- c
		return zc.HandlerFuncs{}
	})
	// fanout:end
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()

	// Three subscribers, on Go's net.
	var subs []net.Conn
	for i := 0; i < 3; i++ {
		nc, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			fmt.Println(err)
			return
		}
		defer nc.Close()
		subs = append(subs, nc)
	}
	var c *zc.Conn
	for range subs {
		c = <-joined
	}

	// The publisher, a goroutine here: one buffer per message, shared by every subscriber.
	// publish:begin
	for _, msg := range []string{"hello ", "fan ", "out\n"} {
		b, err := c.BufferWait(0) // any connection's buffer serves
		if err != nil {
			fmt.Println(err)
			return
		}
		n := copy(b.Bytes(), msg)
		for {
			err = fan.Publish(b, n)
			if !errors.Is(err, zc.ErrWouldBlock) {
				break
			}
			<-ready // b is still ours: publish it again
		}
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	// publish:end
	for i, nc := range subs {
		p := make([]byte, len("hello fan out\n"))
		if _, err := io.ReadFull(nc, p); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("subscriber %d: %s", i, p)
	}
	st := fan.Stats()
	fmt.Println("deliveries:", st.Deliveries, "drops:", st.Drops)
	// Output:
	// subscriber 0: hello fan out
	// subscriber 1: hello fan out
	// subscriber 2: hello fan out
	// deliveries: 9 drops: 0
}
