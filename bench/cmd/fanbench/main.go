// Command fanbench measures a pub/sub fan-out server: one publisher's stream of messages
// to N subscribers, every byte checked by the subscribers, server CPU per delivery (one
// message to one subscriber) from /proc/PID/stat. Servers (each its own process, started
// again every round, modes interleaved): zc with FanOut.PublishData (one received buffer
// shared by every subscriber), zc with a copy per subscriber (Conn.Write of the received
// bytes to each), and Go's net with a goroutine and a bounded channel per subscriber.
//
//	fanbench -subs 100 -size 64 -msgs 20000 -rounds 5
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/zcnet/zcnet/zc"
)

func main() {
	serve := flag.String("serve", "", "run a server of this mode (internal)")
	subs := flag.Int("subs", 100, "subscribers")
	size := flag.Int("size", 64, "message size (>= 8)")
	msgs := flag.Int("msgs", 20000, "messages per round")
	rounds := flag.Int("rounds", 5, "rounds (modes interleaved)")
	modes := flag.String("modes", "zc-shared,zc-copy,net", "modes")
	prof := flag.String("cpuprofile", "", "servers write a CPU profile to this file + mode (the last round's)")
	flag.Parse()
	profile = *prof
	if *serve != "" {
		if *prof != "" {
			f, err := os.Create(*prof + "." + *serve)
			if err == nil {
				pprof.StartCPUProfile(f)
				sig := make(chan os.Signal, 1)
				signal.Notify(sig, syscall.SIGTERM)
				go func() { <-sig; pprof.StopCPUProfile(); f.Close(); os.Exit(0) }()
			}
		}
		err := server(*serve, *subs) // returns only when it failed
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	res := map[string][]float64{}
	ms := strings.Split(*modes, ",")
	for r := 0; r < *rounds; r++ {
		for _, m := range ms {
			us, err := round(m, *subs, *size, *msgs)
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", m, err)
				os.Exit(1)
			}
			res[m] = append(res[m], us)
		}
	}
	fmt.Printf("%d subscribers, %d B messages, %d messages a round, %d rounds: server CPU per delivery (ns), median [min max]\n", *subs, *size, *msgs, *rounds)
	base := med(res["net"])
	for _, m := range ms {
		v := res[m]
		fmt.Printf("  %-10s %7.0f [%5.0f %5.0f]  %.2fx net\n", m, med(v), minOf(v), maxOf(v), med(v)/base)
	}
}

var profile string

func med(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
func minOf(v []float64) float64 { s := append([]float64(nil), v...); sort.Float64s(s); return s[0] }
func maxOf(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)-1]
}

// round runs one server of mode and returns its CPU per delivery in ns.
func round(mode string, nsubs, size, nmsgs int) (float64, error) {
	cmd := exec.Command(os.Args[0], "-serve", mode, "-subs", strconv.Itoa(nsubs), "-cpuprofile", profile)
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM) // a profiling server writes its profile
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}()
	var addr string
	if _, err := fmt.Fscanln(out, &addr); err != nil {
		return 0, fmt.Errorf("server address: %v", err)
	}
	var conns []net.Conn
	for i := 0; i < nsubs; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		conns = append(conns, c)
	}
	time.Sleep(50 * time.Millisecond) // every subscriber joined
	pub, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	time.Sleep(20 * time.Millisecond)
	cpu0 := procCPU(cmd.Process.Pid)
	var wg sync.WaitGroup
	errs := make(chan error, nsubs+1)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, size)
			for i := 0; i < nmsgs; i++ {
				c.SetReadDeadline(time.Now().Add(30 * time.Second))
				if _, err := io.ReadFull(c, p); err != nil {
					errs <- fmt.Errorf("message %d: %w", i, err)
					return
				}
				if err := check(p, uint64(i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	go func() {
		batch := make([]byte, 0, 64<<10)
		for i := 0; i < nmsgs; i++ {
			batch = batch[:len(batch)+size]
			fill(batch[len(batch)-size:], uint64(i))
			if len(batch)+size > cap(batch) || i == nmsgs-1 {
				if _, err := pub.Write(batch); err != nil {
					errs <- err
					return
				}
				batch = batch[:0]
			}
		}
	}()
	wg.Wait()
	cpu := procCPU(cmd.Process.Pid) - cpu0
	select {
	case err := <-errs:
		return 0, err
	default:
	}
	return float64(cpu.Nanoseconds()) / float64(nsubs*nmsgs), nil
}

func fill(p []byte, seq uint64) {
	binary.LittleEndian.PutUint64(p, seq)
	for i := 8; i < len(p); i++ {
		p[i] = byte(seq + uint64(i))
	}
}

func check(p []byte, seq uint64) error {
	if got := binary.LittleEndian.Uint64(p); got != seq {
		return fmt.Errorf("message %d where %d was due", got, seq)
	}
	for i := 8; i < len(p); i++ {
		if p[i] != byte(seq+uint64(i)) {
			return fmt.Errorf("message %d: byte %d wrong", seq, i)
		}
	}
	return nil
}

// procCPU is a process's user+system CPU time.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * time.Second / 100 // USER_HZ
}

// server serves until killed; it returns only an error.
func server(mode string, nsubs int) error {
	switch mode {
	case "net":
		return netServer(nsubs)
	case "zc-shared", "zc-copy":
		return zcServer(nsubs, mode == "zc-shared")
	}
	return fmt.Errorf("unknown mode %q", mode)
}

// netServer: Go's net as its users write a fan-out: a goroutine and a bounded channel per
// subscriber; the publisher's reader hands each chunk it read to every channel (the
// chunk is shared, never written again: a new one per read).
func netServer(nsubs int) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(l.Addr())
	var chans []chan []byte
	for i := 0; i < nsubs; i++ {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		ch := make(chan []byte, 64)
		chans = append(chans, ch)
		go func() {
			for p := range ch {
				if _, err := c.Write(p); err != nil {
					return
				}
			}
		}()
	}
	pub, err := l.Accept()
	if err != nil {
		return err
	}
	for {
		p := make([]byte, 32<<10)
		n, err := pub.Read(p)
		if n > 0 {
			for _, ch := range chans {
				ch <- p[:n]
			}
		}
		if err != nil {
			select {}
		}
	}
}

