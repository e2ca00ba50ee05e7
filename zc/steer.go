package zc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/hwq"
	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/internal/loop"
)

// Steering of a listener: which queue owns each accepted connection, and (with
// ListenOptions.SteerInterfaces) where the connection's packets are processed and sent.
//
// Under BPF steering the sk_reuseport program places a new connection by the flow table,
// then by the policy, then by a hash. The CPU policy needs to know which queue runs on which
// CPU: queue i runs pinned on the i-th CPU the process may use (Config.NoPin off), so the
// listener writes CPU→queue entries for every possible CPU:
//   - the CPU of a queue maps to that queue (the lowest-numbered queue when several share a
//     CPU);
//   - a CPU without a queue maps to the queue of its SMT sibling (the same core), the one with
//     the fewest CPUs mapped to it so far, then the lowest index;
//   - every other CPU has no entry, and its SYNs are placed by the hash. Mapping such a CPU
//     to a "nearby" queue (same L3 or NUMA node) gained no locality — the flow's packets
//     keep arriving on that CPU, not on the queue's — and concentrated connections: with
//     SYNs received on one CPU (one RX queue without RSS, or a loopback client on one
//     thread) every connection went to one queue (16-CPU machine, 4 queues, 512 echo
//     connections from a client on other CPUs: all on queue 0, 0.35× Go net's msgs/s; the
//     hash policy 1.03×).
//
// With Config.SteerPolicy left at its zero value (bpf.PolicyAuto) the listener uses the CPU
// policy when it is exact: every queue's thread is pinned on a CPU of its own. Otherwise
// (NoPin, pinning refused, more queues than CPUs, a single queue) it uses the hash, says why
// in ListenerStats.Steering and counts it in Stats.Steering.PolicyFallbacks. PolicyCPU asked for
// explicitly is used even when it cannot be exact (the map then names the CPUs the queues
// would have been pinned on), and ListenerStats.Steering.Exact says so.

// steerInfo is ListenerStats.Steering: the two have the same fields (so one is assignable
// to the other); the doc of each field is there.
type steerInfo struct {
	Mode         SteeringMode
	BPF          bool
	Fallback     string
	Policy       bpf.Policy
	PolicyReason string
	Exact        bool
	QueueCPUs    []int
	CPUQueues    []int
	Interfaces   []InterfaceSteering
}

// complete reports whether everything asked for the interface is in place.
func (i InterfaceSteering) complete() bool { return i.XDPRedirect && i.TC && !i.XPS }

// describe is the interface's part of the steering summary: "eth1: xdp redirect, tc egress".
func (i InterfaceSteering) describe() string {
	var parts []string
	switch {
	case i.XDPRedirect:
		parts = append(parts, "xdp redirect")
	case i.XDP:
		parts = append(parts, "xdp (no redirect)")
	default:
		parts = append(parts, "no xdp")
	}
	switch {
	case i.TC && i.XPS:
		parts = append(parts, "tc egress (overridden by XPS)")
	case i.TC:
		parts = append(parts, "tc egress")
	default:
		parts = append(parts, "no tc")
	}
	s := i.Name + ": " + strings.Join(parts, ", ")
	if i.Reason != "" {
		s += " (" + i.Reason + ")"
	}
	return s
}

// summary is a one-line report (ListenerStats.SteeringSummary): "bpf, policy cpu (exact):
// auto: ...; queues on cpus [0 1]; eth1: xdp redirect, tc egress".
func (i steerInfo) summary() string {
	var b strings.Builder
	switch {
	case i.BPF:
		fmt.Fprintf(&b, "bpf, policy %v", i.Policy)
		if i.Policy&bpf.PolicyCPU != 0 {
			if i.Exact {
				b.WriteString(" (exact)")
			} else {
				b.WriteString(" (not exact)")
			}
		}
	case i.Fallback != "":
		fmt.Fprintf(&b, "reuseport hash (fallback: %s)", i.Fallback)
	case i.Mode == SteerSingleListener:
		b.WriteString("single listener, round robin")
	default:
		fmt.Fprintf(&b, "reuseport hash (%v)", i.Mode)
	}
	if i.PolicyReason != "" {
		b.WriteString(": " + i.PolicyReason)
	}
	fmt.Fprintf(&b, "; queues on cpus %v", i.QueueCPUs)
	for _, f := range i.Interfaces {
		b.WriteString("; " + f.describe())
	}
	return b.String()
}

