// Command capbench measures what packet capture (bpf/capture) costs the
// flows it records: zc traffic across a veth pair between two network
// namespaces, with capture off and on, interleaved and repeated, reported
// as ratios of medians against "off".
//
// Variants (each run is a fresh connection set; every variant runs once per
// round, rounds repeat):
//
//	off      no capture program attached
//	nomatch  the capture programs attached, selecting a flow that does not
//	         exist: what the programs cost every packet of other flows
//	headers  the listener's flows captured at tc ingress + egress of the
//	         server's veth, snap 128 bytes (headers), written as pcapng
//	full     the same with whole packets (snap 256 KiB)
//
// Scenarios:
//
//	bulk  one connection, 64 KiB writes for -d: Gbit/s received by the
//	      server, process CPU seconds per GB
//	echo  64 connections, one 64-byte message in flight on each, echoed by
//	      the server: messages/s, process CPU microseconds per message
//
// The pcapng goes to a file in -dir (default /dev/shm, memory), deleted
// after each run. Needs root (namespaces, BPF). Usage:
//
//	go run ./bench/cmd/capbench [-d 2s] [-reps 5] [-dir /dev/shm]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bench/internal/netns"
	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/bpf/capture"
	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/netconn"
)

var (
	dur     = flag.Duration("d", 2*time.Second, "traffic time of one run")
	reps    = flag.Int("reps", 5, "rounds (variants interleaved in each)")
	dir     = flag.String("dir", "/dev/shm", "directory for the pcapng files (deleted after each run)")
	conns   = flag.Int("conns", 64, "connections of the echo scenario")
	only    = flag.String("only", "", "run only these variants (comma-separated: off,nomatch,headers,full)")
	scenOne = flag.String("scenario", "", "run only this scenario (bulk or echo)")
	cpuProf = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
)

type variant struct {
	name  string
	snap  int  // 0: capture off
	other bool // select another port: the programs run for every packet, none matches
}

var variants = []variant{{"off", 0, false}, {"nomatch", 128, true}, {"headers", 128, false}, {"full", capture.MaxSnap, false}}

// result of one run.
type result struct {
	rate     float64 // Gbit/s (bulk) or messages/s (echo)
	cpuPer   float64 // CPU s per GB (bulk) or CPU us per message (echo)
	captured uint64
	dropped  uint64
	bytes    int64
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "capbench:", err)
		os.Exit(1)
	}
}

func run() error {
	if *only != "" {
		var keep []variant
		for _, v := range variants {
			if slices.Contains(strings.Split(*only, ","), v.name) {
				keep = append(keep, v)
			}
		}
		if len(keep) == 0 || keep[0].name != "off" {
			return fmt.Errorf("-only %q: the first variant must be off (the ratios' base)", *only)
		}
		variants = keep
	}
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if _, err := os.Stat(*dir); err != nil {
		*dir = os.TempDir()
	}
	p, err := netns.Create()
	if err != nil {
		return err
	}
	defer p.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		<-sig
		p.Close()
		os.Exit(1)
	}()

	e, err := zc.New(zc.Config{})
	if err != nil {
		return err
	}
	defer e.Close()
	var bulkAddr, echoAddr netip.AddrPort
	var ifindex int
	err = inNS(p.ServerNS, func() error {
		ifi, err := net.InterfaceByName("zcb0")
		if err != nil {
			return err
		}
		ifindex = ifi.Index
		if bulkAddr, err = serve(e, sink); err != nil {
			return err
		}
		echoAddr, err = serve(e, echo)
		return err
	})
	if err != nil {
		return err
	}

	var u unix.Utsname
	unix.Uname(&u)
	fmt.Printf("capbench: zc over a veth pair between two namespaces, %d CPUs, Linux %s, %v per run, %d rounds\n",
		runtime.NumCPU(), unix.ByteSliceToString(u.Release[:]), *dur, *reps)
	scenarios := []struct {
		name string
		addr netip.AddrPort
		fn   func(netip.AddrPort) (result, error)
	}{
		{"bulk", bulkAddr, func(a netip.AddrPort) (result, error) { return bulk(e, p.ClientNS, a) }},
		{"echo", echoAddr, func(a netip.AddrPort) (result, error) { return echoLoad(e, p.ClientNS, a) }},
	}
	for _, sc := range scenarios {
		if *scenOne != "" && sc.name != *scenOne {
			continue
		}
		res := map[string][]result{}
		for r := 0; r < *reps; r++ {
			for _, v := range variants {
				x, err := runOne(p.ServerNS, ifindex, sc.addr, v, sc.fn)
				if err != nil {
					return fmt.Errorf("%s %s: %w", sc.name, v.name, err)
				}
				res[v.name] = append(res[v.name], x)
				fmt.Fprintf(os.Stderr, "  %s %-7s round %d: %.3g (cpu %.3g) captured %d dropped %d\n", sc.name, v.name, r+1, x.rate, x.cpuPer, x.captured, x.dropped)
			}
		}
		report(sc.name, res)
	}
	return nil
}

// runOne runs one variant of a scenario, capturing when v.snap > 0.
func runOne(srvNS *os.File, ifindex int, addr netip.AddrPort, v variant, load func(netip.AddrPort) (result, error)) (result, error) {
	var c *capture.Capture
	var path string
	if v.snap > 0 {
		f, err := os.CreateTemp(*dir, "capbench-*.pcapng")
		if err != nil {
			return result{}, err
		}
		path = f.Name()
		defer os.Remove(path)
		defer f.Close()
		sel := capture.Listener(addr)
		if v.other {
			sel = capture.Flow(bpf.FlowKey{Remote: netip.MustParseAddrPort(netns.ClientIP + ":1"), Local: addr})
		}
		err = inNS(srvNS, func() (err error) {
			c, err = capture.New(f, capture.Options{Interfaces: []int{ifindex}, Snap: v.snap, RingSize: 16 << 20}, sel)
			return err
		})
		if err != nil {
			return result{}, err
		}
	}
	x, err := load(addr)
	if c != nil {
		if cerr := c.Close(); cerr != nil && err == nil {
			err = cerr
		}
		st, _ := c.Stats()
		x.captured, x.dropped = st.Written, st.Dropped
	}
	return x, err
}

