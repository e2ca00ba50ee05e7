package loop

import (
	"runtime"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestThreadCPUs(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpus := ThreadCPUs()
	if len(cpus) == 0 || len(cpus) > runtime.NumCPU() || !slices.IsSorted(cpus) {
		t.Fatalf("ThreadCPUs = %v (NumCPU %d)", cpus, runtime.NumCPU())
	}
	tid := int(CurrentTID())
	if tid != unix.Gettid() {
		t.Fatalf("CurrentTID %d, gettid %d", tid, unix.Gettid())
	}
	if len(cpus) > 1 && PinnedTo(tid, cpus[0]) {
		t.Fatal("PinnedTo: true for a thread that may run on several CPUs")
	}
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	one.Set(cpus[0])
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatalf("pinning the thread to one of its own CPUs: %v", err)
	}
	defer unix.SchedSetaffinity(0, &old)
	if !PinnedTo(tid, cpus[0]) || (len(cpus) > 1 && PinnedTo(tid, cpus[1])) {
		t.Fatal("PinnedTo does not see the thread pinned to its one CPU")
	}
	if got := ThreadCPUs(); !slices.Equal(got, cpus[:1]) {
		t.Fatalf("ThreadCPUs of a pinned thread = %v", got)
	}
}
