// Command rawmcast receives one multicast group into raw queues (AF_XDP, hwq.RawQueue) and
// prints per-source rates, while every other frame of the interface — the rest of the
// host's traffic — goes to the kernel stack as usual:
//
//	rawmcast -i eth1 -group 239.1.2.3 -port 5000 -d 30s
//	rawmcast -i veth0 -netns blue -group ff15::7:1 -count 1000
//
// It opens one raw queue per RX queue of the interface (a multicast stream can land on any
// of them), all sharing one steering program with a single rule: destination address
// group (and UDP port, when given). The rule joins the group (RawRule.Join: a kernel
// socket holds the IGMP/MLD membership, left when the program exits), because a rule alone
// does not: on a switched network with IGMP/MLD snooping the group's frames would never
// reach the interface. -join=false leaves that to someone else. It says whether the
// queues run in zero-copy or copy mode and in native or generic XDP, and why (on veth the
// default is generic XDP: native XDP would turn off the peer's TSO/GSO). Needs root
// (CAP_NET_ADMIN, CAP_BPF).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/hwq"
	"github.com/zcnet/zcnet/memreg"
)

type config struct {
	Iface    string
	NetNS    string // a name under /run/netns; "" for the current namespace
	Group    netip.Addr
	Port     int
	Interval time.Duration
	Duration time.Duration
	Count    int // stop after this many frames (0: no limit)
	Frames   int // region buffers per queue
	NoJoin   bool
	stop     chan struct{}
}

func main() {
	var c config
	group := flag.String("group", "", "multicast group address (required)")
	flag.StringVar(&c.Iface, "i", "", "interface (required)")
	flag.StringVar(&c.NetNS, "netns", "", "network namespace name (/run/netns/NAME)")
	flag.IntVar(&c.Port, "port", 0, "UDP destination port (0: any)")
	flag.DurationVar(&c.Interval, "interval", time.Second, "how often to print rates")
	flag.DurationVar(&c.Duration, "d", 0, "how long to run (0: until Ctrl-C)")
	flag.IntVar(&c.Count, "count", 0, "stop after this many frames (0: no limit)")
	flag.IntVar(&c.Frames, "frames", 4096, "2 KiB frames of registered memory per queue")
	join := flag.Bool("join", true, "join the group through a kernel socket (IGMP/MLD), so switches that snoop forward it")
	flag.Parse()
	c.NoJoin = !*join
	g, err := netip.ParseAddr(*group)
	if err != nil || !g.IsMulticast() || c.Iface == "" {
		fmt.Fprintln(os.Stderr, "rawmcast: -i and a multicast -group are required")
		os.Exit(2)
	}
	c.Group = g
	c.stop = make(chan struct{})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; close(c.stop) }()
	if err := run(c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rawmcast:", err)
		os.Exit(1)
	}
}

// source is one sender's counters.
type source struct{ frames, bytes, lastFrames, lastBytes uint64 }

