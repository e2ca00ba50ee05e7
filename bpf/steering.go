package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/zcnet/zcnet/internal/bpferr"
	"golang.org/x/sys/unix"
)

// MaxQueues is the most queues (listeners) one Steering can address.
const MaxQueues = 64

// MaxCPUs is the most CPUs the receive-CPU policy can name.
const MaxCPUs = 256

// Policy selects how sk_reuseport places a new connection that has no
// flow-table entry. The flow table always comes first and a hash of the
// 4-tuple is always the last resort. PolicyDSCP and PolicyCPU are bits that
// can be combined (DSCP is tried first).
type Policy uint32

const (
	// PolicyAuto is the zero value: "no policy chosen". NewSteering and
	// SetPolicy treat it as PolicyHash; zc.Config reads it as PolicyCPU
	// where every queue runs pinned on a CPU of its own and PolicyHash
	// elsewhere (zc.ListenerStats.Steering says which and why).
	PolicyAuto Policy = 0
	// PolicyDSCP: the DSCP class of the SYN picks the queue (SetDSCPQueue).
	PolicyDSCP Policy = 1
	// PolicyCPU: the CPU that received the SYN picks the queue
	// (SetCPUQueue); with RSS/RPS or the XDP program this keeps a flow's
	// socket on the CPU that handles its packets. A CPU without a
	// SetCPUQueue entry falls through to the hash.
	PolicyCPU Policy = 2
	// PolicyHash: only the hash (the kernel's keyed hash of the 4-tuple,
	// scaled onto the queues; unlike sport % N it is not fooled by
	// mostly-even ephemeral ports), asked for explicitly. It cannot be
	// combined with the other bits. It is a Go-side value: the program
	// sees no policy bits.
	PolicyHash Policy = 4
)

// policyBits are the bits the program reads (zcnet.h ZC_POLICY_*).
const policyBits = PolicyDSCP | PolicyCPU

// check refuses unknown bits and PolicyHash combined with another policy.
func (p Policy) check() error {
	if p&^(policyBits|PolicyHash) != 0 {
		return fmt.Errorf("%w: unknown policy bits %#x", ErrInvalid, uint32(p))
	}
	if p&PolicyHash != 0 && p&policyBits != 0 {
		return fmt.Errorf("%w: policy %v: PolicyHash cannot be combined with another policy", ErrInvalid, p)
	}
	return nil
}

// String names the policy: "auto", "hash", "dscp", "cpu", "dscp+cpu".
func (p Policy) String() string {
	switch p {
	case PolicyAuto:
		return "auto"
	case PolicyHash:
		return "hash"
	case PolicyDSCP:
		return "dscp"
	case PolicyCPU:
		return "cpu"
	case PolicyDSCP | PolicyCPU:
		return "dscp+cpu"
	}
	return fmt.Sprintf("Policy(%#x)", uint32(p))
}

// Options configure NewSteering. The zero value is valid.
type Options struct {
	// Policy for connections without a flow-table entry.
	Policy Policy
	// Queues is the number of queues when no listener fds are given (XDP,
	// tc and sockops still steer by queue number). With listeners it must
	// be 0 or len(listenerFDs).
	Queues int
	// PinPath, if set, is a directory on a bpffs mount. The flow table,
	// the policy maps and the statistics are pinned there by name, and a
	// later NewSteering with the same PinPath reuses them (a restarted
	// process keeps its flow table and per-CPU/DSCP/congestion policies;
	// the queue count, Policy and drain state are rewritten from Options).
	// Attachments are never pinned.
	PinPath string
	// KeepPinned makes Close leave the pinned maps in place (for a
	// supervisor that restarts the process); otherwise Close removes them.
	KeepPinned bool
}

// Steering is a loaded set of steering programs sharing one flow table:
// sk_reuseport on a listener group, and optionally sockops on cgroups, XDP
// on interfaces and tc egress on interfaces. All methods are safe for
// concurrent use; after Close they return an error matching ErrClosed.
type Steering struct {
	mu     sync.Mutex
	closed bool
	objs   steerObjects
	fds    []int // our dups of the listener fds, index = queue
	// attached: our sk_reuseport program is attached to the fds' group.
	attached bool
	nqueues  int
	cfg      steerConfig
	links    []attachment
	opts     Options
	pins     []string // pinned map paths (Options.PinPath)
	// prepinned: pins that existed before NewSteering (state of an earlier
	// run); a failed NewSteering leaves them in place.
	prepinned []string
}

