package zc

import (
	"context"
	"io"
	"net"
	"sort"
	"testing"
	"time"
)

// BenchmarkPingPongZC and BenchmarkPingPongNet compare one 64-byte round trip over loopback,
// zc loop-driven against Go net, in one process (ns/op, p50-us, p99-us; compare with
// benchstat, never in tests).

// pinger bounces a 64-byte message off an echo server from its OnData, on the loop.
type pinger struct {
	HandlerFuncs
	left  int
	start time.Time
	lat   []time.Duration
	done  chan struct{}
	got   int
	err   error
}

func (p *pinger) send(c *Conn) {
	p.start = time.Now()
	b, err := c.Buffer()
	if err == nil {
		err = c.Send(b, 64)
	}
	if err != nil {
		p.err = err
		close(p.done)
	}
}

func (p *pinger) OnData(c *Conn, d Data) {
	p.got += d.Len()
	d.Release()
	if p.got < 64 {
		return
	}
	p.got -= 64
	p.lat = append(p.lat, time.Since(p.start))
	p.left--
	if p.left == 0 {
		close(p.done)
		return
	}
	p.send(c)
}

func report(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
}

func BenchmarkPingPongZC(b *testing.B) {
	srv, cli := newPair(b, Config{Queues: 1})
	l, err := srv.Listen("tcp", "127.0.0.1:0", echoAccept)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	p := &pinger{left: b.N, done: make(chan struct{})}
	c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), p)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	c.Post(func() { p.send(c) })
	<-p.done
	b.StopTimer()
	if p.err != nil {
		b.Fatal(p.err)
	}
	report(b, p.lat)
	c.Close()
}

func BenchmarkPingPongNet(b *testing.B) {
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
	}()
	var d net.Dialer
	d.SetMultipathTCP(false)
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t := time.Now()
		c.Write(buf)
		io.ReadFull(c, buf)
		lat = append(lat, time.Since(t))
	}
	b.StopTimer()
	report(b, lat)
}