func run(c config, out io.Writer) error {
	nsfd := 0
	if c.NetNS != "" {
		f, err := os.Open("/run/netns/" + c.NetNS)
		if err != nil {
			return err
		}
		defer f.Close()
		nsfd = int(f.Fd())
	}
	queues, err := rxQueues(c.Iface, nsfd)
	if err != nil {
		return err
	}
	steer, err := hwq.NewRawSteering(c.Iface, nsfd, nil)
	if err != nil {
		return err
	}
	defer steer.Close()
	var qs []*hwq.RawQueue
	defer func() {
		for _, q := range qs {
			q.Close()
		}
	}()
	var regions []*memreg.Region
	defer func() {
		for _, r := range regions {
			r.CloseWhenReleased()
		}
	}()
	for i := range queues {
		r, err := memreg.New(memreg.Options{BufSize: 2048, Count: max(c.Frames, 64)})
		if err != nil {
			return err
		}
		regions = append(regions, r)
		q, err := hwq.OpenRawQueue(c.Iface, i, r, &hwq.RawQueueOptions{NetNS: nsfd, Steering: steer, RingSize: 1024})
		if err != nil {
			return err
		}
		qs = append(qs, q)
	}
	m := qs[0].Mode()
	mode := "zero-copy"
	if !m.ZeroCopy {
		mode = fmt.Sprintf("copy mode (%v)", m.CopyReason)
	}
	xdp := m.XDP.String() + " XDP"
	if m.XDPReason != nil {
		xdp += fmt.Sprintf(" (%v)", m.XDPReason)
	}
	fmt.Fprintf(out, "rawmcast: %s, %d raw queue(s), %s, %s\n", c.Iface, len(qs), mode, xdp)
	rule := bpf.RawRule{Dst: c.Group, Join: !c.NoJoin}
	if c.Port != 0 {
		rule.Proto, rule.DstPort = unix.IPPROTO_UDP, uint16(c.Port)
	}
	id, err := steer.AddRule(rule)
	if err != nil {
		return err
	}

	var mu sync.Mutex
	srcs := map[string]*source{}
	total := 0
	done := make(chan struct{})
	var once sync.Once
	finish := func() { once.Do(func() { close(done) }) }
	var wg sync.WaitGroup
	errc := make(chan error, len(qs))
	for _, q := range qs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			frames := make([]hwq.Frame, 64)
			for {
				n, err := q.Receive(frames)
				if err != nil {
					if !errors.Is(err, os.ErrClosed) {
						errc <- err
					}
					finish()
					return
				}
				mu.Lock()
				for _, f := range frames[:n] {
					s := srcOf(f.Bytes())
					e := srcs[s]
					if e == nil {
						e = &source{}
						srcs[s] = e
					}
					e.frames++
					e.bytes += uint64(f.Len)
					f.Buf.Release()
				}
				total += n
				if c.Count > 0 && total >= c.Count {
					finish()
				}
				mu.Unlock()
			}
		}()
	}
	var end <-chan time.Time
	if c.Duration > 0 {
		end = time.After(c.Duration)
	}
	tick := time.NewTicker(max(c.Interval, 10*time.Millisecond))
	defer tick.Stop()
	last := time.Now()
	report := func(final bool) {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		dt := now.Sub(last).Seconds()
		last = now
		keys := make([]string, 0, len(srcs))
		for k := range srcs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			e := srcs[k]
			if final {
				fmt.Fprintf(out, "total %s: %d frames, %d bytes\n", k, e.frames, e.bytes)
				continue
			}
			df, db := e.frames-e.lastFrames, e.bytes-e.lastBytes
			e.lastFrames, e.lastBytes = e.frames, e.bytes
			fmt.Fprintf(out, "%s: %.0f frames/s, %.3f Mbit/s\n", k, float64(df)/dt, float64(db)*8/dt/1e6)
		}
	}
loop:
	for {
		select {
		case <-tick.C:
			report(false)
		case <-done:
			break loop
		case <-end:
			break loop
		case <-c.stop:
			break loop
		}
	}
	st, rerr := steer.RuleStats(id)
	for _, q := range qs {
		q.Close() // ends the receivers
	}
	wg.Wait()
	report(true)
	if rerr == nil {
		fmt.Fprintf(out, "rule: %d frames to the raw queues, %d on queues without one (passed to the kernel)\n", st.Packets, st.NoSocket)
	}
	select {
	case err := <-errc:
		return err
	default:
	}
	return nil
}

// rxQueues returns the interface's RX queue count (hwq's netdev queue list, or one).
func rxQueues(ifname string, nsfd int) (int, error) {
	c, err := hwq.Open(hwq.Options{NetNS: nsfd})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	idx, err := c.Ifindex(ifname)
	if err != nil {
		return 0, err
	}
	n := 0
	if qs, err := c.Queues(idx); err == nil {
		for _, q := range qs {
			if q.Type == hwq.QueueRX {
				n++
			}
		}
	}
	return max(n, 1), nil
}

// srcOf names a frame's IPv4/IPv6 source address and UDP/TCP source port.
func srcOf(f []byte) string {
	if len(f) < 14 {
		return "?"
	}
	et := int(f[12])<<8 | int(f[13])
	l3 := f[14:]
	switch {
	case et == 0x0800 && len(l3) >= 20:
		ihl := int(l3[0]&15) * 4
		a := netip.AddrFrom4([4]byte(l3[12:16]))
		if len(l3) >= ihl+2 {
			return netip.AddrPortFrom(a, uint16(l3[ihl])<<8|uint16(l3[ihl+1])).String()
		}
		return a.String()
	case et == 0x86dd && len(l3) >= 42:
		a := netip.AddrFrom16([16]byte(l3[8:24]))
		return netip.AddrPortFrom(a, uint16(l3[40])<<8|uint16(l3[41])).String()
	}
	return net.HardwareAddr(f[6:12]).String()
}