type attachment struct {
	what string // "cgroup /path", "xdp 3", "tc egress 3"
	l    link.Link
}

// mapsToPin are the maps that carry state worth keeping across restarts.
// The socket array and the cpumap refer to live kernel objects and are
// never pinned.
var mapsToPin = []string{
	steerMapFlows, steerMapConns, steerMapSettings, steerMapCpuQueue, steerMapDscpQueue,
	steerMapQueueCpu, steerMapCcPolicies, steerMapFlowstats, steerMapQueuestats, steerMapStats,
}

// NewSteering loads the steering programs, puts listenerFDs[q] into slot q
// of the socket array and attaches the sk_reuseport program to their
// SO_REUSEPORT group, so every new connection lands on the listener of the
// queue the flow table or the policy picks.
//
// listenerFDs must be listening TCP sockets (IPPROTO_TCP, not MPTCP) with
// SO_REUSEPORT, all bound to the same address and port, at most MaxQueues
// of them. NewSteering duplicates them: the caller keeps ownership of its
// fds, and the group keeps the program until Close (close the Steering
// before or together with the listeners, or RemoveListener one queue).
// Attaching replaces any reuseport program the group already had.
// listenerFDs may be empty when only sockops, XDP or tc are wanted; then
// opts.Queues says how many queues there are.
func NewSteering(listenerFDs []int, opts *Options) (*Steering, error) {
	const op = "new steering"
	var o Options
	if opts != nil {
		o = *opts
	}
	nq := len(listenerFDs)
	switch {
	case nq > MaxQueues:
		return nil, invalid(op, "%d listeners, at most %d", nq, MaxQueues)
	case o.Queues < 0 || o.Queues > MaxQueues:
		return nil, invalid(op, "Options.Queues %d out of range 0..%d", o.Queues, MaxQueues)
	case nq > 0 && o.Queues != 0 && o.Queues != nq:
		return nil, invalid(op, "Options.Queues %d but %d listeners", o.Queues, nq)
	case nq == 0:
		nq = o.Queues
	}
	if err := o.Policy.check(); err != nil {
		return nil, opErr(op, err)
	}
	if err := checkListeners(listenerFDs); err != nil {
		return nil, opErr(op, err)
	}

	s := &Steering{nqueues: nq, opts: o}
	ok := false
	defer func() {
		if !ok {
			s.release(true)
		}
	}()
	for _, fd := range listenerFDs {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, opErr(op, os.NewSyscallError("dup listener", err))
		}
		s.fds = append(s.fds, d)
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	s.cfg = steerConfig{Nqueues: uint32(nq), Policy: uint32(o.Policy & policyBits)}
	if err := s.writeConfig(); err != nil {
		return nil, opErr(op, err)
	}
	for q, fd := range s.fds {
		if err := s.objs.Sockets.Update(uint32(q), uint64(fd), ebpf.UpdateAny); err != nil {
			switch {
			case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.Errno(524)):
				err = fmt.Errorf("%w: %w (an MPTCP socket? create listeners with IPPROTO_TCP)", ErrInvalid, err)
			case errors.Is(err, unix.EBUSY):
				err = fmt.Errorf("%w: %w (the socket belongs to another live Steering)", ErrInvalid, err)
			}
			return nil, opErr(fmt.Sprintf("add listener %d to socket array", q), err)
		}
	}
	if len(s.fds) > 0 {
		err := unix.SetsockoptInt(s.fds[0], unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, s.objs.ZcReuseport.FD())
		if err != nil {
			return nil, opErr("attach sk_reuseport", os.NewSyscallError("setsockopt SO_ATTACH_REUSEPORT_EBPF", err))
		}
		s.attached = true
	}
	ok = true
	return s, nil
}

