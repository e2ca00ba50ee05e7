package memreg

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
)

// udmabuf ABI (include/uapi/linux/udmabuf.h, checked by TestUdmabufABI).
const (
	udmabufFlagsCloexec = 0x01
	// udmabufCreate is UDMABUF_CREATE, _IOW('u', 0x42, struct udmabuf_create).
	udmabufCreate = 1<<30 | uint32(unsafe.Sizeof(udmabufCreateArg{}))<<16 | 'u'<<8 | 0x42
)

// udmabufCreateArg is struct udmabuf_create (24 bytes).
type udmabufCreateArg struct {
	Memfd  uint32
	Flags  uint32
	Offset uint64
	Size   uint64
}

// UdmabufDevice is the device that turns memfd pages into a dmabuf.
const UdmabufDevice = "/dev/udmabuf"

type dmabufMem struct {
	mem           []byte
	memfd, dmabuf int
	huge          bool
	hugeErr       error
}

func (d *dmabufMem) close() {
	if d.mem != nil {
		unix.Munmap(d.mem)
	}
	for _, fd := range []int{d.dmabuf, d.memfd} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// newDmabufMem creates a sealed memfd of at least n bytes (2 MiB huge pages when huge and
// reserved), exports it as a dmabuf through /dev/udmabuf and maps it.
func newDmabufMem(n int, huge bool) (dm dmabufMem, err error) {
	dm = dmabufMem{memfd: -1, dmabuf: -1}
	dev, err := unix.Open(UdmabufDevice, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		err = os.NewSyscallError("open "+UdmabufDevice, err)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENODEV) {
			return dm, fmt.Errorf("memreg: dmabuf region: %w", errs.NotSupported("dmabuf-backed memory (udmabuf)", UdmabufDevice+": a kernel with CONFIG_UDMABUF=y (Linux 4.20+)", err))
		}
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			return dm, fmt.Errorf("memreg: dmabuf region: %w", errs.NotSupported("dmabuf-backed memory (udmabuf)", "read-write access to "+UdmabufDevice, err))
		}
		return dm, fmt.Errorf("memreg: dmabuf region: %w", err)
	}
	defer unix.Close(dev)
	defer func() {
		if err != nil {
			dm.close()
		}
	}()
	page := os.Getpagesize()
	size := (n + page - 1) &^ (page - 1)
	if huge {
		hsize := (n + hugePage - 1) &^ (hugePage - 1)
		fd, herr := unix.MemfdCreate("zcnet-dmabuf", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_HUGETLB)
		if herr == nil {
			if herr = unix.Ftruncate(fd, int64(hsize)); herr == nil {
				// hugetlbfs pages are reserved at ftruncate only nominally: fault them in
				// below through the mapping; a shortage shows as SIGBUS there, so check
				// the pool first.
				herr = checkHugePool(hsize)
			}
			if herr != nil {
				unix.Close(fd)
			} else {
				dm.memfd, dm.huge, size = fd, true, hsize
			}
		}
		dm.hugeErr = herr
	}
	if dm.memfd < 0 {
		dm.memfd, err = unix.MemfdCreate("zcnet-dmabuf", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			dm.memfd = -1
			return dm, fmt.Errorf("memreg: dmabuf region: %w", os.NewSyscallError("memfd_create", err))
		}
		if err = unix.Ftruncate(dm.memfd, int64(size)); err != nil {
			return dm, fmt.Errorf("memreg: dmabuf region of %d bytes: %w", size, os.NewSyscallError("ftruncate", err))
		}
	}
	// udmabuf wants the memfd unable to shrink (and still writable).
	if _, err = unix.FcntlInt(uintptr(dm.memfd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		return dm, fmt.Errorf("memreg: dmabuf region: %w", os.NewSyscallError("fcntl(F_ADD_SEALS)", err))
	}
	arg := udmabufCreateArg{Memfd: uint32(dm.memfd), Flags: udmabufFlagsCloexec, Size: uint64(size)}
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(dev), uintptr(udmabufCreate), uintptr(unsafe.Pointer(&arg)))
	if errno != 0 {
		err = os.NewSyscallError("ioctl(UDMABUF_CREATE)", errno)
		return dm, fmt.Errorf("memreg: dmabuf region of %d bytes: %w", size, err)
	}
	dm.dmabuf = int(fd)
	dm.mem, err = unix.Mmap(dm.memfd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		dm.mem = nil
		return dm, fmt.Errorf("memreg: dmabuf region of %d bytes: %w", size, os.NewSyscallError("mmap", err))
	}
	return dm, nil
}

// checkHugePool fails when fewer free huge pages are reserved than n bytes need.
func checkHugePool(n int) error {
	b, err := os.ReadFile("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
	if err != nil {
		return err
	}
	var free int
	fmt.Sscan(string(b), &free)
	if free*hugePage < n {
		return fmt.Errorf("%d free 2 MiB pages, %d needed: %w", free, n/hugePage, unix.ENOMEM)
	}
	return nil
}

// DmabufFd returns the dmabuf fd of a region made with Options.Dmabuf (-1 otherwise). The
// region owns it: it stays valid until Close.
func (r *Region) DmabufFd() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dmabuf
}