// zcServer: the event-loop face. shared: FanOut.PublishData, the publisher paused while a
// subscriber is at its bound. Copy: each subscriber gets a Write of the received bytes
// (copied into its send buffers); what a full subscriber refuses waits in a per-subscriber
// backlog sent from its OnWritable, and the publisher stops receiving meanwhile.
func zcServer(nsubs int, shared bool) error {
	e, err := zc.New(zc.Config{Queues: 1})
	if err != nil {
		return err
	}
	var mu sync.Mutex
	var pub *zc.Conn
	var held []zc.Data
	var fan *zc.FanOut
	resume := func() {
		mu.Lock()
		defer mu.Unlock()
		for len(held) > 0 {
			if err := fan.PublishData(held[0]); errors.Is(err, zc.ErrWouldBlock) {
				return
			}
			held = held[1:]
		}
		pub.SetReceivePaused(false)
	}
	fan, _ = zc.NewFanOut(zc.FanOutOptions{MaxQueued: 256 << 10, OnReady: func() { pub.Post(resume) }})
	// copy mode: per-subscriber backlog
	type sub struct {
		c       *zc.Conn
		backlog [][]byte
	}
	var subs []*sub
	blocked := 0
	flushSub := func(s *sub) {
		for len(s.backlog) > 0 {
			p := s.backlog[0]
			n, err := s.c.Write(p)
			if err != nil {
				s.backlog[0] = p[n:]
				return
			}
			s.backlog = s.backlog[1:]
		}
		if s.backlog != nil {
			s.backlog = nil
			blocked--
			if blocked == 0 {
				pub.SetReceivePaused(false)
			}
		}
	}
	n := 0
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *zc.Conn) zc.Handler {
		mu.Lock()
		defer mu.Unlock()
		n++
		if n <= nsubs {
			if shared {
				fan.Add(c)
				return zc.HandlerFuncs{}
			}
			s := &sub{c: c}
			subs = append(subs, s)
			return zc.HandlerFuncs{Writable: func(c *zc.Conn) {
				mu.Lock()
				flushSub(s)
				mu.Unlock()
			}}
		}
		pub = c
		return zc.HandlerFuncs{Data: func(c *zc.Conn, d zc.Data) {
			mu.Lock()
			defer mu.Unlock()
			if shared {
				if len(held) == 0 {
					if err := fan.PublishData(d); !errors.Is(err, zc.ErrWouldBlock) {
						return
					}
				}
				held = append(held, d)
				c.SetReceivePaused(true)
				return
			}
			p := d.Bytes()
			for _, s := range subs {
				if s.backlog != nil {
					s.backlog = append(s.backlog, append([]byte(nil), p...))
					continue
				}
				k, err := s.c.Write(p)
				if err != nil {
					s.backlog = [][]byte{append([]byte(nil), p[k:]...)}
					blocked++
				}
			}
			d.Release()
			if blocked > 0 {
				c.SetReceivePaused(true)
			}
		}}
	})
	if err != nil {
		return err
	}
	fmt.Println(l.Addr())
	select {}
}
