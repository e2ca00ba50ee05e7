package loop

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// What the engine asks about threads and CPUs (the loops pin their threads: queue.go).

// CurrentTID returns the calling thread's id (compare with Queue.TID).
func CurrentTID() int32 { return int32(unix.Gettid()) }

// ThreadCPUs lists the CPUs in the calling thread's affinity mask: all of runtime.NumCPU
// when the mask cannot be read.
func ThreadCPUs() []int {
	var set unix.CPUSet
	var cpus []int
	if unix.SchedGetaffinity(0, &set) == nil {
		for c := 0; c < 1024 && len(cpus) < set.Count(); c++ {
			if set.IsSet(c) {
				cpus = append(cpus, c)
			}
		}
	}
	if len(cpus) == 0 {
		for c := 0; c < runtime.NumCPU(); c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

// PinnedTo reports whether thread tid may run on cpu and no other.
func PinnedTo(tid, cpu int) bool {
	var set unix.CPUSet
	return unix.SchedGetaffinity(tid, &set) == nil && set.Count() == 1 && set.IsSet(cpu)
}
