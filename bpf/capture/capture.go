package capture

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// MaxSnap is the largest snap length (bytes captured per packet): 256 KiB,
// tcpdump's default and the largest packet Wireshark reads. It holds every
// frame without BIG TCP (a GSO packet at tc egress, a GRO packet at
// ingress: at most 14 + 4 + 40 + 65535 bytes) and BIG TCP packets up to
// 256 KiB (lo on Linux 6.18 sends IPv4 GSO packets of about 95 KiB).
// Longer packets are truncated and counted (Stats.Truncated).
const MaxSnap = 262144

// DefaultRingSize is the ring buffer's size when Options.RingSize is 0.
const DefaultRingSize = 4 << 20

// MaxRingSize is the largest ring buffer accepted.
const MaxRingSize = 1 << 30

// DefaultReorderWindow is Options.ReorderWindow's default.
const DefaultReorderWindow = 2 * time.Millisecond

// maxInterfaces is the most interfaces one capture attaches to (the
// counters map's size).
const maxInterfaces = 256

// maxPending bounds the reorder buffer (packets held back).
const maxPending = 1 << 16

// Options configure a capture.
type Options struct {
	// Interfaces are the interface indexes to capture on, in the calling
	// thread's network namespace. At least one.
	Interfaces []int
	// Hooks says where (HookIngress, HookEgress, HookXDP); 0 means
	// HookIngress|HookEgress. HookXDP needs an XDP program attached to
	// every interface in Interfaces; combined with HookIngress every
	// received packet is recorded twice (before and after GRO).
	Hooks Hook
	// Snap is the number of bytes kept from each packet, from the
	// Ethernet header on, 1..MaxSnap (tcpdump's -s). Required.
	Snap int
	// RingSize is the BPF ring buffer's size in bytes: a power of two,
	// at least a page and large enough for two records of the snap
	// length, at most MaxRingSize. 0 means DefaultRingSize. When the ring
	// is full, packets are not recorded (the flow itself is not touched)
	// and the loss is counted and written into the file.
	RingSize int
	// ReorderWindow: records of different CPUs reach the ring in the
	// order they reserved their place, which can differ from their
	// timestamps' order by the few instructions between reserving and
	// reading the clock (more when a virtual CPU is descheduled there).
	// Packets are held back this long (in timestamp time) and written in
	// timestamp order. 0 means DefaultReorderWindow; negative disables it.
	// Stats.OutOfOrder counts packets that still came too late.
	ReorderWindow time.Duration
	// Comment is added to the pcapng section header's comment.
	Comment string
}

// Stats are a capture's counters. Kernel counters are summed over CPUs.
type Stats struct {
	Matched   uint64 // packets of the selected flows the programs saw
	Captured  uint64 // of those, written into the ring buffer
	Dropped   uint64 // of those, lost because the ring buffer was full
	Truncated uint64 // captured with fewer bytes than the packet had (snap length)
	// Written is the number of packets written to the pcapng output.
	Written uint64
	// OutOfOrder counts packets written with an earlier timestamp than
	// the packet before them (they arrived later than ReorderWindow).
	OutOfOrder uint64
	// BadRecords counts ring records that could not be decoded (a bug).
	BadRecords uint64
	// HWStamped counts packets that carried a NIC hardware timestamp.
	HWStamped uint64
	// PerInterface holds the kernel counters by interface index.
	PerInterface map[int]IfStats
}

// IfStats are one interface's kernel counters.
type IfStats struct {
	Matched, Captured, Dropped, Truncated uint64
}

// Capture records the packets of selected flows from BPF programs into a
// pcapng stream. Create it with New; all methods are safe for concurrent
// use. Close stops it, writes the final statistics and flushes the
// output.
type Capture struct {
	mu     sync.Mutex
	closed bool
	final  Stats // Stats after Close

	spec   *ebpf.CollectionSpec
	objs   captureObjects
	xdp    []*ebpf.Program
	links  []attachment
	netns  *os.File // the namespace the capture was created in
	ifaces []Interface
	hooks  Hook
	snap   int
	ring   int   // ring buffer bytes
	window int64 // ns; 0 = no reordering
	start  time.Time

	cfg     captureCapConfig
	entries map[captureFlowKey]int // selector reference counts
	kindRef [4]int                 // entries per kind bit

	rd   *ringbuf.Reader
	bw   *bufio.Writer // between the pcapng encoder and the caller's writer
	out  *pcapWriter
	done chan struct{}
	// Written by the reader goroutine; read after done.
	werr     error
	pending  pendingQueue
	consumed uint64        // records read from the ring
	target   atomic.Uint64 // set by Close: records the kernel wrote
	maxTS    int64
	lastTS   int64
	free     [][]byte

	written, outOfOrder, badRecords, hwStamped atomic.Uint64
}

