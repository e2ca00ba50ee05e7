// Command rawbench compares a raw queue (hwq.RawQueue: AF_XDP, copy mode on veth) with
// AF_PACKET and TPACKET_V3 rings — what capture and custom-frame tools use today — on the
// same veth pair between two network namespaces it creates, one queue each way:
//
//	rx  a generator in the peer namespace sends UDP frames to a MAC that is not the
//	    receiver's (the kernel stack drops them early as PACKET_OTHERHOST); the measured
//	    side receives them: raw queue (a steering rule on that MAC) or an AF_PACKET
//	    TPACKET_V3 RX ring (no XDP program attached)
//	tx  the measured side sends frames flat out: raw queue TX ring, or an AF_PACKET
//	    TPACKET_V3 TX ring with PACKET_QDISC_BYPASS; the peer's stack drops them
//
// for 64-byte and 1500-byte frames. Every (direction, size) pair runs both variants once
// per round, in alternating order, for -d each; rounds repeat -reps times. Figures per run:
// frames/s handled by the application, machine CPU (all CPUs, /proc/stat, so softirq work
// counts wherever it ran — the generator's included) per frame, and the measured thread's
// own CPU per frame (getrusage RUSAGE_THREAD). The report gives medians with min–max and
// the raw queue's ratios to AF_PACKET: frames/s, and frames per machine-CPU-second.
// Needs root. Usage:
//
//	flock /work/.measure.lock go run ./bench/cmd/rawbench [-d 1s] [-reps 5] [-json out.json]
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bench/internal/stats"
	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/hwq"
	"github.com/zcnet/zcnet/memreg"
)

var (
	dur     = flag.Duration("d", time.Second, "length of one run")
	reps    = flag.Int("reps", 5, "rounds")
	jsonOut = flag.String("json", "", "write the results as JSON to this file")
	generic = flag.Bool("generic", true, "also receive with the program in generic (skb) XDP mode (xdp-gen)")
)

// lastNote says what the last RX run's receiver saw (where frames were lost, if anywhere).
var lastNote string

// sink is the MAC the frames go to: nobody's, so the peer stack drops them as
// PACKET_OTHERHOST right after the taps (AF_PACKET) and the XDP hook.
var sink = net.HardwareAddr{0x02, 0x7a, 0x63, 0, 0, 0xee}

type topo struct {
	a, b       string // namespaces: a is measured, b the peer
	aFD, bFD   *os.File
	aIf, bIf   string
	aMAC, bMAC net.HardwareAddr
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func setup() (*topo, error) {
	pid := strconv.Itoa(os.Getpid())
	t := &topo{a: "rawbench-" + pid + "-a", b: "rawbench-" + pid + "-b", aIf: "rb-a", bIf: "rb-b"}
	for _, ns := range []string{t.a, t.b} {
		if err := ip("netns", "add", ns); err != nil {
			return t, err
		}
	}
	for _, c := range [][]string{
		{"-n", t.a, "link", "add", t.aIf, "numtxqueues", "1", "numrxqueues", "1", "type", "veth", "peer", "name", t.bIf, "netns", t.b, "numtxqueues", "1", "numrxqueues", "1"},
		{"-n", t.a, "link", "set", t.aIf, "up"}, {"-n", t.b, "link", "set", t.bIf, "up"},
		{"-n", t.a, "link", "set", "lo", "up"}, {"-n", t.b, "link", "set", "lo", "up"},
	} {
		if err := ip(c...); err != nil {
			return t, err
		}
	}
	var err error
	if t.aFD, err = os.Open("/run/netns/" + t.a); err != nil {
		return t, err
	}
	if t.bFD, err = os.Open("/run/netns/" + t.b); err != nil {
		return t, err
	}
	if t.aMAC, err = macIn(t.aFD, t.aIf); err != nil {
		return t, err
	}
	t.bMAC, err = macIn(t.bFD, t.bIf)
	return t, err
}

func (t *topo) close() {
	for _, f := range []*os.File{t.aFD, t.bFD} {
		if f != nil {
			f.Close()
		}
	}
	ip("netns", "del", t.a)
	ip("netns", "del", t.b)
}

// inNS runs fn on a thread that entered ns, pinned to cpu, and never returns the thread to
// the runtime (it dies with the goroutine).
func inNS(ns *os.File, cpu int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		if cpu >= 0 && os.Getenv("RAWBENCH_PIN") != "" {
			var set unix.CPUSet
			set.Set(cpu % runtime.NumCPU())
			unix.SchedSetaffinity(0, &set)
		}
		errc <- fn()
	}()
	return <-errc
}

