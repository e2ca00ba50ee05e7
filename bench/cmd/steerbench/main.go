// Command steerbench measures what flow steering buys on this machine: a
// 64-connection TCP echo over loopback, served by one queue thread per CPU
// (each locked to its CPU, one epoll each, like zc's queues), in three
// setups:
//
//	single     one listener; its queue hands accepted connections to the
//	           queues round-robin
//	reuseport  one listener per queue, kernel SO_REUSEPORT hashing
//	steering   one listener per queue, the zc_reuseport program with
//	           PolicyCPU: a connection goes to the queue of the CPU that
//	           processed its SYN (on loopback: the client's CPU)
//	zc-hash    a zc engine (one io_uring queue per CPU, pinned by zc) echoing
//	           with SendData, BPF steering with SteerPolicy = PolicyHash
//	zc-cpu     the same engine with zc's default Config: the CPU policy, its
//	           CPU→queue map filled by zc from the queues' placement
//
// The zc setups print the listener's steering (ListenerStats.SteeringSummary) once.
//
// Client threads are pinned too (connections spread over CPUs), each
// connection does closed-loop ping-pong with small messages. It prints
// requests/s, latency percentiles and how many connections ended up served
// on the CPU their client runs on ("local"). Needs root for the steering
// setup. Usage: go run ./bench/cmd/steerbench [-conns 64] [-d 3s] [-rounds 3]
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/zc"
	"golang.org/x/sys/unix"
)

var (
	nconns  = flag.Int("conns", 64, "connections")
	dur     = flag.Duration("d", 3*time.Second, "duration of one run")
	rounds  = flag.Int("rounds", 3, "rounds (setups interleaved)")
	msgSize = flag.Int("size", 64, "message size in bytes")
	setupsF = flag.String("setups", "single,reuseport,steering,zc-hash,zc-cpu", "comma-separated setups")
)

func pin(cpu int) {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	unix.SchedSetaffinity(0, &set)
}

func listener(port int) (int, int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_TCP)
	if err != nil {
		return -1, 0, err
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: port}); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	if err := unix.Listen(fd, 1024); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	sa, _ := unix.Getsockname(fd)
	return fd, sa.(*unix.SockaddrInet4).Port, nil
}

// server is one queue: a thread locked to cpu running an epoll echo loop.
type server struct {
	cpu     int
	ep      int
	lfd     int // -1 if this queue has no listener
	handoff func(fd int) bool
	conns   atomic.Int64
	stop    atomic.Bool
	fds     []int
	mu      sync.Mutex
}