type attachment struct {
	what string
	l    link.Link
}

// New loads the capture programs, attaches them to the interfaces at the
// chosen hooks and starts writing pcapng to w: a section header, one
// interface description per interface (link type Ethernet, nanosecond
// timestamps, its name, and where its timestamps come from), then one
// enhanced packet block per packet of the selected flows, until Close.
// More flows can be added and removed while it runs. w is written from a
// goroutine of the capture (through a 1 MiB buffer, flushed whenever the
// ring runs empty); it must not be used by others until Close returns, and
// must not block forever (Close waits for the last write). A write error
// stops the output (the capture keeps draining the ring) and is returned
// by Close.
//
// New must run in the network namespace of the interfaces (and of the
// listeners named by Listener selectors). The programs are separate from
// zcnet's steering programs and exist only while the capture runs: with
// no capture, packets pay nothing.
func New(w io.Writer, opts Options, sel ...Selector) (*Capture, error) {
	const op = "new"
	if w == nil {
		return nil, invalid(op, "nil io.Writer")
	}
	c := &Capture{entries: map[captureFlowKey]int{}, done: make(chan struct{})}
	if err := c.setOptions(op, opts); err != nil {
		return nil, err
	}
	var ents []entry
	for _, s := range sel {
		e, err := s.entry()
		if err != nil {
			return nil, opErr(op, err)
		}
		if err := s.check(); err != nil {
			return nil, opErr(op, err)
		}
		ents = append(ents, e)
	}
	ok := false
	defer func() {
		if !ok {
			c.release()
		}
	}()
	ns, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, opErr(op, err)
	}
	c.netns = ns
	if err := c.load(c.ring); err != nil {
		return nil, err
	}
	for _, e := range ents {
		if err := c.addEntry(e); err != nil {
			return nil, opErr(op, err)
		}
	}
	if err := c.writeConfig(); err != nil {
		return nil, opErr(op, err)
	}
	var names []string
	for _, s := range sel {
		names = append(names, s.String())
	}
	comment := "zcnet capture of " + strings.Join(names, ", ")
	if len(names) == 0 {
		comment = "zcnet capture (flows added later)"
	}
	if opts.Comment != "" {
		comment += "; " + opts.Comment
	}
	off, err := taiOffset()
	if err != nil {
		return nil, opErr(op, err)
	}
	c.bw = bufio.NewWriterSize(w, 1<<20)
	c.out, err = newPcapWriter(c.bw, pcapSection{Comment: comment, Snap: c.snap, Interfaces: c.ifaces, Hooks: c.hooks}, off)
	if err != nil {
		return nil, opErr("write pcapng header", err)
	}
	c.rd, err = ringbuf.NewReader(c.objs.CapRing)
	if err != nil {
		return nil, opErr("open ring buffer", err)
	}
	if err := c.attach(); err != nil {
		return nil, err
	}
	c.start = time.Now()
	go c.run()
	ok = true
	return c, nil
}