func macIn(ns *os.File, name string) (net.HardwareAddr, error) {
	var mac net.HardwareAddr
	err := inNS(ns, 0, func() error {
		ifi, err := net.InterfaceByName(name)
		if err == nil {
			mac = ifi.HardwareAddr
		}
		return err
	})
	return mac, err
}

// frame writes a UDP/IPv4 frame of size bytes (Ethernet header included) to sink.
func frame(b []byte, src net.HardwareAddr, seq uint32) {
	copy(b[0:], sink)
	copy(b[6:], src)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ipb := b[14:34]
	clear(ipb)
	ipb[0], ipb[8], ipb[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ipb[2:], uint16(len(b)-14))
	copy(ipb[12:], []byte{10, 66, 0, 2, 10, 66, 0, 1})
	udp := b[34:42]
	binary.BigEndian.PutUint16(udp[0:], 9000)
	binary.BigEndian.PutUint16(udp[2:], 9001)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(b)-34))
	binary.BigEndian.PutUint16(udp[6:], 0)
	binary.BigEndian.PutUint32(b[42:], seq)
}

// machineCPU is the busy time of all CPUs so far (/proc/stat).
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy uint64
	for i, v := range f[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		busy += n
	}
	return time.Duration(busy) * 10 * time.Millisecond // USER_HZ 100
}

func threadCPU() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_THREAD, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type result struct {
	Frames       uint64
	Seconds      float64
	Rate         float64 // frames/s
	MachineNs    float64 // machine CPU ns per frame
	ThreadNs     float64 // measured thread's CPU ns per frame
	PerCPUSecond float64 // frames per machine-CPU-second
}

// bodyFn is one variant's loop: it sets itself up, calls begin (the clock and the CPU
// counters start there, so set-up time is not measured), then counts frames into n until
// stop is set.
type bodyFn func(begin func(), stop *atomic.Bool, n *atomic.Uint64) error

// measure runs body on a thread in ns (pinned to cpu with RAWBENCH_PIN) for -d from its
// begin.
func measure(ns *os.File, cpu int, body bodyFn) (result, error) {
	var stop atomic.Bool
	var n atomic.Uint64
	var tcpu, el, m0, m1 time.Duration
	var n0 uint64
	err := inNS(ns, cpu, func() error {
		var c0 time.Duration
		var t0 time.Time
		begun := false
		begin := func() {
			begun = true
			n0 = n.Load()
			c0, t0 = threadCPU(), time.Now()
			m0 = machineCPU()
			go func() { time.Sleep(*dur); stop.Store(true) }()
		}
		err := body(begin, &stop, &n)
		if !begun {
			return errors.Join(err, errors.New("the variant never began"))
		}
		m1 = machineCPU()
		el, tcpu = time.Since(t0), threadCPU()-c0
		return err
	})
	if err != nil {
		return result{}, err
	}
	f := n.Load() - n0
	r := result{Frames: f, Seconds: el.Seconds(), Rate: float64(f) / el.Seconds()}
	if f > 0 {
		r.MachineNs = float64((m1 - m0).Nanoseconds()) / float64(f)
		r.ThreadNs = float64(tcpu.Nanoseconds()) / float64(f)
		if m1 > m0 {
			r.PerCPUSecond = float64(f) / (m1 - m0).Seconds()
		}
	}
	return r, nil
}

