package harness

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Placement says where a child process runs: on which CPUs (none: anywhere) and in
// which network namespace (nil: this process's).
type Placement struct {
	CPUs  []int
	NetNS *os.File
}

// Procs tracks the child processes zcbench started, so that they can be ended by PID
// on every exit path. The zero value is ready to use.
type Procs struct {
	mu     sync.Mutex
	procs  map[int]*os.Process
	closed bool
}

// Start starts cmd placed as p: the CPU mask and namespace are set on a locked OS
// thread that forks the child, so the child inherits both from its first instruction
// and no other thread of zcbench is touched. The child gets SIGKILL if zcbench dies.
func (ps *Procs) Start(cmd *exec.Cmd, p Placement) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return fmt.Errorf("start %s: shutting down", cmd.Path)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := startPlaced(cmd, p); err != nil {
		if cmd.Process != nil { // started, but the parent thread could not be restored
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		return err
	}
	if ps.procs == nil {
		ps.procs = make(map[int]*os.Process)
	}
	ps.procs[cmd.Process.Pid] = cmd.Process
	return nil
}

// Done forgets a child that has been waited for.
func (ps *Procs) Done(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	ps.mu.Lock()
	delete(ps.procs, cmd.Process.Pid)
	ps.mu.Unlock()
}

// KillAll sends SIGKILL to every child still tracked (each by its PID) and refuses
// new ones.
func (ps *Procs) KillAll() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.closed = true
	for pid, p := range ps.procs {
		_ = p.Kill()
		delete(ps.procs, pid)
	}
}

func startPlaced(cmd *exec.Cmd, p Placement) error {
	if len(p.CPUs) == 0 && p.NetNS == nil {
		return cmd.Start()
	}
	// Pdeathsig fires when the forking thread exits: keep that thread alive by
	// unlocking it afterwards (it returns to the runtime's pool), unless restoring
	// its state failed, in which case it must die with this goroutine.
	runtime.LockOSThread()
	var oldMask unix.CPUSet
	if len(p.CPUs) > 0 {
		if err := unix.SchedGetaffinity(0, &oldMask); err != nil {
			runtime.UnlockOSThread()
			return fmt.Errorf("sched_getaffinity: %w", err)
		}
		var m unix.CPUSet
		for _, c := range p.CPUs {
			m.Set(c)
		}
		if err := unix.SchedSetaffinity(0, &m); err != nil {
			runtime.UnlockOSThread()
			return fmt.Errorf("sched_setaffinity cpus %v: %w", p.CPUs, err)
		}
	}
	var oldNS *os.File
	if p.NetNS != nil {
		var err error
		oldNS, err = os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			_ = unix.SchedSetaffinity(0, &oldMask)
			runtime.UnlockOSThread()
			return err
		}
		defer oldNS.Close()
		if err := unix.Setns(int(p.NetNS.Fd()), unix.CLONE_NEWNET); err != nil {
			_ = unix.SchedSetaffinity(0, &oldMask)
			runtime.UnlockOSThread()
			return fmt.Errorf("setns %s: %w", p.NetNS.Name(), err)
		}
	}
	startErr := cmd.Start()
	if oldNS != nil {
		if err := unix.Setns(int(oldNS.Fd()), unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it exits with this goroutine.
			if startErr == nil {
				return fmt.Errorf("setns back: %w (child %d started)", err, cmd.Process.Pid)
			}
			return startErr
		}
	}
	if len(p.CPUs) > 0 {
		if err := unix.SchedSetaffinity(0, &oldMask); err != nil {
			return fmt.Errorf("restore affinity: %w", err) // thread stays locked and dies
		}
	}
	runtime.UnlockOSThread()
	return startErr
}

// AllowedCPUs lists the CPUs this process may run on (sched_getaffinity), in order.
func AllowedCPUs() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var cpus []int
	for i := 0; i < 1024; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}

// PickCPUs returns the CPUs for the client and the server: the first two this process
// may run on, or -1, -1 when there are fewer than two.
func PickCPUs() (client, server int) {
	cpus := AllowedCPUs()
	if len(cpus) < 2 {
		return -1, -1
	}
	return cpus[0], cpus[1]
}

// MinMultiCoreCPUs is the fewest CPUs the MultiCore scenario runs on.
const MinMultiCoreCPUs = 4

// ErrFewCPUs is SplitCPUs' answer on a machine with fewer than MinMultiCoreCPUs CPUs.
var ErrFewCPUs = fmt.Errorf("needs ≥ %d CPUs", MinMultiCoreCPUs)

// SplitCPUs splits the allowed CPUs between a MultiCore server and its load
// generator: the server gets the first min(queues, len/2) CPUs (so that the load has at
// least as many), the load generator all the others: on 16 CPUs with queues 4, 4 and 12;
// on 4 CPUs, 2 and 2. Fewer than MinMultiCoreCPUs CPUs: ErrFewCPUs.
func SplitCPUs(allowed []int, queues int) (server, load []int, err error) {
	if len(allowed) < MinMultiCoreCPUs {
		return nil, nil, fmt.Errorf("%w (this machine lets zcbench use %d)", ErrFewCPUs, len(allowed))
	}
	if queues < 1 {
		return nil, nil, fmt.Errorf("multi-core server queues %d < 1", queues)
	}
	n := min(queues, len(allowed)/2)
	return slices.Clone(allowed[:n]), slices.Clone(allowed[n:]), nil
}