func (c *Capture) setOptions(op string, o Options) error {
	switch {
	case o.Snap <= 0 || o.Snap > MaxSnap:
		return invalid(op, "snap length %d outside 1..%d", o.Snap, MaxSnap)
	case len(o.Interfaces) == 0:
		return invalid(op, "no interface given")
	case len(o.Interfaces) > maxInterfaces:
		return invalid(op, "%d interfaces, at most %d", len(o.Interfaces), maxInterfaces)
	case o.Hooks&^(HookIngress|HookEgress|HookXDP) != 0:
		return invalid(op, "unknown hook bits %#x", uint32(o.Hooks))
	}
	c.snap = o.Snap
	c.hooks = o.Hooks
	if c.hooks == 0 {
		c.hooks = HookIngress | HookEgress
	}
	ring := o.RingSize
	if ring == 0 {
		ring = DefaultRingSize
	}
	c.ring = ring
	if min := minRingSize(o.Snap); ring < min || ring > MaxRingSize || ring&(ring-1) != 0 {
		return invalid(op, "ring size %d: want a power of two from %d (two records of snap length %d) to %d", o.RingSize, min, o.Snap, MaxRingSize)
	}
	switch {
	case o.ReorderWindow == 0:
		c.window = int64(DefaultReorderWindow)
	case o.ReorderWindow > 0:
		c.window = int64(o.ReorderWindow)
	}
	for _, idx := range o.Interfaces {
		i, err := ProbeInterface(idx)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(c.ifaces, func(x Interface) bool { return x.Index == idx }) {
			return invalid(op, "interface %d given twice", idx)
		}
		c.ifaces = append(c.ifaces, i)
	}
	return nil
}

// sizeClasses are the record sizes of capture.bpf.c (CAP_*_CLASS).
var sizeClasses = []int{128, 256, 512, 1024, 1536, 2048, 4096, 9216, 16384, 32768, 65600, 131072, MaxSnap}

// recordSize is the ring space one record of snap bytes takes: the
// kernel's 8-byte record header, struct cap_record and the size class,
// rounded up to 8.
func recordSize(snap int) int {
	for _, n := range sizeClasses {
		if snap <= n {
			return (8 + recordHeaderSize + n + 7) &^ 7
		}
	}
	return -1
}

// minRingSize is the smallest ring accepted for a snap length: two
// records, rounded up to a power of two and at least a page.
func minRingSize(snap int) int {
	need := 2 * recordSize(snap)
	n := os.Getpagesize()
	for n < need {
		n <<= 1
	}
	return n
}

// taiOffset returns CLOCK_TAI - CLOCK_REALTIME, a whole number of seconds
// (0 unless something, such as NTP, has set the kernel's TAI offset).
func taiOffset() (int64, error) {
	var tai, rt unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &rt); err != nil {
		return 0, os.NewSyscallError("clock_gettime", err)
	}
	if err := unix.ClockGettime(unix.CLOCK_TAI, &tai); err != nil {
		return 0, os.NewSyscallError("clock_gettime CLOCK_TAI", err)
	}
	d := tai.Nano() - rt.Nano()
	sec := (d + 5e8) / 1e9
	return sec * 1e9, nil
}

func (c *Capture) load(ring int) error {
	const op = "load"
	spec, err := loadCapture()
	if err != nil {
		return opErr(op, err)
	}
	spec.Maps[captureMapCapRing].MaxEntries = uint32(ring)
	c.spec = spec
	var tc struct {
		captureMaps
		ZcCapEgress  *ebpf.Program `ebpf:"zc_cap_egress"`
		ZcCapIngress *ebpf.Program `ebpf:"zc_cap_ingress"`
	}
	if err := spec.LoadAndAssign(&tc, nil); err != nil {
		return loadErr(op, err)
	}
	c.objs.captureMaps = tc.captureMaps
	c.objs.ZcCapEgress = tc.ZcCapEgress
	c.objs.ZcCapIngress = tc.ZcCapIngress
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return opErr(op, err)
	}
	zero := make([]captureCapIfstats, ncpu)
	for _, i := range c.ifaces {
		if err := c.objs.CapStats.Update(uint32(i.Index), zero, ebpf.UpdateNoExist); err != nil {
			return opErr(op, err)
		}
	}
	return nil
}

func loadErr(op string, err error) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) && !errors.Is(err, unix.EPERM) {
		// A program the verifier rejects on a kernel with every feature is a
		// bug; on older kernels it means a missing feature.
		return opErr(op, fmt.Errorf("%w: %w", errOldKernel, err))
	}
	return opErr(op, err)
}