func (s *server) add(fd int) {
	s.mu.Lock()
	s.fds = append(s.fds, fd)
	s.mu.Unlock()
	s.conns.Add(1)
	unix.EpollCtl(s.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
}

func (s *server) run(wg *sync.WaitGroup) {
	defer wg.Done()
	pin(s.cpu)
	evs := make([]unix.EpollEvent, 128)
	buf := make([]byte, 64<<10)
	for !s.stop.Load() {
		n, err := unix.EpollWait(s.ep, evs, 50)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		for _, ev := range evs[:max(n, 0)] {
			fd := int(ev.Fd)
			if fd == s.lfd {
				for {
					c, _, err := unix.Accept4(fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
					if err != nil {
						break
					}
					unix.SetsockoptInt(c, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
					if s.handoff == nil || !s.handoff(c) {
						s.add(c)
					}
				}
				continue
			}
			m, err := unix.Read(fd, buf)
			if m > 0 {
				unix.Write(fd, buf[:m])
			} else if err == nil || !errors.Is(err, unix.EAGAIN) {
				unix.EpollCtl(s.ep, unix.EPOLL_CTL_DEL, fd, nil)
			}
		}
	}
}

type result struct {
	reqs      int64
	lat       []time.Duration
	local, nc int
}

// client drives conns from a thread locked to cpu.
func client(cpu, n, port int, d time.Duration, servedOn func(localPort int) int, out chan<- result) {
	pin(cpu)
	defer runtime.UnlockOSThread()
	var r result
	ep, _ := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	defer unix.Close(ep)
	type cst struct {
		fd   int
		sent time.Time
		got  int
	}
	cs := map[int32]*cst{}
	var ports []int
	for i := 0; i < n; i++ {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if err != nil {
			continue
		}
		if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: port}); err != nil {
			unix.Close(fd)
			continue
		}
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		unix.SetNonblock(fd, true)
		sa, _ := unix.Getsockname(fd)
		ports = append(ports, sa.(*unix.SockaddrInet4).Port)
		cs[int32(fd)] = &cst{fd: fd}
		unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
	}
	time.Sleep(100 * time.Millisecond) // let the servers accept
	for _, p := range ports {
		r.nc++
		if servedOn(p) == cpu {
			r.local++
		}
	}
	msg := make([]byte, *msgSize)
	buf := make([]byte, 64<<10)
	for _, c := range cs {
		c.sent = time.Now()
		unix.Write(c.fd, msg)
	}
	evs := make([]unix.EpollEvent, 128)
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		n, err := unix.EpollWait(ep, evs, 20)
		if err != nil && !errors.Is(err, unix.EINTR) {
			break
		}
		for _, ev := range evs[:max(n, 0)] {
			c := cs[ev.Fd]
			m, _ := unix.Read(c.fd, buf)
			if m <= 0 {
				continue
			}
			c.got += m
			if c.got >= len(msg) {
				c.got = 0
				now := time.Now()
				r.reqs++
				if r.reqs%8 == 0 {
					r.lat = append(r.lat, now.Sub(c.sent))
				}
				c.sent = now
				unix.Write(c.fd, msg)
			}
		}
	}
	for _, c := range cs {
		unix.Close(c.fd)
	}
	out <- r
}

// runZC serves with a zc engine of ncpu queues: "zc-cpu" with the default Config (CPU
// policy where the queues are pinned), "zc-hash" with SteerPolicy = PolicyHash.
func runZC(setup string, ncpu int, report bool) (float64, time.Duration, time.Duration, float64, error) {
	cfg := zc.Config{Queues: ncpu, Steering: zc.SteerBPF}
	if setup == "zc-hash" {
		cfg.SteerPolicy = bpf.PolicyHash
	}
	e, err := zc.New(cfg)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer e.Close()
	var servedBy sync.Map // client port -> CPU of the queue serving it
	var qcpu []int
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *zc.Conn) zc.Handler {
		servedBy.Store(c.RemoteAddr().(*net.TCPAddr).Port, qcpu[c.Stats().Queue])
		return zc.HandlerFuncs{
			Data: func(c *zc.Conn, d zc.Data) { c.SendData(d) },
			EOF:  func(c *zc.Conn, err error) { c.Close() },
		}
	})
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer l.Close()
	lst := l.Stats()
	qcpu = lst.Steering.QueueCPUs
	if report {
		fmt.Printf("%s steering: %s\n", setup, lst.SteeringSummary)
	}
	servedOn := func(cport int) int {
		if v, ok := servedBy.Load(cport); ok {
			return v.(int)
		}
		return -1
	}
	return drive(ncpu, l.Addr().(*net.TCPAddr).Port, servedOn)
}