// checkListeners verifies the fds are distinct listening TCP sockets with
// SO_REUSEPORT on one address.
func checkListeners(fds []int) error {
	var first unix.Sockaddr
	seen := map[uint64]bool{}
	for q, fd := range fds {
		if fd < 0 {
			return fmt.Errorf("%w: listener %d: bad fd %d", ErrInvalid, q, fd)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("%w: listener %d (fd %d): %w", ErrInvalid, q, fd, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			return fmt.Errorf("%w: listener %d (fd %d) is not a socket", ErrInvalid, q, fd)
		}
		if seen[st.Ino] {
			return fmt.Errorf("%w: listener %d (fd %d) is the same socket as an earlier one", ErrInvalid, q, fd)
		}
		seen[st.Ino] = true
		if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || v != unix.SOCK_STREAM {
			return fmt.Errorf("%w: listener %d (fd %d) is not a stream socket", ErrInvalid, q, fd)
		}
		if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || v != unix.IPPROTO_TCP {
			return fmt.Errorf("%w: listener %d (fd %d) is not IPPROTO_TCP (protocol %d; Go's net.Listen makes MPTCP sockets, use ListenConfig.SetMultipathTCP(false))", ErrInvalid, q, fd, v)
		}
		if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || v == 0 {
			return fmt.Errorf("%w: listener %d (fd %d) is not listening", ErrInvalid, q, fd)
		}
		if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT); err != nil || v == 0 {
			return fmt.Errorf("%w: listener %d (fd %d) lacks SO_REUSEPORT", ErrInvalid, q, fd)
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			return fmt.Errorf("%w: listener %d (fd %d): %w", ErrInvalid, q, fd, err)
		}
		if first == nil {
			first = sa
		} else if !sameAddr(first, sa) {
			return fmt.Errorf("%w: listener %d (fd %d) is bound to another address than listener 0", ErrInvalid, q, fd)
		}
	}
	return nil
}

func sameAddr(a, b unix.Sockaddr) bool {
	switch x := a.(type) {
	case *unix.SockaddrInet4:
		y, ok := b.(*unix.SockaddrInet4)
		return ok && x.Port == y.Port && x.Addr == y.Addr
	case *unix.SockaddrInet6:
		y, ok := b.(*unix.SockaddrInet6)
		return ok && x.Port == y.Port && x.Addr == y.Addr
	}
	return false
}

func (s *Steering) load() error {
	spec, err := loadSteer()
	if err != nil {
		return opErr("load", err)
	}
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return opErr("load", err)
	}
	spec.Maps[steerMapCpus].MaxEntries = uint32(ncpu)
	var copts ebpf.CollectionOptions
	if s.opts.PinPath != "" {
		if st, err := os.Stat(s.opts.PinPath); err != nil || !st.IsDir() {
			return invalid("load", "PinPath %q is not a directory", s.opts.PinPath)
		}
		var fs unix.Statfs_t
		if err := unix.Statfs(s.opts.PinPath, &fs); err != nil || fs.Type != unix.BPF_FS_MAGIC {
			return invalid("load", "PinPath %q is not on a bpffs mount (mount -t bpf bpf /sys/fs/bpf)", s.opts.PinPath)
		}
		for _, name := range mapsToPin {
			spec.Maps[name].Pinning = ebpf.PinByName
			p := filepath.Join(s.opts.PinPath, name)
			s.pins = append(s.pins, p)
			if _, err := os.Stat(p); err == nil {
				s.prepinned = append(s.prepinned, p)
			}
		}
		copts.Maps.PinPath = s.opts.PinPath
	}
	if err := spec.LoadAndAssign(&s.objs, &copts); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			// A program the verifier rejects on a kernel that has every
			// feature is a bug; on older kernels it means a missing feature.
			return opErr("load", fmt.Errorf("%w: %w", errOldKernel, err))
		}
		return opErr("load", err)
	}
	return nil
}