// --- raw queue ---

func rawTX(ns *os.File, ifname string, size int, src net.HardwareAddr) bodyFn {
	return func(begin func(), stop *atomic.Bool, n *atomic.Uint64) error {
		r, err := memreg.New(memreg.Options{BufSize: 2048, Count: 4096})
		if err != nil {
			return err
		}
		defer r.CloseWhenReleased()
		q, err := hwq.OpenRawQueue(ifname, 0, r, &hwq.RawQueueOptions{RingSize: 2048, FillSize: 2048})
		if err != nil {
			return err
		}
		defer q.Close()
		frames := make([]hwq.Frame, 64)
		seq := uint32(0)
		iter := 0
		begin()
		for !stop.Load() {
			k := 0
			for k < len(frames) {
				b, err := q.Get()
				if err != nil {
					break
				}
				frame(b.Bytes()[:size], src, seq)
				seq++
				frames[k] = hwq.Frame{Buf: b, Len: size}
				k++
			}
			sent, err := q.Send(frames[:k])
			if err != nil {
				return err
			}
			for _, f := range frames[sent:k] {
				f.Buf.Release()
			}
			if k == 0 || sent < k {
				q.Flush()
			}
			if iter++; iter%64 == 0 {
				st, _ := q.Stats()
				n.Store(st.TxCompleted)
			}
		}
		q.Flush()
		st, _ := q.Stats()
		n.Store(st.TxCompleted)
		return nil
	}
}

func rawRX(ifname string, mode bpf.XDPMode, gen <-chan struct{}) (bodyFn, func() error) {
	var ready = make(chan error, 1)
	body := func(begin func(), stop *atomic.Bool, n *atomic.Uint64) error {
		// 16384 frames of 2 KiB (32 MiB) and 8192-entry rings; the AF_PACKET ring is 16 MiB.
		r, err := memreg.New(memreg.Options{BufSize: 2048, Count: 16384})
		if err != nil {
			ready <- err
			return err
		}
		defer r.CloseWhenReleased()
		q, err := hwq.OpenRawQueue(ifname, 0, r, &hwq.RawQueueOptions{RingSize: 8192, FillSize: 8192, XDP: mode})
		if err != nil {
			ready <- err
			return err
		}
		defer q.Close()
		if _, err := q.Steering().AddRule(bpf.RawRule{DstMAC: sink}); err != nil {
			ready <- err
			return err
		}
		ready <- nil
		<-gen
		begin()
		frames := make([]hwq.Frame, 256)
		var got uint64
		for !stop.Load() {
			k, err := q.TryReceive(frames)
			if err != nil {
				return err
			}
			for _, f := range frames[:k] {
				f.Buf.Release()
			}
			got += uint64(k)
			n.Store(got)
		}
		ss, _ := q.Steering().Stats()
		qs, _ := q.Stats()
		lastNote = fmt.Sprintf("XDP program ran on %d frames, redirected %d; queue lost %d (ring full %d, no fill buffer %d)",
			ss.Seen, ss.Redirect, qs.RxRingFull+qs.RxDropped, qs.RxRingFull, qs.RxDropped)
		return nil
	}
	return body, func() error { return <-ready }
}

// --- AF_PACKET, TPACKET_V3 ---

const (
	blockSize  = 1 << 20
	blockNr    = 16
	frameSize  = 2048
	tp3DataOff = 48 // TPACKET3_HDRLEN - sizeof(struct sockaddr_ll): TX data offset
)