func (i steerInfo) clone() steerInfo {
	i.QueueCPUs = slices.Clone(i.QueueCPUs)
	i.CPUQueues = slices.Clone(i.CPUQueues)
	i.Interfaces = slices.Clone(i.Interfaces)
	return i
}

// steeringInfo returns how the listener steers connections, and why (ListenerStats.Steering).
func (i *steerInfo) steeringInfo() steerInfo { return i.clone() }

// steerInfo is the listener's steering part (listenerPart): its state, for Stats.
func (i *steerInfo) accepted(*Conn) {}
func (i *steerInfo) close()         {}
func (i *steerInfo) stats(s *ListenerStats) {
	si := i.steeringInfo()
	s.Steering, s.SteeringSummary = si, si.summary()
}

// steerCounters are the engine's steering counters (Stats).
type steerCounters struct {
	cpu, policyFallbacks, attachFallbacks atomic.Uint64
}

// steerPart is the index of the engine's steerCounters in Engine.parts.
var steerPart = registerEnginePart(func() enginePart { return new(steerCounters) })

// steerCtr is the engine's steering counters.
func (e *Engine) steerCtr() *steerCounters { return e.parts[steerPart].(*steerCounters) }

// steerCounters are an enginePart: counters only.
func (c *steerCounters) closeStart() {}
func (c *steerCounters) closeEnd()   {}

// stats fills Stats.Steering's counters.
func (c *steerCounters) stats(s *Stats) {
	s.Steering.CPU = c.cpu.Load()
	s.Steering.PolicyFallbacks = c.policyFallbacks.Load()
	s.Steering.AttachFallbacks = c.attachFallbacks.Load()
}

// checkSteerOptions refuses bad ListenOptions.SteerInterfaces before any socket exists.
func (e *Engine) checkSteerOptions(opts *ListenOptions) error {
	if len(opts.SteerInterfaces) == 0 {
		return nil
	}
	if e.cfg.Steering != SteerAuto && e.cfg.Steering != SteerBPF {
		return fmt.Errorf("SteerInterfaces needs BPF steering (Config.Steering is %v): %w", e.cfg.Steering, ErrInvalid)
	}
	seen := map[string]bool{}
	for _, name := range opts.SteerInterfaces {
		if name == "" || len(name) >= unix.IFNAMSIZ || strings.ContainsAny(name, "/ \t\n") {
			return fmt.Errorf("SteerInterfaces: bad interface name %q: %w", name, ErrInvalid)
		}
		if seen[name] {
			return fmt.Errorf("SteerInterfaces: %q named twice: %w", name, ErrInvalid)
		}
		seen[name] = true
	}
	return nil
}

// queueCPUs returns, per queue, the CPU its thread is pinned on, or -1.
func (e *Engine) queueCPUs() []int {
	out := make([]int, len(e.queues))
	for i, q := range e.queues {
		out[i] = -1
		tid := int(q.TID())
		if e.cfg.NoPin || tid <= 0 {
			continue
		}
		if loop.PinnedTo(tid, q.cpu) {
			out[i] = q.cpu
		}
	}
	return out
}