// serve listens on the server address with zc's net.Listener face and
// runs handle for each connection.
func serve(e *zc.Engine, handle func(net.Conn)) (netip.AddrPort, error) {
	ln, err := netconn.Listen(e, "tcp", netns.ServerIP+":0")
	if err != nil {
		return netip.AddrPort{}, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort(), nil
}

// sink reads and counts until EOF, then answers with the byte count
// (8 bytes), so the client knows what arrived.
func sink(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 256<<10)
	var n uint64
	for {
		k, err := c.Read(buf)
		n += uint64(k)
		if err != nil {
			break
		}
	}
	var b [8]byte
	for i := range b {
		b[i] = byte(n >> (8 * i))
	}
	c.Write(b[:])
}

func echo(c net.Conn) {
	defer c.Close()
	io.Copy(c, c)
}

func dial(e *zc.Engine, ns *os.File, addr netip.AddrPort) (netconn.Conn, error) {
	var c netconn.Conn
	err := inNS(ns, func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err = netconn.Dial(ctx, e, "tcp", addr.String())
		return err
	})
	return c, err
}

func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// bulk: one connection writes 64 KiB blocks for -d; the rate is what the
// server received over the time until its count came back.
func bulk(e *zc.Engine, ns *os.File, addr netip.AddrPort) (result, error) {
	c, err := dial(e, ns, addr)
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	cpu0, t0 := cpuTime(), time.Now()
	var sent int64
	for time.Since(t0) < *dur {
		k, err := c.Write(buf)
		sent += int64(k)
		if err != nil {
			return result{}, err
		}
	}
	if err := c.CloseWrite(); err != nil {
		return result{}, err
	}
	var b [8]byte
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return result{}, fmt.Errorf("server's count: %w", err)
	}
	el, cpu := time.Since(t0), cpuTime()-cpu0
	var got int64
	for i := range b {
		got |= int64(b[i]) << (8 * i)
	}
	if got != sent {
		return result{}, fmt.Errorf("sent %d bytes, the server received %d", sent, got)
	}
	return result{rate: float64(got) * 8 / el.Seconds() / 1e9, cpuPer: cpu.Seconds() / (float64(got) / 1e9), bytes: got}, nil
}

// echoLoad: -conns connections, each with one 64-byte message in flight,
// for -d; every echoed message is checked.
func echoLoad(e *zc.Engine, ns *os.File, addr netip.AddrPort) (result, error) {
	cs := make([]netconn.Conn, *conns)
	for i := range cs {
		c, err := dial(e, ns, addr)
		if err != nil {
			return result{}, err
		}
		defer c.Close()
		cs[i] = c
	}
	var msgs atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, len(cs))
	cpu0, t0 := cpuTime(), time.Now()
	stop := t0.Add(*dur)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := make([]byte, 64)
			got := make([]byte, 64)
			c.SetDeadline(stop.Add(10 * time.Second))
			for n := 0; time.Now().Before(stop); n++ {
				msg[0], msg[1], msg[2] = byte(i), byte(n), byte(n>>8)
				if _, err := c.Write(msg); err != nil {
					errc <- err
					return
				}
				if _, err := io.ReadFull(c, got); err != nil {
					errc <- err
					return
				}
				if string(got) != string(msg) {
					errc <- errors.New("echo differs")
					return
				}
				msgs.Add(1)
			}
		}()
	}
	wg.Wait()
	el, cpu := time.Since(t0), cpuTime()-cpu0
	select {
	case err := <-errc:
		return result{}, err
	default:
	}
	n := float64(msgs.Load())
	return result{rate: n / el.Seconds(), cpuPer: cpu.Seconds() * 1e6 / n}, nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func report(name string, res map[string][]result) {
	unit, cunit := "Gbit/s", "CPU s/GB"
	if name == "echo" {
		unit, cunit = "msg/s", "CPU us/msg"
	}
	fmt.Printf("\n%s\n%-8s %12s %17s %7s %12s %7s %10s %8s\n", name, "capture", unit+" (med)", "min-max", "ratio", cunit, "ratio", "captured", "dropped")
	base := res["off"]
	var bRate, bCPU []float64
	for _, x := range base {
		bRate = append(bRate, x.rate)
		bCPU = append(bCPU, x.cpuPer)
	}
	for _, v := range variants {
		var rate, cpu []float64
		var capd, drop uint64
		for _, x := range res[v.name] {
			rate = append(rate, x.rate)
			cpu = append(cpu, x.cpuPer)
			capd += x.captured
			drop += x.dropped
		}
		fmt.Printf("%-8s %12.4g %8.4g-%-8.4g %7.3f %12.4g %7.3f %10d %8d\n", v.name, median(rate), slices.Min(rate), slices.Max(rate),
			median(rate)/median(bRate), median(cpu), median(cpu)/median(bCPU), capd, drop)
	}
}

// inNS runs fn on a thread switched into the namespace; the thread is
// discarded afterwards (sockets made there stay in the namespace).
func inNS(ns *os.File, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- os.NewSyscallError("setns", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