// release frees everything; used by Close and (failed=true) by failed
// constructors.
func (s *Steering) release(failed bool) error {
	var errs []error
	for i := len(s.links) - 1; i >= 0; i-- {
		if err := s.links[i].l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", s.links[i].what, err))
		}
	}
	s.links = nil
	if s.attached {
		s.attached = false
		// ENOENT: someone else detached it already.
		err := unix.SetsockoptInt(s.anyListener(), unix.SOL_SOCKET, unix.SO_DETACH_REUSEPORT_BPF, 0)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, os.NewSyscallError("setsockopt SO_DETACH_REUSEPORT_BPF", err))
		}
	}
	// Empty the socket array before closing it: the kernel frees a map
	// after a delay, and until then its sockets could not join another
	// array (EBUSY).
	if s.objs.Sockets != nil {
		for q, fd := range s.fds {
			if fd >= 0 {
				s.objs.Sockets.Delete(uint32(q))
			}
		}
	}
	for _, fd := range s.fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	s.fds = nil
	for _, p := range s.pins {
		keep := s.opts.KeepPinned
		if failed && slices.Contains(s.prepinned, p) {
			keep = true // a failed constructor leaves earlier state alone
		}
		if keep {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	s.pins, s.prepinned = nil, nil
	if err := s.objs.Close(); err != nil {
		errs = append(errs, err)
	}
	s.objs = steerObjects{}
	return errors.Join(errs...)
}

// anyListener returns one of our listener dups still open (-1 if none).
func (s *Steering) anyListener() int {
	for _, fd := range s.fds {
		if fd >= 0 {
			return fd
		}
	}
	return -1
}

// RemoveListener takes queue's listener out of the group's steering for
// good: the queue is drained, its socket-array slot emptied and the
// Steering's duplicate of the fd closed, so the socket really closes when
// the caller closes its own fd. New connections go to the other queues;
// connections already accepted are untouched. The last listener cannot be
// removed (Close the Steering instead).
func (s *Steering) RemoveListener(queue int) error {
	const op = "remove listener"
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if queue < 0 || queue >= len(s.fds) || s.fds[queue] < 0 {
		return invalid(op, "queue %d has no listener", queue)
	}
	left := 0
	for _, fd := range s.fds {
		if fd >= 0 {
			left++
		}
	}
	if left == 1 {
		return invalid(op, "queue %d has the last listener: Close the Steering instead", queue)
	}
	old := s.cfg.Drained
	s.cfg.Drained |= 1 << uint(queue)
	if err := s.writeConfig(); err != nil {
		s.cfg.Drained = old
		return opErr(op, err)
	}
	if err := s.objs.Sockets.Delete(uint32(queue)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return opErr(op, err)
	}
	fd := s.fds[queue]
	s.fds[queue] = -1
	// If this socket carried the attachment for the group, the group keeps
	// it: the program belongs to the group, not to one socket.
	unix.Close(fd)
	return nil
}

// Close detaches every program this Steering attached (sk_reuseport from
// the group, sockops from cgroups, XDP and tc from interfaces), closes its
// duplicated listener fds and its maps, and removes pinned maps unless
// Options.KeepPinned. Later calls return an error matching ErrClosed.
func (s *Steering) Close() error {
	if s == nil {
		return &OpError{Op: "close", Err: ErrClosed}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &OpError{Op: "close", Err: ErrClosed}
	}
	s.closed = true
	if err := s.release(false); err != nil {
		return opErr("close", err)
	}
	return nil
}

// lock takes the mutex and fails when closed.
func (s *Steering) lock(op string) error {
	if s == nil {
		return &OpError{Op: op, Err: ErrClosed}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return &OpError{Op: op, Err: ErrClosed}
	}
	return nil
}

// Queues returns the number of queues.
func (s *Steering) Queues() int { return s.nqueues }

func (s *Steering) writeConfig() error {
	return s.objs.Settings.Update(uint32(0), &s.cfg, ebpf.UpdateAny)
}

func (s *Steering) checkQueue(op string, q int) error {
	if q < 0 || q >= s.nqueues {
		return invalid(op, "queue %d out of range 0..%d", q, s.nqueues-1)
	}
	return nil
}

// SetFlow makes queue the owner of flow k: new connections of that flow go
// to the queue's listener (unless the queue is drained), XDP redirects its
// packets to the queue's CPU and tc egress puts them on TX queue `queue`.
// k.Remote's port may be 0 to cover every connection from that peer to
// k.Local.
func (s *Steering) SetFlow(k FlowKey, queue int) error {
	const op = "set flow"
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := s.checkQueue(op, queue); err != nil {
		return err
	}
	rk, err := k.raw()
	if err != nil {
		return opErr(op, err)
	}
	return opErr(op, s.objs.Flows.Update(&rk, uint32(queue), ebpf.UpdateAny))
}

// DeleteFlow removes the flow-table entry for k; ErrNotFound if none.
func (s *Steering) DeleteFlow(k FlowKey) error {
	const op = "delete flow"
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	rk, err := k.raw()
	if err != nil {
		return opErr(op, err)
	}
	return opErr(op, s.objs.Flows.Delete(&rk))
}

// Lookup reports which queue owns flow k: the flow-table entry if there is
// one (learned=false), else the queue sk_reuseport picked when the
// connection arrived (learned=true). ErrNotFound if the flow is unknown.
func (s *Steering) Lookup(k FlowKey) (queue int, learned bool, err error) {
	const op = "lookup flow"
	if err := s.lock(op); err != nil {
		return 0, false, err
	}
	defer s.mu.Unlock()
	rk, err := k.raw()
	if err != nil {
		return 0, false, opErr(op, err)
	}
	var q uint32
	if err := s.objs.Flows.Lookup(&rk, &q); err == nil {
		return int(q), false, nil
	} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, false, opErr(op, err)
	}
	var c steerConn
	if err := s.objs.Conns.Lookup(&rk, &c); err != nil {
		return 0, false, opErr(op, err)
	}
	return int(c.Queue), true, nil
}