// attach attaches the programs: tc ingress first in the interface's tcx
// chain, tc egress last, fexit on each interface's XDP program.
func (c *Capture) attach() error {
	for _, i := range c.ifaces {
		if c.hooks&HookIngress != 0 {
			op := fmt.Sprintf("attach tc ingress to %s (ifindex %d)", i.Name, i.Index)
			l, err := link.AttachTCX(link.TCXOptions{Interface: i.Index, Program: c.objs.ZcCapIngress,
				Attach: ebpf.AttachTCXIngress, Anchor: link.Head()})
			if err != nil {
				return opErr(op, err)
			}
			c.links = append(c.links, attachment{what: op, l: l})
		}
		if c.hooks&HookEgress != 0 {
			op := fmt.Sprintf("attach tc egress to %s (ifindex %d)", i.Name, i.Index)
			l, err := link.AttachTCX(link.TCXOptions{Interface: i.Index, Program: c.objs.ZcCapEgress,
				Attach: ebpf.AttachTCXEgress, Anchor: link.Tail()})
			if err != nil {
				return opErr(op, err)
			}
			c.links = append(c.links, attachment{what: op, l: l})
		}
	}
	if c.hooks&HookXDP != 0 {
		return c.attachXDP()
	}
	return nil
}

// attachXDP records at XDP on every interface: an interface with an XDP
// program gets an fexit program on it (one per distinct program); one
// without gets the capture's own XDP program, which passes every frame.
func (c *Capture) attachXDP() error {
	done := map[uint32]bool{}
	var own *ebpf.Program
	for _, i := range c.ifaces {
		op := fmt.Sprintf("attach at XDP of %s (ifindex %d)", i.Name, i.Index)
		id, err := xdpProgID(i.Index)
		if err != nil {
			return opErr(op, err)
		}
		if id == 0 {
			if own == nil {
				if own, err = c.loadProgram(captureProgZcCapXdpPass, nil); err != nil {
					return loadErr(op, err)
				}
			}
			l, err := link.AttachXDP(link.XDPOptions{Program: own, Interface: i.Index})
			if err != nil {
				return opErr(op, err)
			}
			c.links = append(c.links, attachment{what: op + " (own XDP program)", l: l})
			continue
		}
		if done[id] {
			continue
		}
		done[id] = true
		if err := c.attachFexit(op, id); err != nil {
			return err
		}
	}
	return nil
}

// loadProgram loads one more program of the object, sharing the maps
// already loaded; modify may change its spec first.
func (c *Capture) loadProgram(name string, modify func(*ebpf.ProgramSpec)) (*ebpf.Program, error) {
	ps := c.spec.Programs[name].Copy()
	if modify != nil {
		modify(ps)
	}
	spec := &ebpf.CollectionSpec{Maps: c.spec.Maps, Programs: map[string]*ebpf.ProgramSpec{name: ps}}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		captureMapCapSettings: c.objs.CapSettings, captureMapCapFlows: c.objs.CapFlows,
		captureMapCapStats: c.objs.CapStats, captureMapCapRing: c.objs.CapRing,
	}})
	if err != nil {
		return nil, err
	}
	p := coll.DetachProgram(name)
	coll.Close()
	c.xdp = append(c.xdp, p)
	return p, nil
}

// attachFexit attaches zc_cap_xdp to the exit of XDP program id. Some
// kernels refuse tracing programs by policy (this project's CI machine
// answers EPERM even to root): the error then matches ErrPermission.
func (c *Capture) attachFexit(op string, id uint32) error {
	target, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return opErr(op, err)
	}
	defer target.Close()
	info, err := target.Info()
	if err != nil {
		return opErr(op, err)
	}
	if info.Type != ebpf.XDP {
		return invalid(op, "program %d is %s, not XDP", id, info.Type)
	}
	fn, err := info.FuncInfos()
	if err != nil || len(fn) == 0 || fn[0].Func == nil {
		return opErr(op, fmt.Errorf("%w: XDP program %d (%s) has no BTF function info, which fexit needs: %v", ErrNotSupported, id, info.Name, err))
	}
	name := fn[0].Func.Name
	op += fmt.Sprintf(": fexit on XDP program %d (%s)", id, name)
	p, err := c.loadProgram(captureProgZcCapXdp, func(ps *ebpf.ProgramSpec) {
		ps.AttachTarget = target
		ps.AttachTo = name
	})
	if errors.Is(err, unix.EPERM) {
		return &OpError{Op: op, Err: fmt.Errorf("%w: %s: the kernel refuses tracing (fexit) programs here; "+
			"capture with HookIngress instead, or start the capture (with its own XDP program) before an XDP program is attached: %w", ErrPermission, missingCaps(), err)}
	}
	if err != nil {
		return loadErr(op, err)
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: p, AttachType: ebpf.AttachTraceFExit})
	if err != nil {
		return opErr(op, err)
	}
	c.links = append(c.links, attachment{what: op, l: l})
	return nil
}

