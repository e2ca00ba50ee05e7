package memregops

import "golang.org/x/sys/unix"

// MemlockLimit returns the soft RLIMIT_MEMLOCK when it applies to registered memory; ok is
// false without a limit or with CAP_IPC_LOCK (the limit does not apply then).
func MemlockLimit() (limit uint64, ok bool) {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl) != nil || rl.Cur == unix.RLIM_INFINITY {
		return 0, false
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) == nil && data[unix.CAP_IPC_LOCK/32].Effective&(1<<(unix.CAP_IPC_LOCK%32)) != 0 {
		return 0, false
	}
	return rl.Cur, true
}

// MemlockSoft returns the soft RLIMIT_MEMLOCK as it is now (unix.RLIM_INFINITY for none).
func MemlockSoft() (uint64, error) {
	var rl unix.Rlimit
	err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl)
	return rl.Cur, err
}