// Forget removes a connection from the learned table and its sockops
// statistics: for callers that close connections without the sockops
// program attached to their cgroup (with it, closes are seen and cleaned
// automatically). Forgetting an unknown flow is not an error.
func (s *Steering) Forget(k FlowKey) error {
	const op = "forget flow"
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	rk, err := k.raw()
	if err != nil {
		return opErr(op, err)
	}
	for _, m := range []*ebpf.Map{s.objs.Conns, s.objs.Flowstats} {
		if err := m.Delete(&rk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return opErr(op, err)
		}
	}
	return nil
}

// Learned returns the learned connection table: every connection
// sk_reuseport placed whose close sockops has not yet seen, with its queue.
// Entries leave when the connection closes if the sockops program is
// attached to a cgroup containing the listeners (else the table is an LRU
// bounded at 65536 entries).
func (s *Steering) Learned() (map[FlowKey]int, error) {
	const op = "list learned flows"
	if err := s.lock(op); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := map[FlowKey]int{}
	var k steerFlowKey
	var c steerConn
	it := s.objs.Conns.Iterate()
	for it.Next(&k, &c) {
		out[keyFromRaw(k)] = int(c.Queue)
	}
	if err := it.Err(); err != nil {
		return nil, opErr(op, err)
	}
	return out, nil
}

// Drain stops (on=true) or resumes (on=false) new connections to queue:
// while drained, the queue's flow-table entries and policy choices are
// passed over for new connections (the hash probes on to the next queue),
// and its existing connections are untouched. With every queue drained,
// new connections are refused: the program returns SK_DROP, which the kernel
// turns into a lookup failure, so the SYN is answered with a RST (the client
// sees ECONNREFUSED), not silently dropped.
func (s *Steering) Drain(queue int, on bool) error {
	const op = "drain"
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := s.checkQueue(op, queue); err != nil {
		return err
	}
	if !on && queue < len(s.fds) && s.fds[queue] < 0 {
		return invalid(op, "queue %d's listener was removed", queue)
	}
	old := s.cfg.Drained
	if on {
		s.cfg.Drained |= 1 << uint(queue)
	} else {
		s.cfg.Drained &^= 1 << uint(queue)
	}
	if err := s.writeConfig(); err != nil {
		s.cfg.Drained = old
		return opErr(op, err)
	}
	return nil
}

// SetPolicy changes the policy for connections without a flow entry.
func (s *Steering) SetPolicy(p Policy) error {
	const op = "set policy"
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := p.check(); err != nil {
		return opErr(op, err)
	}
	old := s.cfg.Policy
	s.cfg.Policy = uint32(p & policyBits)
	if err := s.writeConfig(); err != nil {
		s.cfg.Policy = old
		return opErr(op, err)
	}
	return nil
}

// SetCPUQueue maps a receiving CPU to a queue for PolicyCPU; queue -1
// removes the mapping.
func (s *Steering) SetCPUQueue(cpu, queue int) error {
	const op = "set cpu queue"
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if cpu < 0 || cpu >= MaxCPUs {
		return invalid(op, "cpu %d out of range 0..%d", cpu, MaxCPUs-1)
	}
	if queue != -1 {
		if err := s.checkQueue(op, queue); err != nil {
			return err
		}
	}
	return opErr(op, s.objs.CpuQueue.Update(uint32(cpu), uint32(queue+1), ebpf.UpdateAny))
}

// SetDSCPQueue maps a DSCP class (0..63, the ToS byte >> 2) to a queue for
// PolicyDSCP; queue -1 removes the mapping.
func (s *Steering) SetDSCPQueue(dscp, queue int) error {
	const op = "set dscp queue"
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if dscp < 0 || dscp > 63 {
		return invalid(op, "dscp %d out of range 0..63", dscp)
	}
	if queue != -1 {
		if err := s.checkQueue(op, queue); err != nil {
			return err
		}
	}
	return opErr(op, s.objs.DscpQueue.Update(uint32(dscp), uint32(queue+1), ebpf.UpdateAny))
}

// cpumapQueueSize is the per-CPU ring of the cpumap (packets in flight to
// the target CPU).
const cpumapQueueSize = 2048

// cpumapVal is struct bpf_cpumap_val as written to the map (prog by fd).
type cpumapVal struct {
	Qsize  uint32
	ProgFD int32
}