// Interfaces describes the interfaces the capture is attached to.
func (c *Capture) Interfaces() []Interface { return slices.Clone(c.ifaces) }

// Add selects more flows. Adding a selector already added counts it once
// more (Remove it as often). Listener selectors are checked in the
// network namespace the capture was created in.
func (c *Capture) Add(s Selector) error {
	op := "add " + s.String()
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	e, err := s.entry()
	if err != nil {
		return opErr(op, err)
	}
	if err := c.inNetns(s.check); err != nil {
		return opErr(op, err)
	}
	if err := c.addEntry(e); err != nil {
		return opErr(op, err)
	}
	return opErr(op, c.writeConfig())
}

// Remove stops selecting flows added with an equal selector; an error
// matching ErrNotFound when it was not added.
func (c *Capture) Remove(s Selector) error {
	op := "remove " + s.String()
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	e, err := s.entry()
	if err != nil {
		return opErr(op, err)
	}
	n := c.entries[e.key]
	if n == 0 {
		return opErr(op, fmt.Errorf("%w: not selected", ErrNotFound))
	}
	if n > 1 {
		c.entries[e.key] = n - 1
		return nil
	}
	if err := c.objs.CapFlows.Delete(&e.key); err != nil {
		return opErr(op, err)
	}
	delete(c.entries, e.key)
	c.kindRef[kindBit(e.kind)]--
	return opErr(op, c.writeConfig())
}

func kindBit(k uint32) int {
	switch k {
	case kindExact:
		return 0
	case kindPeer:
		return 1
	case kindLocal:
		return 2
	}
	return 3
}

func (c *Capture) addEntry(e entry) error {
	if c.entries[e.key] > 0 {
		c.entries[e.key]++
		return nil
	}
	if err := c.objs.CapFlows.Update(&e.key, uint32(1), ebpf.UpdateAny); err != nil {
		if errors.Is(err, unix.E2BIG) {
			return fmt.Errorf("%w: too many selectors (%d)", ErrInvalid, len(c.entries))
		}
		return err
	}
	c.entries[e.key] = 1
	c.kindRef[kindBit(e.kind)]++
	return nil
}

func (c *Capture) writeConfig() error {
	cfg := captureCapConfig{Snap: uint32(c.snap), Wakeup: uint32(c.ring / 4)}
	for i, n := range c.kindRef {
		if n > 0 {
			cfg.Kinds |= 1 << i
		}
	}
	if err := c.objs.CapSettings.Update(uint32(0), &cfg, ebpf.UpdateAny); err != nil {
		return err
	}
	c.cfg = cfg
	return nil
}

