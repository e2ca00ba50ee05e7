package hwq

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// AF_XDP socket ABI (include/uapi/linux/if_xdp.h). The structs are golang.org/x/sys/unix's
// (XDPUmemReg, XDPMmapOffsets, XDPDesc, XDPStatistics); their sizes are compared with the C
// header by TestUAPIAgainstHeaders.

// xdpUmemMinChunk is XDP_UMEM_MIN_CHUNK_SIZE (net/xdp/xdp_umem.c): the smallest frame size
// the kernel accepts in aligned mode. The largest is the page size.
const xdpUmemMinChunk = 2048

// XDP_STATISTICS grew from 3 to 6 fields in Linux 5.9; the kernel copies what fits.
const sizeofXDPStatistics = int(unsafe.Sizeof(unix.XDPStatistics{}))

// sockopt passes a struct to setsockopt(SOL_XDP, opt), keeping it alive for the call.
func xdpSetsockopt(fd, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), size, 0)
	if e != 0 {
		return e
	}
	return nil
}

// xdpGetsockopt reads a struct with getsockopt(SOL_XDP, opt) and returns the length the
// kernel wrote.
func xdpGetsockopt(fd, opt int, p unsafe.Pointer, size uintptr) (int, error) {
	l := uint32(size)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return 0, e
	}
	return int(l), nil
}