// SetQueueCPU makes the XDP program redirect packets of the queue's flows
// to cpu (software RSS/aRFS); cpu -1 stops redirecting that queue.
func (s *Steering) SetQueueCPU(queue, cpu int) error {
	const op = "set queue cpu"
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := s.checkQueue(op, queue); err != nil {
		return err
	}
	if cpu < -1 || cpu >= int(s.objs.Cpus.MaxEntries()) {
		return invalid(op, "cpu %d out of range 0..%d", cpu, s.objs.Cpus.MaxEntries()-1)
	}
	if cpu >= 0 {
		v := cpumapVal{Qsize: cpumapQueueSize, ProgFD: int32(s.objs.ZcCpumap.FD())}
		if err := s.objs.Cpus.Update(uint32(cpu), &v, ebpf.UpdateAny); err != nil {
			return opErr(op, err)
		}
	}
	return opErr(op, s.objs.QueueCpu.Update(uint32(queue), uint32(cpu+1), ebpf.UpdateAny))
}

// availableCC lists the kernel's loaded congestion control algorithms.
func availableCC() (map[string]bool, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_available_congestion_control")
	if err != nil {
		return nil, err
	}
	m := map[string]bool{}
	for _, f := range strings.Fields(string(b)) {
		m[f] = true
	}
	return m, nil
}

// SetCongestion installs a sockops policy for connections whose peer is in
// prefix (longest prefix wins; 0.0.0.0/0 or ::/0 is the default): cc, if
// not empty, becomes the connection's congestion control, and nodelay sets
// TCP_NODELAY. It applies to connections established after the call in
// cgroups the program is attached to (AttachCgroup). cc must be listed in
// /proc/sys/net/ipv4/tcp_available_congestion_control (BPF cannot load a
// module).
func (s *Steering) SetCongestion(prefix netip.Prefix, cc string, nodelay bool) error {
	const op = "set congestion policy"
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	key, err := ccKey(prefix)
	if err != nil {
		return opErr(op, err)
	}
	var pol steerCcPolicy
	if cc != "" {
		if len(cc) >= len(pol.Cc) {
			return invalid(op, "congestion control name %q longer than %d bytes", cc, len(pol.Cc)-1)
		}
		if avail, err := availableCC(); err == nil && !avail[cc] {
			return invalid(op, "congestion control %q not available (see /proc/sys/net/ipv4/tcp_available_congestion_control)", cc)
		}
		for i := 0; i < len(cc); i++ {
			pol.Cc[i] = int8(cc[i])
		}
		pol.Flags |= ccSetCC
	}
	if nodelay {
		pol.Flags |= ccNoDelay
	}
	return opErr(op, s.objs.CcPolicies.Update(&key, &pol, ebpf.UpdateAny))
}

// DeleteCongestion removes the policy for exactly prefix; ErrNotFound if none.
func (s *Steering) DeleteCongestion(prefix netip.Prefix) error {
	const op = "delete congestion policy"
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	key, err := ccKey(prefix)
	if err != nil {
		return opErr(op, err)
	}
	return opErr(op, s.objs.CcPolicies.Delete(&key))
}

// Flags of struct cc_policy (zcnet.h ZC_CC_*).
const (
	ccSetCC   = 1
	ccNoDelay = 2
)

// Flags of struct flow_stats (zcnet.h ZC_FS_*).
const (
	fsCCSet    = 1
	fsCCFailed = 2
	fsNoDelay  = 4
	fsPassive  = 8
)

func ccKey(p netip.Prefix) (steerCcKey, error) {
	var k steerCcKey
	if !p.IsValid() {
		return k, fmt.Errorf("%w: invalid prefix %v", ErrInvalid, p)
	}
	p = p.Masked()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	k.Prefixlen = uint32(bits)
	k.Addr = p.Addr().As16()
	return k, nil
}

// AttachCgroup attaches the sockops program to the cgroup v2 directory at
// path: connections of sockets created in that cgroup (and its
// descendants) get the SetCongestion policy and are tracked in FlowStats,
// and their close removes them from the learned table.
func (s *Steering) AttachCgroup(path string) error {
	op := "attach sockops to " + path
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return invalid(op, "%v", err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return invalid(op, "%s is not a cgroup v2 directory", path)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: ebpf.AttachCGroupSockOps, Program: s.objs.ZcSockops})
	if err != nil {
		return opErr(op, err)
	}
	s.links = append(s.links, attachment{what: "cgroup " + path, l: l})
	return nil
}

// XDPMode selects how the XDP program is attached.
type XDPMode int