func packetSocket(ifname string) (int, int, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return -1, 0, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return -1, 0, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VERSION, unix.TPACKET_V3); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, ifi.Index, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func packetTX(ifname string, size int, src net.HardwareAddr) bodyFn {
	return func(begin func(), stop *atomic.Bool, n *atomic.Uint64) error {
		fd, idx, err := packetSocket(ifname)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if os.Getenv("RAWBENCH_QDISC") == "" {
			unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1)
		}
		req := unix.TpacketReq3{Block_size: blockSize, Block_nr: blockNr, Frame_size: frameSize, Frame_nr: blockSize / frameSize * blockNr}
		if err := unix.SetsockoptTpacketReq3(fd, unix.SOL_PACKET, unix.PACKET_TX_RING, &req); err != nil {
			return fmt.Errorf("PACKET_TX_RING: %w", err)
		}
		ring, err := unix.Mmap(fd, 0, blockSize*blockNr, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return err
		}
		defer unix.Munmap(ring)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: idx}); err != nil {
			return err
		}
		nf := int(req.Frame_nr)
		status := func(i int) *uint32 { return (*uint32)(unsafe.Pointer(&ring[i*frameSize+20])) }
		head, inflight := 0, 0
		tail := 0
		var done uint64
		seq := uint32(0)
		begin()
		for !stop.Load() {
			// Reap frames the kernel has sent.
			for inflight > 0 && atomic.LoadUint32(status(tail)) == unix.TP_STATUS_AVAILABLE {
				tail = (tail + 1) % nf
				inflight--
				done++
			}
			k := 0
			for inflight < nf && k < 64 {
				h := ring[head*frameSize:]
				binary.NativeEndian.PutUint32(h[0:], 0)             // tp_next_offset
				binary.NativeEndian.PutUint32(h[12:], uint32(size)) // tp_snaplen
				binary.NativeEndian.PutUint32(h[16:], uint32(size)) // tp_len
				frame(h[tp3DataOff:tp3DataOff+size], src, seq)
				seq++
				atomic.StoreUint32(status(head), unix.TP_STATUS_SEND_REQUEST)
				head = (head + 1) % nf
				inflight++
				k++
			}
			_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
			if e != 0 && e != unix.EAGAIN && e != unix.ENOBUFS {
				return fmt.Errorf("sendto: %w", e)
			}
			n.Store(done)
		}
		return nil
	}
}

func packetRX(ifname string, gen <-chan struct{}) (bodyFn, func() error) {
	ready := make(chan error, 1)
	body := func(begin func(), stop *atomic.Bool, n *atomic.Uint64) error {
		fd, idx, err := packetSocket(ifname)
		if err != nil {
			ready <- err
			return err
		}
		defer unix.Close(fd)
		req := unix.TpacketReq3{Block_size: blockSize, Block_nr: blockNr, Frame_size: frameSize,
			Frame_nr: blockSize / frameSize * blockNr, Retire_blk_tov: 1}
		if err := unix.SetsockoptTpacketReq3(fd, unix.SOL_PACKET, unix.PACKET_RX_RING, &req); err != nil {
			ready <- err
			return err
		}
		ring, err := unix.Mmap(fd, 0, blockSize*blockNr, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			ready <- err
			return err
		}
		defer unix.Munmap(ring)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: idx}); err != nil {
			ready <- err
			return err
		}
		ready <- nil
		<-gen
		begin()
		blk := 0
		var got uint64
		for !stop.Load() {
			b := ring[blk*blockSize:]
			st := (*uint32)(unsafe.Pointer(&b[8]))
			if atomic.LoadUint32(st)&unix.TP_STATUS_USER == 0 {
				continue // spin, as the raw queue's TryReceive loop does
			}
			num := binary.NativeEndian.Uint32(b[12:])
			off := binary.NativeEndian.Uint32(b[16:])
			for i := uint32(0); i < num; i++ {
				h := b[off:]
				mac := binary.NativeEndian.Uint16(h[24:])
				if h[mac] == sink[0] && h[mac+5] == sink[5] {
					got++
				}
				off += binary.NativeEndian.Uint32(h[0:])
			}
			atomic.StoreUint32(st, unix.TP_STATUS_KERNEL)
			blk = (blk + 1) % blockNr
			n.Store(got)
		}
		if ps, err := unix.GetsockoptTpacketStatsV3(fd, unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
			lastNote = fmt.Sprintf("socket saw %d frames, dropped %d (ring full)", ps.Packets, ps.Drops)
		}
		return nil
	}
	return body, func() error { return <-ready }
}