// inNetns runs fn on a thread in the capture's network namespace (the
// calling thread when it is there already).
func (c *Capture) inNetns(fn func() error) error {
	var want, have unix.Stat_t
	if err := unix.Fstat(int(c.netns.Fd()), &want); err != nil {
		return err
	}
	if unix.Stat("/proc/thread-self/ns/net", &have) == nil && have.Ino == want.Ino && have.Dev == want.Dev {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: it exits with the goroutine, so its
		// namespace does not leak into other goroutines.
		runtime.LockOSThread()
		if err := unix.Setns(int(c.netns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- os.NewSyscallError("setns", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func (c *Capture) lock(op string) error {
	if c == nil {
		return &OpError{Op: op, Err: ErrClosed}
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return &OpError{Op: op, Err: ErrClosed}
	}
	return nil
}

// Stats returns the counters. After Close it returns the final counts.
func (c *Capture) Stats() (Stats, error) {
	const op = "stats"
	if c == nil {
		return Stats{}, &OpError{Op: op, Err: ErrClosed}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.final, nil
	}
	st, err := c.kernelStats()
	return st, opErr(op, err)
}

func (c *Capture) kernelStats() (Stats, error) {
	st := Stats{PerInterface: map[int]IfStats{}}
	for _, i := range c.ifaces {
		var per []captureCapIfstats
		if err := c.objs.CapStats.Lookup(uint32(i.Index), &per); err != nil {
			return Stats{}, err
		}
		var s IfStats
		for _, v := range per {
			s.Matched += v.Matched
			s.Captured += v.Captured
			s.Dropped += v.Dropped
			s.Truncated += v.Truncated
		}
		st.PerInterface[i.Index] = s
		st.Matched += s.Matched
		st.Captured += s.Captured
		st.Dropped += s.Dropped
		st.Truncated += s.Truncated
	}
	st.Written = c.written.Load()
	st.OutOfOrder = c.outOfOrder.Load()
	st.BadRecords = c.badRecords.Load()
	st.HWStamped = c.hwStamped.Load()
	return st, nil
}

// Close detaches the programs (the flows never notice), writes every
// packet still in the ring, an interface statistics block per interface
// (packets seen and lost) and flushes the output. It returns the first
// error writing the output met, if any. Later calls return an error
// matching ErrClosed.
func (c *Capture) Close() error {
	const op = "close"
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for i := len(c.links) - 1; i >= 0; i-- {
		if err := c.links[i].l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach (%s): %w", c.links[i].what, err))
		}
	}
	c.links = nil
	// A program still running on another CPU when its link went away
	// finishes within microseconds; then the kernel's count of captured
	// records is final, and the reader reads up to it.
	time.Sleep(time.Millisecond)
	if st, err := c.kernelStats(); err == nil {
		c.target.Store(st.Captured)
	}
	if err := c.rd.Flush(); err != nil {
		errs = append(errs, err)
	}
	<-c.done
	end := time.Now()
	st, err := c.kernelStats()
	if err != nil {
		errs = append(errs, err)
	}
	c.final = st
	werr := c.werr
	if werr == nil {
		for _, i := range c.ifaces {
			s := st.PerInterface[i.Index]
			if werr = c.out.stats(i.Index, c.start, end, s.Matched, s.Dropped); werr != nil {
				break
			}
		}
	}
	if werr == nil {
		werr = c.out.flush()
	}
	if werr == nil {
		werr = c.bw.Flush()
	}
	if werr != nil {
		errs = append(errs, fmt.Errorf("write pcapng: %w", werr))
	}
	if err := c.release(); err != nil {
		errs = append(errs, err)
	}
	return opErr(op, errors.Join(errs...))
}

// release frees the kernel objects (Close, and failed constructors).
func (c *Capture) release() error {
	var errs []error
	for i := len(c.links) - 1; i >= 0; i-- {
		if err := c.links[i].l.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	c.links = nil
	if c.rd != nil {
		if err := c.rd.Close(); err != nil {
			errs = append(errs, err)
		}
		c.rd = nil
	}
	for _, p := range c.xdp {
		p.Close()
	}
	c.xdp = nil
	if err := c.objs.Close(); err != nil {
		errs = append(errs, err)
	}
	c.objs = captureObjects{}
	if c.netns != nil {
		c.netns.Close()
		c.netns = nil
	}
	return errors.Join(errs...)
}

// pollInterval is how often the reader looks at the ring when the
// programs did not wake it (they do once a quarter of the ring is used).
const pollInterval = 10 * time.Millisecond

// run reads the ring until Close flushes it, writing packets in
// timestamp order within the reorder window.
func (c *Capture) run() {
	defer close(c.done)
	var rec ringbuf.Record
	for {
		c.rd.SetDeadline(time.Now().Add(pollInterval))
		if rec.RawSample == nil {
			// The record is read straight into a buffer the packet keeps
			// until it is written (ReadInto grows it when it is too small).
			rec.RawSample = c.buffer(0)
		}
		err := c.rd.ReadInto(&rec)
		switch {
		case err == nil:
			c.take(rec.RawSample)
			rec.RawSample = nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			// Everything the ring held has been read, and every packet still
			// to come will have a later timestamp (it reads the clock after
			// reserving its place): write all, and let the output see it.
			c.emitUpTo(1<<63 - 1)
			if c.werr == nil {
				c.werr = c.out.flush()
			}
			if c.werr == nil {
				c.werr = c.bw.Flush()
			}
		case errors.Is(err, ringbuf.ErrFlushed):
			c.emitUpTo(1<<63 - 1)
			c.drainRest()
			return
		default:
			if c.werr == nil {
				c.werr = fmt.Errorf("read ring buffer: %w", err)
			}
			return
		}
	}
}

// drainRest reads the records Close knows the kernel wrote but the flush
// did not reach yet (a program that was still running when the flush
// began), for at most a few hundred milliseconds.
func (c *Capture) drainRest() {
	var rec ringbuf.Record
	deadline := time.Now().Add(300 * time.Millisecond)
	for c.consumed < c.target.Load() && time.Now().Before(deadline) {
		c.rd.SetDeadline(time.Now().Add(10 * time.Millisecond))
		rec.RawSample = c.buffer(0)
		if err := c.rd.ReadInto(&rec); err == nil {
			c.take(rec.RawSample)
		}
	}
	c.emitUpTo(1<<63 - 1)
}

func (c *Capture) take(raw []byte) {
	c.consumed++
	p, err := parseRecord(raw)
	if err != nil {
		c.badRecords.Add(1)
		return
	}
	p.seq = c.consumed
	p.buf = raw
	if p.HWTimestamp != 0 {
		c.hwStamped.Add(1)
	}
	if c.window == 0 {
		c.emit(&p)
		return
	}
	c.pending.insert(p)
	if p.TAI > c.maxTS {
		c.maxTS = p.TAI
	}
	c.emitUpTo(c.maxTS - c.window)
	for c.pending.len() > maxPending {
		c.emit(c.pending.pop())
	}
}

// emitUpTo writes the held-back packets with timestamps up to ts.
func (c *Capture) emitUpTo(ts int64) {
	for c.pending.len() > 0 && c.pending.first().TAI <= ts {
		c.emit(c.pending.pop())
	}
}

func (c *Capture) emit(p *Packet) {
	if p.TAI < c.lastTS {
		c.outOfOrder.Add(1)
	} else {
		c.lastTS = p.TAI
	}
	if c.werr == nil {
		if err := c.out.packet(p); err != nil {
			c.werr = err
		} else {
			c.written.Add(1)
		}
	}
	if len(c.free) < maxFree {
		c.free = append(c.free, p.buf[:0])
	}
}

// maxFree bounds the buffers kept for reuse.
const maxFree = 1024

// buffer returns an empty slice with room for n bytes, reusing written
// packets' buffers.
func (c *Capture) buffer(n int) []byte {
	for len(c.free) > 0 {
		b := c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
		if cap(b) >= n {
			return b
		}
	}
	return make([]byte, 0, max(n, 2048))
}

// pendingQueue holds packets back in timestamp order (ring order among
// equal timestamps). Packets come almost always in order, so an insert is
// an append; a late one is put in place with a binary search.
type pendingQueue struct {
	q    []Packet
	head int
}

func (p *pendingQueue) len() int       { return len(p.q) - p.head }
func (p *pendingQueue) first() *Packet { return &p.q[p.head] }

func (p *pendingQueue) insert(x Packet) {
	n := len(p.q)
	if n == p.head || p.q[n-1].TAI <= x.TAI {
		p.q = append(p.q, x)
		return
	}
	i := p.head + sort.Search(n-p.head, func(i int) bool { return p.q[p.head+i].TAI > x.TAI })
	p.q = slices.Insert(p.q, i, x)
}

// pop removes and returns the first packet.
func (p *pendingQueue) pop() *Packet {
	x := p.q[p.head]
	p.q[p.head] = Packet{}
	p.head++
	if p.head == len(p.q) {
		p.q, p.head = p.q[:0], 0
	} else if p.head > 1024 && p.head > len(p.q)/2 {
		n := copy(p.q, p.q[p.head:])
		clear(p.q[n:])
		p.q, p.head = p.q[:n], 0
	}
	return &x
}