// choosePolicy resolves the asked policy for a listener of nq queues (nq == len(pinned),
// or 1 for SteerSingleListener). pinned[q] is queue q's pinned CPU or -1; nominal[q] the CPU
// it would be pinned on. It returns the policy, whether the CPU policy is exact, and why.
func choosePolicy(asked bpf.Policy, pinned, nominal []int, noPin bool) (bpf.Policy, bool, string) {
	why := ""
	switch {
	case len(pinned) <= 1:
		why = "one queue"
	case noPin:
		why = "queues are not pinned (Config.NoPin): the CPU that receives a SYN says nothing about where a queue runs"
	default:
		for q, c := range pinned {
			if c < 0 {
				why = fmt.Sprintf("queue %d is not pinned on CPU %d (the kernel refused the affinity: a cpuset?)", q, nominal[q])
				break
			}
			if i := slices.Index(pinned, c); i < q {
				why = fmt.Sprintf("queues %d and %d share CPU %d (more queues than CPUs): some queues would get no connections", i, q, c)
				break
			}
		}
	}
	exact := why == ""
	switch {
	case asked == bpf.PolicyAuto && exact:
		return bpf.PolicyCPU, true, "auto: every queue runs pinned on a CPU of its own"
	case asked == bpf.PolicyAuto:
		return bpf.PolicyHash, false, "auto chose the hash: " + why
	case asked == bpf.PolicyHash:
		return asked, false, "asked (Config.SteerPolicy = PolicyHash)"
	case asked&bpf.PolicyCPU != 0 && !exact:
		return asked, false, fmt.Sprintf("asked (Config.SteerPolicy = %v); the CPU policy cannot be exact: %s", asked, why)
	}
	return asked, asked&bpf.PolicyCPU != 0, fmt.Sprintf("asked (Config.SteerPolicy = %v)", asked)
}

// cpuTopology is what the CPU→queue mapping needs to know about the machine.
type cpuTopology struct {
	ncpu int // possible CPUs (at most bpf.MaxCPUs)
	// levels, closest first (SMT core, last-level cache, NUMA node): levels[i][c] names the
	// group CPU c belongs to at that level; a CPU missing from a level shares no group there.
	levels []map[int]int
}

// readTopology reads the possible CPUs, SMT siblings, L3 cache sharing and NUMA nodes from
// sysfs; what it cannot read is left out.
func readTopology() cpuTopology {
	t := cpuTopology{}
	if b, err := os.ReadFile("/sys/devices/system/cpu/possible"); err == nil {
		if cpus, err := parseCPUList(string(b)); err == nil && len(cpus) > 0 {
			t.ncpu = slices.Max(cpus) + 1
		}
	}
	if t.ncpu == 0 {
		t.ncpu = max(runtime.NumCPU(), slices.Max(allowedCPUs())+1)
	}
	t.ncpu = min(t.ncpu, bpf.MaxCPUs)
	// A group is named by its lowest CPU.
	byList := func(path func(c int) string) map[int]int {
		m := map[int]int{}
		for c := 0; c < t.ncpu; c++ {
			b, err := os.ReadFile(path(c))
			if err != nil {
				continue
			}
			if l, err := parseCPUList(string(b)); err == nil && slices.Contains(l, c) {
				m[c] = l[0]
			}
		}
		return m
	}
	smt := byList(func(c int) string {
		return fmt.Sprintf("/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c)
	})
	l3 := byList(func(c int) string {
		return fmt.Sprintf("/sys/devices/system/cpu/cpu%d/cache/index3/shared_cpu_list", c)
	})
	node := map[int]int{}
	lists, _ := filepath.Glob("/sys/devices/system/node/node[0-9]*/cpulist")
	for _, p := range lists {
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(filepath.Dir(p)), "node"))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cpus, _ := parseCPUList(string(b))
		for _, c := range cpus {
			node[c] = n
		}
	}
	t.levels = []map[int]int{smt, l3, node}
	return t
}