func run(setup string, ncpu int, report bool) (float64, time.Duration, time.Duration, float64, error) {
	if strings.HasPrefix(setup, "zc-") {
		return runZC(setup, ncpu, report)
	}
	nq := ncpu
	servers := make([]*server, nq)
	var lfds []int
	port := 0
	defer func() {
		for _, fd := range lfds {
			unix.Close(fd)
		}
	}()
	for q := range servers {
		ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return 0, 0, 0, 0, err
		}
		defer unix.Close(ep)
		servers[q] = &server{cpu: q % ncpu, ep: ep, lfd: -1}
		if setup == "single" && q > 0 {
			continue
		}
		fd, p, err := listener(port)
		if err != nil {
			return 0, 0, 0, 0, err
		}
		port = p
		lfds = append(lfds, fd)
		servers[q].lfd = fd
		unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
	}
	var rr atomic.Int64
	if setup == "single" {
		servers[0].handoff = func(fd int) bool {
			q := int(rr.Add(1)) % nq
			servers[q].add(fd)
			return true
		}
	}
	if setup == "steering" {
		s, err := bpf.NewSteering(lfds, &bpf.Options{Policy: bpf.PolicyCPU})
		if err != nil {
			return 0, 0, 0, 0, err
		}
		defer s.Close()
		for c := 0; c < ncpu; c++ {
			if err := s.SetCPUQueue(c, c); err != nil {
				return 0, 0, 0, 0, err
			}
		}
	}
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Add(1)
		go s.run(&wg)
	}
	// servedOn: which CPU's queue serves the connection with this client port.
	servedOn := func(cport int) int {
		for _, s := range servers {
			s.mu.Lock()
			fds := append([]int(nil), s.fds...)
			s.mu.Unlock()
			for _, fd := range fds {
				if sa, err := unix.Getpeername(fd); err == nil && sa.(*unix.SockaddrInet4).Port == cport {
					return s.cpu
				}
			}
		}
		return -1
	}
	defer func() {
		for _, s := range servers {
			s.stop.Store(true)
		}
		wg.Wait()
		for _, s := range servers {
			for _, fd := range s.fds {
				unix.Close(fd)
			}
		}
	}()
	return drive(ncpu, port, servedOn)
}

// drive runs the pinned clients against port and sums their results.
func drive(ncpu, port int, servedOn func(int) int) (float64, time.Duration, time.Duration, float64, error) {
	out := make(chan result, ncpu)
	per := *nconns / ncpu
	for c := 0; c < ncpu; c++ {
		n := per
		if c == ncpu-1 {
			n = *nconns - per*(ncpu-1)
		}
		go client(c, n, port, *dur, servedOn, out)
	}
	var all result
	for c := 0; c < ncpu; c++ {
		r := <-out
		all.reqs += r.reqs
		all.lat = append(all.lat, r.lat...)
		all.local += r.local
		all.nc += r.nc
	}
	sort.Slice(all.lat, func(i, j int) bool { return all.lat[i] < all.lat[j] })
	var p50, p99 time.Duration
	if len(all.lat) > 0 {
		p50 = all.lat[len(all.lat)/2]
		p99 = all.lat[len(all.lat)*99/100]
	}
	return float64(all.reqs) / dur.Seconds(), p50, p99, float64(all.local) / float64(max(all.nc, 1)), nil
}

func main() {
	flag.Parse()
	ncpu := runtime.NumCPU()
	fmt.Printf("steerbench: %d CPUs, %d connections, %d-byte ping-pong, %v per run, %d rounds\n", ncpu, *nconns, *msgSize, *dur, *rounds)
	setups := strings.Split(*setupsF, ",")
	res := map[string][]float64{}
	for r := 0; r < *rounds; r++ {
		for _, s := range setups {
			rps, p50, p99, local, err := run(s, ncpu, r == 0)
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", s, err)
				os.Exit(1)
			}
			res[s] = append(res[s], rps)
			fmt.Printf("round %d %-9s %9.0f req/s  p50 %6.1fus  p99 %7.1fus  local %3.0f%%\n",
				r, s, rps, float64(p50.Nanoseconds())/1e3, float64(p99.Nanoseconds())/1e3, local*100)
		}
	}
	for _, s := range setups {
		v := res[s]
		sort.Float64s(v)
		fmt.Printf("median %-9s %9.0f req/s\n", s, v[len(v)/2])
	}
}
