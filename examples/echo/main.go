// Command echo is a zcnet echo server: every received buffer is sent back as is
// (Conn.SendData, no copy in user space). It prints the engine's counters on SIGINT/SIGTERM.
//
//	go run ./examples/echo -addr 127.0.0.1:9000
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/zcnet/zcnet/zc"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "listen address")
	queues := flag.Int("queues", 0, "queues (0: one per CPU)")
	noFallback := flag.Bool("no-fallback", false, "fail instead of falling back to plain sockets")
	flag.Parse()

	e, err := zc.New(zc.Config{Queues: *queues, NoFallback: *noFallback,
		OnFallback: func(reason error) { log.Printf("falling back to plain sockets: %v", reason) }})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	l, err := e.Listen("tcp", *addr, func(c *zc.Conn) zc.Handler {
		return zc.HandlerFuncs{
			Data: func(c *zc.Conn, d zc.Data) {
				if err := c.SendData(d); err != nil {
					c.Close()
				}
			},
			EOF: func(c *zc.Conn, err error) { c.Close() },
		}
	})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	log.Printf("echo on %s (backend %s, steering: %s)", l.Addr(), e.Config().Backend, steering(l))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	fmt.Printf("%+v\n", e.Stats())
}

func steering(l *zc.Listener) string {
	if l.Steering() != nil {
		return "bpf"
	}
	if r := l.Stats().Steering.Fallback; r != "" {
		return "reuseport hash (" + r + ")"
	}
	return "reuseport hash"
}