// parseCPUList parses the kernel's CPU list format ("0-3,8,10-11").
func parseCPUList(s string) ([]int, error) {
	var out []int
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("bad CPU list %q", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a || b-a > 1<<16 {
				return nil, fmt.Errorf("bad CPU list %q", s)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out, nil
}

// cpuQueueMap maps the CPUs 0..t.ncpu-1 that own a queue, or share a core with one, to a
// queue, given each queue's CPU (see the comment at the top of this file for the rule); -1
// for the others (the hash places them). A queue CPU outside 0..ncpu-1 is ignored.
func cpuQueueMap(qcpu []int, t cpuTopology) []int {
	m := make([]int, t.ncpu)
	for c := range m {
		m[c] = -1
	}
	load := make([]int, len(qcpu))
	var owners []int // queues that own a CPU
	for q, c := range qcpu {
		if c >= 0 && c < t.ncpu && m[c] < 0 {
			m[c] = q
			load[q]++
			owners = append(owners, q)
		}
	}
	if len(owners) == 0 || len(t.levels) == 0 {
		return m
	}
	smt := t.levels[0]
	for c := range m {
		g, ok := smt[c]
		if m[c] >= 0 || !ok {
			continue
		}
		best := -1
		for _, q := range owners {
			if h, ok := smt[qcpu[q]]; ok && h == g && (best < 0 || load[q] < load[best]) {
				best = q
			}
		}
		if best >= 0 {
			m[c] = best
			load[best]++
		}
	}
	return m
}

func init() {
	features.steerCheck = (*Engine).checkSteerOptions
	features.steer = func(l *Listener, o *ListenOptions) (listenerPart, error) {
		info := new(steerInfo)
		return info, l.setupSteering(o, info)
	}
}

// setupSteering decides and installs the listener's steering, and says how in info (the
// listener's part: Stats). It runs in Listen after the sockets exist, on the caller's
// thread: interfaces are looked up in its network namespace. An error fails Listen (the
// caller closes the sockets); l.steer is set only on success.

func (l *Listener) setupSteering(opts *ListenOptions, info *steerInfo) error {
	e := l.e
	nominal := make([]int, len(e.queues))
	for i, q := range e.queues {
		nominal[i] = q.cpu
	}
	*info = steerInfo{Mode: e.cfg.Steering, Policy: bpf.PolicyHash, QueueCPUs: e.queueCPUs()}
	bpfMode := e.cfg.Steering == SteerAuto || e.cfg.Steering == SteerBPF
	if !bpfMode || (len(l.socks) < 2 && len(opts.SteerInterfaces) == 0) {
		switch {
		case !bpfMode:
			info.PolicyReason = "no BPF steering asked"
		default:
			info.PolicyReason = "one queue: nothing to steer"
		}
		return nil
	}
	// Interfaces are looked up first: a name that is no interface is bad input in any case.
	ifindex := make([]int, len(opts.SteerInterfaces))
	for i, name := range opts.SteerInterfaces {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return fmt.Errorf("SteerInterfaces: no interface %q in this network namespace: %w", name, ErrInvalid)
		}
		ifindex[i] = ifi.Index
	}
	pinned := info.QueueCPUs[:len(l.socks)]
	policy, exact, why := choosePolicy(e.cfg.SteerPolicy, pinned, nominal[:len(l.socks)], e.cfg.NoPin)

	fallback := func(err error) error {
		if e.cfg.Steering == SteerBPF {
			return fmt.Errorf("BPF steering: %w", err)
		}
		l.steerErr = err
		info.Fallback = err.Error()
		e.steerFallbacks.Add(1)
		for i, name := range opts.SteerInterfaces {
			info.Interfaces = append(info.Interfaces, InterfaceSteering{Name: name, Index: ifindex[i], Reason: "BPF steering unavailable"})
			e.steerCtr().attachFallbacks.Add(1)
		}
		return nil
	}
	s, err := bpf.NewSteering(l.fds(), &bpf.Options{Policy: policy})
	if err != nil {
		return fallback(err)
	}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	var cpuMap []int
	if policy&bpf.PolicyCPU != 0 {
		qcpu := slices.Clone(pinned)
		for q, c := range qcpu {
			if c < 0 {
				qcpu[q] = nominal[q] // not pinned: where it would have run
			}
		}
		cpuMap = cpuQueueMap(qcpu, readTopology())
		for c, q := range cpuMap {
			if q < 0 {
				continue
			}
			if err := s.SetCPUQueue(c, q); err != nil {
				return fallback(err)
			}
		}
	}
	for i, name := range opts.SteerInterfaces {
		is, err := l.attachInterface(s, name, ifindex[i], pinned)
		if err != nil {
			return err
		}
		info.Interfaces = append(info.Interfaces, is)
	}
	info.BPF, info.Policy, info.Exact, info.PolicyReason, info.CPUQueues = true, policy, exact, why, cpuMap
	if policy&bpf.PolicyCPU != 0 {
		e.steerCtr().cpu.Add(1)
	} else if e.cfg.SteerPolicy == bpf.PolicyAuto && len(l.socks) > 1 {
		e.steerCtr().policyFallbacks.Add(1)
	}
	ok = true
	l.steer = s
	return nil
}

// attachInterface attaches the XDP and tc egress programs of s to the interface (name,
// index) and points the XDP redirect of every pinned queue at its CPU. Under SteerAuto what
// fails is reported in the result and counted; under SteerBPF it is the error.
func (l *Listener) attachInterface(s *bpf.Steering, name string, index int, pinned []int) (InterfaceSteering, error) {
	e := l.e
	strict := e.cfg.Steering == SteerBPF
	is := InterfaceSteering{Name: name, Index: index}
	var reasons []string
	fail := func(what string, err error) error {
		if strict {
			return fmt.Errorf("SteerInterfaces %s: %s: %w", name, what, err)
		}
		reasons = append(reasons, what+": "+err.Error())
		return nil
	}
	// veth: driver-mode XDP turns the skb into a frame and the cpumap rebuilds it without
	// its checksum state, so segments the peer left to checksum offload (the default) would
	// be dropped as corrupt. Generic XDP redirects the skb itself and keeps it.
	mode := bpf.XDPAuto
	if isVeth(name) {
		mode = bpf.XDPGeneric
		is.Note = "veth: XDP in generic (skb) mode, which keeps the checksum state of the peer's packets"
	}
	if err := s.AttachXDP(index, mode); err != nil {
		if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) {
			err = fmt.Errorf("%w (another XDP program, perhaps another listener's, is attached: an interface has one)", err)
		}
		if err := fail("attach xdp", err); err != nil {
			return is, err
		}
	} else {
		is.XDP = true
		redirect := 0
		for q, c := range pinned {
			if c < 0 {
				continue
			}
			if err := s.SetQueueCPU(q, c); err != nil {
				if err := fail(fmt.Sprintf("xdp redirect of queue %d to cpu %d", q, c), err); err != nil {
					return is, err
				}
				continue
			}
			redirect++
		}
		switch {
		case redirect == len(pinned):
			is.XDPRedirect = true
		case redirect == 0 && e.cfg.NoPin:
			err := errs.NotSupported("XDP redirect to a queue's CPU", "pinned queues (Config.NoPin is set)", nil)
			if err := fail("xdp redirect", err); err != nil {
				return is, err
			}
		default:
			err := errs.NotSupported(fmt.Sprintf("XDP redirect for %d of %d queues", len(pinned)-redirect, len(pinned)),
				"queues pinned on their CPUs (the kernel refused some affinities)", nil)
			if err := fail("xdp redirect", err); err != nil {
				return is, err
			}
		}
	}
	xps, err := s.AttachTCEgress(index)
	if err != nil {
		if err := fail("attach tc egress", err); err != nil {
			return is, err
		}
	} else {
		is.TC, is.XPS = true, xps
		if xps {
			err := errs.NotSupported("TX queue choice by tc egress on "+name,
				"XPS off on the device (empty /sys/class/net/"+name+"/queues/tx-*/xps_cpus and xps_rxqs)", nil)
			if err := fail("tc egress", err); err != nil {
				return is, err
			}
		}
	}
	is.Reason = strings.Join(reasons, "; ")
	if !is.complete() {
		e.steerCtr().attachFallbacks.Add(1)
	}
	return is, nil
}

// isVeth reports whether the interface's driver is veth (ETHTOOL_GDRVINFO, in the calling
// thread's network namespace).
func isVeth(name string) bool {
	d, err := hwq.Driver(name)
	return err == nil && d == "veth"
}
