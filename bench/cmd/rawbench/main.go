// Command rawbench compares a raw queue (hwq.RawQueue: AF_XDP, copy mode on veth) with
// AF_PACKET TPACKET_V3 rings — what capture and custom-frame tools use today — on one
// veth pair between two network namespaces it creates, one queue each way, by the CPU the
// processes involved spend per frame:
//
//	rx  a sender process in the peer namespace sends UDP frames (TPACKET_V3 TX ring) to a
//	    MAC that is not the receiver's, so the kernel stack drops them early as
//	    PACKET_OTHERHOST; the measured receiver process takes them: raw queue (a
//	    steering rule on that MAC; "xdp" in the queue's default XDP mode, "xdp-native"
//	    with bpf.XDPDriver) or a TPACKET_V3 RX ring ("packet", no XDP program attached)
//	tx  the measured sender process sends frames: raw queue TX ring ("xdp") or a
//	    TPACKET_V3 TX ring with PACKET_QDISC_BYPASS ("packet"); a receiver process in the
//	    peer namespace counts them (TPACKET_V3 RX ring, waiting in poll)
//
// at 64 and 1,500 bytes, at a fixed rate (-rate frames/s: the sender sleeps between
// batches of 32 and the measured receiver waits for frames: Receive, poll) and flat out
// (the sender never sleeps; the measured receiver busy-polls: TryReceive, a spin on the
// ring). Each run forks one sender and one receiver process (each pinned to a CPU of its
// own with taskset when the machine has two or more); after both are set up they measure
// for -d from the same "go", each its own CPU (getrusage RUSAGE_SELF: user + system, so the
// softirq work the kernel does in a process's context is that process's) and its frames.
// The figure compared is the measured side's frames per CPU-second of the two processes
// together; the CPU of ksoftirqd (work the kernel deferred, charged to no process) is
// shown beside it, not added. Variants run interleaved, in an order that alternates
// every round; rounds repeat -reps times; the report gives medians with min–max and,
// round by round, the raw queue's ratio to AF_PACKET. It prints the raw queue's mode.
// Needs root, ip(8) and taskset(1). RAWBENCH_WRAP_RECV or RAWBENCH_WRAP_SEND puts a tool
// (strace -c, perf stat) in front of that child. Usage:
//
//	flock /work/wt/measure.lock go run ./cmd/rawbench [-d 1s] [-reps 5] [-rate 50000] [-json out.json]
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
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
	rate    = flag.Int("rate", 50000, "frames/s of the fixed-rate runs")
	jsonOut = flag.String("json", "", "write the results as JSON to this file")
	only    = flag.String("only", "", "run only the cells whose name contains this (rx, tx, 64, 1500, fixed, flat)")
	child   = flag.String("child", "", "internal: run as a child (send or recv)")
	cVar    = flag.String("variant", "", "internal: child's variant")
	cIf     = flag.String("if", "", "internal: child's interface")
	cSize   = flag.Int("size", 64, "internal: frame size")
	cRate   = flag.Int("crate", 0, "internal: frames/s, 0 flat out")
	cMAC    = flag.String("src", "", "internal: source MAC")
	coal    = flag.Duration("coalesce", time.Millisecond, "RxCoalesce of the raw queue's fixed-rate receiver (TPACKET_V3's block retire timeout here is 1 ms)")
)

// sink is the MAC the frames go to: nobody's, so the peer stack drops them as
// PACKET_OTHERHOST right after the taps (AF_PACKET) and the XDP hook.
var sink = net.HardwareAddr{0x02, 0x7a, 0x63, 0, 0, 0xee}

// batch is the frames a sender queues per system call (the raw queue's TX kick moves 32
// per sendto in copy mode).
const batch = 32

// --- children ---

// report is what a child prints when its run ends.
type report struct {
	Frames  uint64  // measured side: received / completed; helper: the same of its own
	CPU     float64 // seconds of user + system CPU over the run
	Wall    float64
	Mode    string `json:",omitempty"` // raw queue: its mode
	Note    string `json:",omitempty"` // where frames were lost
	Dropped uint64 `json:",omitempty"`
}