const (
	// XDPAuto picks the mode: driver (native) mode where the driver has it, except on veth,
	// where native XDP turns off the peer's TSO/GSO (kernel TCP into the interface at about a
	// quarter of its speed): there generic mode, said by the raw steering's Fallback as a
	// *NativeXDPCostError (not counted as a fallback). Ask for native with XDPDriver.
	XDPAuto XDPMode = iota
	// XDPDriver demands native (driver) mode.
	XDPDriver
	// XDPGeneric demands generic (skb) mode.
	XDPGeneric
)

// AttachXDP attaches the XDP program to the interface: packets of flows in
// the flow table or the learned table whose queue has a CPU (SetQueueCPU)
// are redirected to that CPU through a cpumap; everything else passes. It
// also counts packets per RX queue (Stats.RxQueuePackets). The interface
// index is resolved in the calling thread's network namespace.
func (s *Steering) AttachXDP(ifindex int, mode XDPMode) error {
	op := fmt.Sprintf("attach xdp to ifindex %d", ifindex)
	if err := s.lock(op); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if _, err := ifName(ifindex); err != nil {
		return opErr(op, err)
	}
	var flags link.XDPAttachFlags
	switch mode {
	case XDPAuto:
	case XDPDriver:
		flags = link.XDPDriverMode
	case XDPGeneric:
		flags = link.XDPGenericMode
	default:
		return invalid(op, "unknown mode %d", mode)
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: s.objs.ZcXdp, Interface: ifindex, Flags: flags})
	if err != nil {
		if errors.Is(err, unix.ENODEV) {
			err = fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return opErr(op, err)
	}
	s.links = append(s.links, attachment{what: fmt.Sprintf("xdp %d", ifindex), l: l})
	return nil
}

// AttachTCEgress attaches the tc egress program (a tcx link) to the
// interface: packets of known flows get skb->queue_mapping = queue+1, which
// selects TX queue `queue` (taken modulo the device's TX queues). XPS, when
// configured on the device, and a TX queue already cached by the socket win
// over it: xps reports whether the device has XPS set (checked through
// /sys/class/net, so only for devices in the namespace sysfs shows).
func (s *Steering) AttachTCEgress(ifindex int) (xps bool, err error) {
	op := fmt.Sprintf("attach tc egress to ifindex %d", ifindex)
	if err := s.lock(op); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	name, err := ifName(ifindex)
	if err != nil {
		return false, opErr(op, err)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: s.objs.ZcTcEgress, Attach: ebpf.AttachTCXEgress})
	if err != nil {
		if errors.Is(err, unix.ENODEV) {
			err = fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return false, opErr(op, err)
	}
	s.links = append(s.links, attachment{what: fmt.Sprintf("tc egress %d", ifindex), l: l})
	return xpsConfigured(name), nil
}

// ifName is bpferr.IfName (shared by bpf and capture).
var ifName = bpferr.IfName

// xpsConfigured reports whether any TX queue of the interface has a
// non-empty xps_cpus or xps_rxqs mask.
func xpsConfigured(name string) bool {
	dirs, _ := filepath.Glob(filepath.Join("/sys/class/net", name, "queues", "tx-*"))
	for _, d := range dirs {
		for _, f := range []string{"xps_cpus", "xps_rxqs"} {
			b, err := os.ReadFile(filepath.Join(d, f))
			if err != nil {
				continue
			}
			if strings.Trim(strings.TrimSpace(string(b)), "0,") != "" {
				return true
			}
		}
	}
	return false
}

// Stats are the programs' counters summed over CPUs.
type Stats struct {
	// sk_reuseport: how new connections were placed.
	ReuseportFlow, ReuseportDSCP, ReuseportCPU, ReuseportHash uint64

	DrainSkips      uint64 // a choice passed over because its queue was drained
	AllDrainedDrops uint64 // SYNs refused (answered with a RST) because every queue was drained
	NoListener      uint64 // chosen slot empty: the kernel's own hash was used
	BadPacket       uint64 // unreadable headers: the kernel's own hash was used

	// sockops.
	Established, CCSet, CCFailed, NoDelaySet, RTTSamples, Retransmits, Closed uint64
	// XDP and tc.
	XDPPass, XDPRedirect, TCMapped, TCUnmapped uint64
	// Queues[q] are the counters of queue q (len = Queues()).
	Queues []QueueStats
	// RxQueuePackets[i]: packets the XDP program saw on RX queue i.
	RxQueuePackets [MaxQueues]uint64
	// CPUPackets[c]: redirected packets that reached CPU c (counted by the
	// cpumap program on that CPU; CPUs >= MaxQueues are not counted).
	CPUPackets [MaxQueues]uint64
}