// generator sends frames flat out from the peer namespace through an AF_PACKET
// TPACKET_V3 TX ring (no XDP program on the peer) until stop.
func generator(t *topo, size int, stop *atomic.Bool, started chan<- error) error {
	return inNS(t.bFD, 1, func() error {
		var n atomic.Uint64
		sent := false
		err := packetTX(t.bIf, size, t.bMAC)(func() { sent = true; started <- nil }, stop, &n)
		if !sent {
			started <- err
		}
		return err
	})
}

func runOne(t *topo, dir, variant string, size int) (result, error) {
	switch dir {
	case "tx":
		body := packetTX(t.aIf, size, t.aMAC)
		if variant == "xdp" {
			body = rawTX(t.aFD, t.aIf, size, t.aMAC)
		}
		return measure(t.aFD, 0, body)
	}
	var body bodyFn
	var ready func() error
	gen := make(chan struct{}) // closed once the generator sends: the receiver's clock starts then
	switch variant {
	case "xdp":
		body, ready = rawRX(t.aIf, bpf.XDPDriver, gen)
	case "xdp-gen":
		body, ready = rawRX(t.aIf, bpf.XDPGeneric, gen)
	default:
		body, ready = packetRX(t.aIf, gen)
	}
	var stopGen atomic.Bool
	genErr := make(chan error, 1)
	genStarted := make(chan error, 1)
	type res struct {
		r   result
		err error
	}
	resc := make(chan res, 1)
	go func() {
		r, err := measure(t.aFD, 0, body)
		resc <- res{r, err}
	}()
	if err := ready(); err != nil {
		close(gen)
		<-resc
		return result{}, err
	}
	go func() { genErr <- generator(t, size, &stopGen, genStarted) }()
	if err := <-genStarted; err != nil {
		close(gen)
		<-resc
		return result{}, fmt.Errorf("generator: %w", err)
	}
	close(gen)
	out := <-resc
	stopGen.Store(true)
	if err := <-genErr; err != nil && out.err == nil {
		out.err = fmt.Errorf("generator: %w", err)
	}
	return out.r, out.err
}

type cell struct {
	Dir, Variant string
	Size         int
	Runs         []result
}