func selfCPU() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// window is a child's measured run: ready() says the set-up is done and waits for the
// parent's "go"; the run ends at end (read per batch, not per frame); finish reports.
type window struct {
	in  *bufio.Reader
	t0  time.Time
	c0  time.Duration
	end time.Time
}

func (w *window) ready() {
	fmt.Println("ready")
	w.in.ReadString('\n')
	w.t0, w.c0 = time.Now(), selfCPU()
	w.end = w.t0.Add(*dur)
}

func (w *window) finish(r report) {
	r.CPU = (selfCPU() - w.c0).Seconds()
	r.Wall = time.Since(w.t0).Seconds()
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

// pacer sleeps a sender to -crate frames/s, a batch at a time (nothing when flat out).
type pacer struct {
	start time.Time
	sent  int
	rate  int
}

func (p *pacer) wait(n int) {
	if p.rate == 0 {
		return
	}
	p.sent += n
	due := p.start.Add(time.Duration(float64(p.sent) / float64(p.rate) * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
}

func runChild() error {
	src, _ := net.ParseMAC(*cMAC)
	w := &window{in: bufio.NewReader(os.Stdin)}
	switch *child + " " + *cVar {
	case "send packet":
		return packetTX(w, *cIf, *cSize, src, *cRate)
	case "send xdp":
		return rawTX(w, *cIf, *cSize, src, *cRate)
	case "recv packet":
		return packetRX(w, *cIf, *cRate != 0)
	case "recv xdp":
		return rawRX(w, *cIf, bpf.XDPAuto, *cRate != 0)
	case "recv xdp-native":
		return rawRX(w, *cIf, bpf.XDPDriver, *cRate != 0)
	}
	return fmt.Errorf("unknown child %q %q", *child, *cVar)
}

func modeString(m hwq.RawQueueMode) string {
	s := "zero-copy"
	if !m.ZeroCopy {
		s = "copy mode"
	}
	s += ", " + m.XDP.String() + " XDP"
	if m.XDPReason != nil {
		var ce *bpf.NativeXDPCostError
		if errors.As(m.XDPReason, &ce) {
			s += " (default on veth: native would turn off the peer's TSO)"
		} else {
			s += fmt.Sprintf(" (%v)", m.XDPReason)
		}
	}
	return s
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

// --- raw queue ---

func rawTX(w *window, ifname string, size int, src net.HardwareAddr, rate int) error {
	r, err := memreg.New(memreg.Options{BufSize: 2048, Count: 4096})
	if err != nil {
		return err
	}
	defer r.CloseWhenReleased()
	q, err := hwq.OpenRawQueue(ifname, 0, r, &hwq.RawQueueOptions{RingSize: 2048})
	if err != nil {
		return err
	}
	defer q.Close()
	frames := make([]hwq.Frame, batch)
	seq := uint32(0)
	w.ready()
	p := pacer{start: w.t0, rate: rate}
	for time.Now().Before(w.end) {
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
		p.wait(sent)
	}
	q.Flush()
	st, _ := q.Stats()
	w.finish(report{Frames: st.TxCompleted, Mode: modeString(q.Mode())})
	return nil
}

func rawRX(w *window, ifname string, mode bpf.XDPMode, wait bool) error {
	// 16384 frames of 2 KiB (32 MiB) and 8192-entry rings; the AF_PACKET ring is 16 MiB.
	r, err := memreg.New(memreg.Options{BufSize: 2048, Count: 16384})
	if err != nil {
		return err
	}
	defer r.CloseWhenReleased()
	o := &hwq.RawQueueOptions{RingSize: 8192, XDP: mode, TxReserve: -1}
	if wait {
		o.RxCoalesce = *coal
	}
	q, err := hwq.OpenRawQueue(ifname, 0, r, o)
	if err != nil {
		return err
	}
	defer q.Close()
	if _, err := q.Steering().AddRule(bpf.RawRule{DstMAC: sink}); err != nil {
		return err
	}
	frames := make([]hwq.Frame, 256)
	var got uint64
	w.ready()
	q.SetReadDeadline(w.end)
	for iter := 0; ; iter++ {
		var k int
		var err error
		if wait {
			// Fixed rate: wait for frames (ppoll); the deadline ends the run.
			k, err = q.Receive(frames)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
		} else {
			// Flat out: busy-poll; the clock is read every 256 polls.
			k, err = q.TryReceive(frames)
			if iter&255 == 0 && !time.Now().Before(w.end) {
				break
			}
		}
		if err != nil {
			return err
		}
		if err := q.Release(frames[:k]); err != nil {
			return err
		}
		got += uint64(k)
	}
	ss, _ := q.Steering().Stats()
	qs, _ := q.Stats()
	w.finish(report{Frames: got, Mode: modeString(q.Mode()), Dropped: qs.RxRingFull + qs.RxDropped,
		Note: fmt.Sprintf("XDP program ran on %d frames, redirected %d; queue lost %d (ring full %d, no fill buffer %d)",
			ss.Seen, ss.Redirect, qs.RxRingFull+qs.RxDropped, qs.RxRingFull, qs.RxDropped)})
	return nil
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

func packetTX(w *window, ifname string, size int, src net.HardwareAddr, rate int) error {
	fd, idx, err := packetSocket(ifname)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1)
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
	head, tail, inflight := 0, 0, 0
	var done uint64
	seq := uint32(0)
	w.ready()
	p := pacer{start: w.t0, rate: rate}
	for time.Now().Before(w.end) {
		for inflight > 0 && atomic.LoadUint32(status(tail)) == unix.TP_STATUS_AVAILABLE {
			tail = (tail + 1) % nf
			inflight--
			done++
		}
		k := 0
		for inflight < nf && k < batch {
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
		p.wait(k)
	}
	for inflight > 0 && atomic.LoadUint32(status(tail)) == unix.TP_STATUS_AVAILABLE {
		tail = (tail + 1) % nf
		inflight--
		done++
	}
	w.finish(report{Frames: done})
	return nil
}

func packetRX(w *window, ifname string, wait bool) error {
	fd, idx, err := packetSocket(ifname)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	req := unix.TpacketReq3{Block_size: blockSize, Block_nr: blockNr, Frame_size: frameSize,
		Frame_nr: blockSize / frameSize * blockNr, Retire_blk_tov: 1}
	if err := unix.SetsockoptTpacketReq3(fd, unix.SOL_PACKET, unix.PACKET_RX_RING, &req); err != nil {
		return err
	}
	ring, err := unix.Mmap(fd, 0, blockSize*blockNr, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	defer unix.Munmap(ring)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: idx}); err != nil {
		return err
	}
	// Frames queued before the run are the set-up's: flush them.
	unix.GetsockoptTpacketStatsV3(fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	w.ready()
	blk := 0
	var got uint64
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for iter := 0; ; iter++ {
		if iter&255 == 0 && !time.Now().Before(w.end) {
			break
		}
		b := ring[blk*blockSize:]
		st := (*uint32)(unsafe.Pointer(&b[8]))
		if atomic.LoadUint32(st)&unix.TP_STATUS_USER == 0 {
			if wait {
				// Fixed rate: wait in poll for a block (retired after 1 ms at the latest).
				unix.Poll(pfd, 50)
				iter = -1 // read the clock after every wait
			}
			continue
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
	}
	r := report{Frames: got}
	if ps, err := unix.GetsockoptTpacketStatsV3(fd, unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
		r.Dropped = uint64(ps.Drops)
		r.Note = fmt.Sprintf("socket saw %d frames, dropped %d (ring full)", ps.Packets, ps.Drops)
	}
	w.finish(r)
	return nil
}

// --- parent ---

type topo struct {
	a, b       string // namespaces: a is measured, b the peer
	aIf, bIf   string
	aMAC, bMAC string
}

func ip(args ...string) ([]byte, error) {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

func setup() (*topo, error) {
	pid := strconv.Itoa(os.Getpid())
	t := &topo{a: "rawbench-" + pid + "-a", b: "rawbench-" + pid + "-b", aIf: "rb-a", bIf: "rb-b"}
	for _, ns := range []string{t.a, t.b} {
		if _, err := ip("netns", "add", ns); err != nil {
			return t, err
		}
	}
	for _, c := range [][]string{
		{"-n", t.a, "link", "add", t.aIf, "numtxqueues", "1", "numrxqueues", "1", "type", "veth", "peer", "name", t.bIf, "netns", t.b, "numtxqueues", "1", "numrxqueues", "1"},
		{"-n", t.a, "link", "set", t.aIf, "up"}, {"-n", t.b, "link", "set", t.bIf, "up"},
		{"-n", t.a, "link", "set", "lo", "up"}, {"-n", t.b, "link", "set", "lo", "up"},
	} {
		if _, err := ip(c...); err != nil {
			return t, err
		}
	}
	var err error
	if t.aMAC, err = macOf(t.a, t.aIf); err != nil {
		return t, err
	}
	t.bMAC, err = macOf(t.b, t.bIf)
	return t, err
}

func macOf(ns, ifname string) (string, error) {
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/sys/class/net/"+ifname+"/address").Output()
	if err != nil {
		return "", fmt.Errorf("MAC of %s in %s: %w", ifname, ns, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func (t *topo) close() {
	ip("netns", "del", t.a)
	ip("netns", "del", t.b)
}

// proc is a running child.
type proc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func start(ns string, cpu int, args ...string) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	argv := []string{"netns", "exec", ns}
	if runtime.NumCPU() >= 2 && cpu >= 0 {
		argv = append(argv, "taskset", "-c", strconv.Itoa(cpu))
	}
	if w := os.Getenv("RAWBENCH_WRAP_" + strings.ToUpper(args[1])); w != "" {
		// A tool around one child (RAWBENCH_WRAP_RECV="strace -c -f -o /tmp/recv.txt"),
		// for looking into a cell; the CPU figures then include the tool's cost.
		argv = append(argv, strings.Fields(w)...)
	}
	argv = append(argv, exe)
	argv = append(argv, args...)
	cmd := exec.Command("ip", argv...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, in: in, out: bufio.NewReader(out)}
	line, err := p.out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		p.in.Close()
		p.cmd.Wait()
		return nil, fmt.Errorf("child %v did not get ready (%q, %v)", args, line, err)
	}
	return p, nil
}

func (p *proc) result() (report, error) {
	var r report
	line, err := p.out.ReadString('\n')
	p.in.Close()
	werr := p.cmd.Wait()
	if err != nil {
		return r, errors.Join(err, werr)
	}
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return r, fmt.Errorf("child's report %q: %w", line, err)
	}
	return r, werr
}

// ksoftirqd is the CPU time all ksoftirqd threads have used so far (/proc/PID/stat).
func ksoftirqd() time.Duration {
	ents, _ := os.ReadDir("/proc")
	var t uint64
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		if !strings.Contains(s, "(ksoftirqd/") {
			continue
		}
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+2:])
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseUint(f[11], 10, 64)
		k, _ := strconv.ParseUint(f[12], 10, 64)
		t += u + k
	}
	return time.Duration(t) * 10 * time.Millisecond // USER_HZ 100
}

type result struct {
	Frames           uint64  // the measured side's
	Delivered        uint64  // tx: frames the peer's receiver counted
	Seconds          float64 // the measured side's wall time
	Rate             float64 // frames/s
	SendNs, RecvNs   float64 // each process's CPU ns per frame
	SoftirqNs        float64 // ksoftirqd's CPU ns per frame (not in PerCPUSecond)
	PerCPUSecond     float64 // frames per CPU-second of the two processes
	Mode, Note       string  `json:",omitempty"`
	SendCPU, RecvCPU float64 // seconds
}

func runOne(t *topo, dir, variant string, size, rt int) (result, error) {
	common := []string{"-d", dur.String(), "-size", strconv.Itoa(size), "-crate", strconv.Itoa(rt), "-coalesce", coal.String()}
	sendNS, sendIf, sendMAC, sendVar := t.b, t.bIf, t.bMAC, "packet"
	recvNS, recvIf, recvVar := t.a, t.aIf, variant
	if dir == "tx" {
		sendNS, sendIf, sendMAC, sendVar = t.a, t.aIf, t.aMAC, variant
		recvNS, recvIf, recvVar = t.b, t.bIf, "packet"
	}
	recvArgs := append([]string{"-child", "recv", "-variant", recvVar, "-if", recvIf}, common...)
	if dir == "tx" {
		// The peer's receiver only counts: it waits in poll at both rates (-crate 1).
		recvArgs = []string{"-child", "recv", "-variant", recvVar, "-if", recvIf, "-d", dur.String(), "-crate", "1"}
	}
	rp, err := start(recvNS, 0, recvArgs...)
	if err != nil {
		return result{}, err
	}
	sp, err := start(sendNS, 1, append([]string{"-child", "send", "-variant", sendVar, "-if", sendIf, "-src", sendMAC}, common...)...)
	if err != nil {
		rp.in.Close()
		rp.cmd.Wait()
		return result{}, err
	}
	k0 := ksoftirqd()
	rp.in.Write([]byte("go\n"))
	sp.in.Write([]byte("go\n"))
	sr, serr := sp.result()
	rr, rerr := rp.result()
	k1 := ksoftirqd()
	if err := errors.Join(serr, rerr); err != nil {
		return result{}, err
	}
	m, other := rr, sr // the measured side
	if dir == "tx" {
		m, other = sr, rr
	}
	r := result{Frames: m.Frames, Seconds: m.Wall, Mode: m.Mode, Note: m.Note, SendCPU: sr.CPU, RecvCPU: rr.CPU}
	if dir == "tx" {
		r.Delivered = other.Frames
		r.Note = other.Note
	}
	if m.Frames > 0 {
		f := float64(m.Frames)
		r.Rate = f / m.Wall
		r.SendNs, r.RecvNs = sr.CPU*1e9/f, rr.CPU*1e9/f
		r.SoftirqNs = float64((k1 - k0).Nanoseconds()) / f
		r.PerCPUSecond = f / (sr.CPU + rr.CPU)
	}
	return r, nil
}

type cell struct {
	Dir, Variant string
	Size         int
	Rate         int // 0: flat out
	Runs         []result
}

func (c *cell) name() string {
	return fmt.Sprintf("%s %d B %s", c.Dir, c.Size, rateName(c.Rate))
}

func rateName(r int) string {
	if r == 0 {
		return "flat"
	}
	return fmt.Sprintf("fixed %d/s", r)
}

func main() {
	flag.Parse()
	if *child != "" {
		if err := runChild(); err != nil {
			fmt.Fprintln(os.Stderr, "rawbench child:", err)
			os.Exit(1)
		}
		return
	}
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
	get := func(dir, v string, size, rt int) *cell {
		for _, c := range cells {
			if c.Dir == dir && c.Variant == v && c.Size == size && c.Rate == rt {
				return c
			}
		}
		c := &cell{Dir: dir, Variant: v, Size: size, Rate: rt}
		cells = append(cells, c)
		return c
	}
	rates := []int{*rate, 0}
	for rep := range *reps {
		for _, dir := range []string{"rx", "tx"} {
			for _, size := range []int{64, 1500} {
				for _, rt := range rates {
					if *only != "" && !strings.Contains(fmt.Sprintf("%s %d B %s", dir, size, rateName(rt)), *only) {
						continue
					}
					order := []string{"xdp", "packet"}
					if dir == "rx" {
						order = append(order, "xdp-native")
					}
					if rep%2 == 1 {
						slices.Reverse(order)
					}
					for _, v := range order {
						r, err := runOne(t, dir, v, size, rt)
						if err != nil {
							fmt.Fprintf(os.Stderr, "rawbench: %s %s %d %s: %v\n", dir, v, size, rateName(rt), err)
							os.Exit(1)
						}
						fmt.Fprintf(os.Stderr, "round %d %s %-10s %4d B %-13s: %8.0f frames/s, %8.0f frames/CPU-s (send %6.0f + recv %6.0f ns/frame; ksoftirqd %5.0f)%s%s\n",
							rep+1, dir, v, size, rateName(rt), r.Rate, r.PerCPUSecond, r.SendNs, r.RecvNs, r.SoftirqNs,
							cond(r.Mode != "", "; "+r.Mode), cond(r.Note != "", "; "+r.Note))
						c := get(dir, v, size, rt)
						c.Runs = append(c.Runs, r)
					}
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
	fmt.Printf("rawbench: veth pair between two namespaces, 1 queue, %d CPUs, Linux %s; %d rounds of %v per variant; fixed rate %d frames/s\n",
		runtime.NumCPU(), unix.ByteSliceToString(host.Release[:]), *reps, *dur, *rate)
	modes := map[string]string{}
	for _, c := range cells {
		for _, r := range c.Runs {
			if r.Mode != "" {
				modes[c.Dir+" "+c.Variant] = r.Mode
			}
		}
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range modes {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Printf("raw queue mode, %s: %s\n", k, modes[k])
	}
	fmt.Printf("%-3s %5s %-13s %-10s %-28s %-28s %-24s %-24s %-18s\n", "dir", "size", "rate", "variant", "frames/s", "frames/CPU-s (both procs)", "sender ns/frame", "receiver ns/frame", "ksoftirqd ns/frame")
	for _, c := range cells {
		fmt.Printf("%-3s %5d %-13s %-10s %-28s %-28s %-24s %-24s %-18s\n", c.Dir, c.Size, rateName(c.Rate), c.Variant,
			pr(sum(c, func(r result) float64 { return r.Rate })),
			pr(sum(c, func(r result) float64 { return r.PerCPUSecond })),
			pr(sum(c, func(r result) float64 { return r.SendNs })),
			pr(sum(c, func(r result) float64 { return r.RecvNs })),
			fmt.Sprintf("%.4g", sum(c, func(r result) float64 { return r.SoftirqNs }).Median))
	}
	fmt.Println("ratios raw queue / AF_PACKET TPACKET_V3, frames per CPU-second of the sender and receiver processes (medians of per-round ratios, min–max; a spread across 1.0 is undecided):")
	type ratio struct {
		Cell    string
		Variant string
		PerCPU  stats.Summary
		Rate    stats.Summary
		Verdict string
	}
	var ratios []ratio
	for _, dir := range []string{"rx", "tx"} {
		for _, size := range []int{64, 1500} {
			for _, rt := range rates {
				p := get(dir, "packet", size, rt)
				for _, v := range []string{"xdp", "xdp-native"} {
					x := get(dir, v, size, rt)
					if len(x.Runs) == 0 || len(p.Runs) == 0 {
						continue
					}
					var rc, rr []float64
					for i := range min(len(x.Runs), len(p.Runs)) {
						rc = append(rc, x.Runs[i].PerCPUSecond/p.Runs[i].PerCPUSecond)
						rr = append(rr, x.Runs[i].Rate/p.Runs[i].Rate)
					}
					r := ratio{Cell: x.name(), Variant: v, PerCPU: stats.Summarize(rc), Rate: stats.Summarize(rr)}
					switch {
					case r.PerCPU.Min >= 1:
						r.Verdict = "raw queue cheaper"
					case r.PerCPU.Max < 1:
						r.Verdict = "AF_PACKET cheaper"
					default:
						r.Verdict = "undecided"
					}
					ratios = append(ratios, r)
					fmt.Printf("  %-24s %-10s per CPU-s %-26s frames/s %-26s %s\n", x.name(), v, pr(r.PerCPU), pr(r.Rate), r.Verdict)
				}
			}
		}
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(map[string]any{
			"kernel": unix.ByteSliceToString(host.Release[:]), "cpus": runtime.NumCPU(),
			"run": dur.String(), "reps": *reps, "rate": *rate, "cells": cells, "ratios": ratios, "modes": modes,
			"date": time.Now().UTC().Format(time.RFC3339),
		}, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "rawbench:", err)
		}
	}
}

func cond(ok bool, s string) string {
	if ok {
		return s
	}
	return ""
}