// QueueStats are one queue's counters.
type QueueStats struct {
	Steered       uint64 // new connections sk_reuseport sent here
	Established   uint64 // of those, established (seen by sockops)
	Closed        uint64 // closed (seen by sockops)
	XDPRedirected uint64 // packets XDP redirected to this queue's CPU
	TCMapped      uint64 // packets tc egress put on this queue's TX queue
}

// Stats reads the counters.
func (s *Steering) Stats() (Stats, error) {
	const op = "read stats"
	var st Stats
	if err := s.lock(op); err != nil {
		return st, err
	}
	defer s.mu.Unlock()
	var c [zcCounters]uint64
	for i := range c {
		var per []uint64
		if err := s.objs.Stats.Lookup(uint32(i), &per); err != nil {
			return st, opErr(op, err)
		}
		for _, v := range per {
			c[i] += v
		}
	}
	st.ReuseportFlow, st.ReuseportDSCP, st.ReuseportCPU, st.ReuseportHash = c[0], c[1], c[2], c[3]
	st.DrainSkips, st.AllDrainedDrops, st.NoListener, st.BadPacket = c[4], c[5], c[6], c[7]
	st.Established, st.CCSet, st.CCFailed, st.NoDelaySet = c[8], c[9], c[10], c[11]
	st.RTTSamples, st.Retransmits, st.Closed = c[12], c[13], c[14]
	st.XDPPass, st.XDPRedirect, st.TCMapped, st.TCUnmapped = c[15], c[16], c[17], c[18]
	st.Queues = make([]QueueStats, s.nqueues)
	for q := 0; q < MaxQueues; q++ {
		var per []steerQueueStats
		if err := s.objs.Queuestats.Lookup(uint32(q), &per); err != nil {
			return st, opErr(op, err)
		}
		var sum steerQueueStats
		for _, v := range per {
			sum.Steered += v.Steered
			sum.Established += v.Established
			sum.Closed += v.Closed
			sum.XdpRedirected += v.XdpRedirected
			sum.TcMapped += v.TcMapped
			sum.XdpRxq += v.XdpRxq
			sum.CpuDelivered += v.CpuDelivered
		}
		if q < s.nqueues {
			st.Queues[q] = QueueStats{Steered: sum.Steered, Established: sum.Established, Closed: sum.Closed,
				XDPRedirected: sum.XdpRedirected, TCMapped: sum.TcMapped}
		}
		st.RxQueuePackets[q] = sum.XdpRxq
		st.CPUPackets[q] = sum.CpuDelivered
	}
	return st, nil
}

// zcCounters is ZC_COUNTERS in zcnet.h (checked by a test).
const zcCounters = 19

// FlowStats are sockops' statistics of one live connection.
type FlowStats struct {
	Queue         int           // queue it was steered to, -1 if none (outgoing, or not steered)
	SRTT          time.Duration // smoothed RTT at the last RTT callback
	TotalRetrans  uint32        // retransmitted segments
	RTTSamples    uint64        // RTT callbacks
	RetransEvents uint64        // retransmit callbacks
	CCSet         bool          // the policy's congestion control was applied
	CCFailed      bool          // applying it failed
	NoDelay       bool          // TCP_NODELAY was set by policy
	Passive       bool          // accepted (true) or connected (false)
}

// FlowStats returns the statistics of a connection tracked by sockops;
// ErrNotFound once it closed or if it was never seen.
func (s *Steering) FlowStats(k FlowKey) (FlowStats, error) {
	const op = "flow stats"
	if err := s.lock(op); err != nil {
		return FlowStats{}, err
	}
	defer s.mu.Unlock()
	rk, err := k.raw()
	if err != nil {
		return FlowStats{}, opErr(op, err)
	}
	var v steerFlowStats
	if err := s.objs.Flowstats.Lookup(&rk, &v); err != nil {
		return FlowStats{}, opErr(op, err)
	}
	fs := FlowStats{
		Queue:         int(int32(v.Queue)),
		SRTT:          time.Duration(v.SrttUs) * time.Microsecond,
		TotalRetrans:  v.TotalRetrans,
		RTTSamples:    v.RttSamples,
		RetransEvents: v.RetransEvents,
		CCSet:         v.Flags&fsCCSet != 0,
		CCFailed:      v.Flags&fsCCFailed != 0,
		NoDelay:       v.Flags&fsNoDelay != 0,
		Passive:       v.Flags&fsPassive != 0,
	}
	return fs, nil
}