func main() {
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "rawbench: needs root (namespaces, AF_XDP, BPF)")
		os.Exit(1)
	}
	t, err := setup()
	defer t.close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rawbench:", err)
		return
	}
	var cells []*cell
	get := func(dir, v string, size int) *cell {
		for _, c := range cells {
			if c.Dir == dir && c.Variant == v && c.Size == size {
				return c
			}
		}
		c := &cell{Dir: dir, Variant: v, Size: size}
		cells = append(cells, c)
		return c
	}
	for rep := range *reps {
		for _, dir := range []string{"rx", "tx"} {
			for _, size := range []int{64, 1500} {
				order := []string{"xdp", "packet"}
				if dir == "rx" && *generic {
					order = append(order, "xdp-gen")
				}
				if rep%2 == 1 {
					slices.Reverse(order)
				}
				for _, v := range order {
					r, err := runOne(t, dir, v, size)
					if err != nil {
						fmt.Fprintf(os.Stderr, "rawbench: %s %s %d: %v\n", dir, v, size, err)
						os.Exit(1)
					}
					note := ""
					if dir == "rx" {
						note = "; " + lastNote
					}
					fmt.Fprintf(os.Stderr, "round %d %s %-7s %4d B: %9.0f frames/s, machine %6.0f ns/frame, thread %6.0f ns/frame%s\n",
						rep+1, dir, v, size, r.Rate, r.MachineNs, r.ThreadNs, note)
					c := get(dir, v, size)
					c.Runs = append(c.Runs, r)
				}
			}
		}
	}
	sum := func(c *cell, f func(result) float64) stats.Summary {
		var xs []float64
		for _, r := range c.Runs {
			xs = append(xs, f(r))
		}
		return stats.Summarize(xs)
	}
	pr := func(s stats.Summary) string { return fmt.Sprintf("%.4g (%.4g–%.4g)", s.Median, s.Min, s.Max) }
	var host unix.Utsname
	unix.Uname(&host)
	fmt.Printf("rawbench: veth pair between two namespaces, 1 queue, %d CPUs, Linux %s; %d rounds of %v per variant\n",
		runtime.NumCPU(), unix.ByteSliceToString(host.Release[:]), *reps, *dur)
	fmt.Printf("%-3s %5s %-7s %-30s %-30s %-30s\n", "dir", "size", "variant", "frames/s median (min–max)", "machine CPU ns/frame", "thread CPU ns/frame")
	for _, c := range cells {
		fmt.Printf("%-3s %5d %-7s %-30s %-30s %-30s\n", c.Dir, c.Size, c.Variant,
			pr(sum(c, func(r result) float64 { return r.Rate })),
			pr(sum(c, func(r result) float64 { return r.MachineNs })),
			pr(sum(c, func(r result) float64 { return r.ThreadNs })))
	}
	fmt.Println("ratios raw queue / AF_PACKET TPACKET_V3 (medians of per-round ratios, min–max):")
	type ratio struct {
		Dir        string
		Size       int
		Rate       stats.Summary
		PerCPU     stats.Summary
		ThreadCost stats.Summary
	}
	var ratios []ratio
	for _, dir := range []string{"rx", "tx"} {
		for _, size := range []int{64, 1500} {
			x, p := get(dir, "xdp", size), get(dir, "packet", size)
			var rr, rc, rt []float64
			for i := range min(len(x.Runs), len(p.Runs)) {
				rr = append(rr, x.Runs[i].Rate/p.Runs[i].Rate)
				rc = append(rc, x.Runs[i].PerCPUSecond/p.Runs[i].PerCPUSecond)
				rt = append(rt, x.Runs[i].ThreadNs/p.Runs[i].ThreadNs)
			}
			r := ratio{Dir: dir, Size: size, Rate: stats.Summarize(rr), PerCPU: stats.Summarize(rc), ThreadCost: stats.Summarize(rt)}
			ratios = append(ratios, r)
			fmt.Printf("  %s %4d B: frames/s %s, frames per machine-CPU-second %s, thread CPU per frame %s\n",
				dir, size, pr(r.Rate), pr(r.PerCPU), pr(r.ThreadCost))
			if g := get(dir, "xdp-gen", size); len(g.Runs) > 0 {
				var gr, gc []float64
				for i := range min(len(g.Runs), len(p.Runs)) {
					gr = append(gr, g.Runs[i].Rate/p.Runs[i].Rate)
					gc = append(gc, g.Runs[i].PerCPUSecond/p.Runs[i].PerCPUSecond)
				}
				gen := ratio{Dir: dir + " (generic XDP)", Size: size, Rate: stats.Summarize(gr), PerCPU: stats.Summarize(gc)}
				ratios = append(ratios, gen)
				fmt.Printf("  %s %4d B, generic XDP: frames/s %s, frames per machine-CPU-second %s\n", dir, size, pr(gen.Rate), pr(gen.PerCPU))
			}
		}
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(map[string]any{
			"kernel": unix.ByteSliceToString(host.Release[:]), "cpus": runtime.NumCPU(),
			"run": dur.String(), "reps": *reps, "cells": cells, "ratios": ratios,
			"date": time.Now().UTC().Format(time.RFC3339),
		}, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "rawbench:", err)
		}
	}
}
