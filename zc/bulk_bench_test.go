package zc

import (
	"context"
	"net"
	"testing"
)

// BenchmarkBulkZC and BenchmarkBulkNet move 64 KiB writes over one loopback connection
// (zc: a Writable sender on its queue, a handler that releases what it receives; net: a
// goroutine pair). b.SetBytes makes the output MB/s.

type sink struct {
	HandlerFuncs
	want, got int
	done      chan struct{}
}

func (s *sink) OnData(c *Conn, d Data) {
	s.got += d.Len()
	d.Release()
	if s.got >= s.want && s.done != nil {
		close(s.done)
		s.done = nil
	}
}

type source struct {
	HandlerFuncs
	left int
	size int
}

func (s *source) OnWritable(c *Conn) {
	for s.left > 0 {
		b, err := c.Buffer()
		if err != nil {
			return
		}
		n := min(s.size, s.left)
		if c.Send(b, n) != nil {
			return
		}
		s.left -= n
	}
}

func BenchmarkBulkZC(b *testing.B) {
	const size = 64 << 10
	srv, cli := newPair(b, Config{Queues: 1})
	k := &sink{want: b.N * size, done: make(chan struct{})}
	done := k.done
	l, err := srv.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return k })
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	s := &source{left: b.N * size, size: size}
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), s)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	b.ResetTimer()
	c.Post(func() { s.OnWritable(c) })
	<-done
	b.StopTimer()
	c.Close()
}

func BenchmarkBulkNet(b *testing.B) {
	const size = 64 << 10
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, size)
		for got := 0; got < b.N*size; {
			n, err := c.Read(buf)
			if err != nil {
				break
			}
			got += n
		}
		c.Close()
		close(done)
	}()
	var d net.Dialer
	d.SetMultipathTCP(false)
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, size)
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	<-done
	b.StopTimer()
}
