package uring

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Zero-copy receive (zcrx, Linux 6.15+): a NIC hardware RX queue is bound to the ring; payload
// lands in a registered area and the application hands buffers back through a refill ring.
// It needs a NIC with header/data split and a dedicated RX queue (ethtool, ntuple rules to
// steer flows there); loopback and veth have neither, so on them registration fails with
// EOPNOTSUPP, reported as ErrNotSupported. Structures from include/uapi/linux/io_uring.h
// (6.18), checked for size by TestZcrxLayout.

// zcrxOffsets is struct io_uring_zcrx_offsets (32 bytes).
type zcrxOffsets struct {
	Head, Tail, Rqes, Resv2 uint32
	Resv                    [2]uint64
}

// zcrxAreaReg is struct io_uring_zcrx_area_reg (48 bytes).
type zcrxAreaReg struct {
	Addr        uint64
	Len         uint64
	RqAreaToken uint64
	Flags       uint32
	DmabufFd    uint32
	Resv2       [2]uint64
}

// zcrxIfqReg is struct io_uring_zcrx_ifq_reg (96 bytes).
type zcrxIfqReg struct {
	IfIdx     uint32
	IfRxq     uint32
	RqEntries uint32
	Flags     uint32
	AreaPtr   uint64
	RegionPtr uint64
	Offsets   zcrxOffsets
	ZcrxID    uint32
	RxBufLen  uint32
	Resv      [3]uint64
}

// regionDesc is struct io_uring_region_desc (64 bytes).
type regionDesc struct {
	UserAddr   uint64
	Size       uint64
	Flags      uint32
	ID         uint32
	MmapOffset uint64
	Resv       [4]uint64
}

// ZcrxRqe is struct io_uring_zcrx_rqe, a refill ring entry.
type ZcrxRqe struct {
	Off uint64
	Len uint32
	Pad uint32
}

const (
	memRegionTypeUser = 1
	// ZcrxAreaShift: bits of a zcrx CQE's offset above it name the area.
	ZcrxAreaShift = 48
)

// Zcrx is a registered zero-copy receive interface queue.
type Zcrx struct {
	ring   *Ring
	id     uint32
	region []byte
	head   *uint32
	tail   *uint32
	rqes   []ZcrxRqe
	token  uint64
	local  uint32
	closed bool
}

var openZcrx atomic.Int64

// ZcrxError explains a failed zcrx registration.
type ZcrxError struct {
	IfIndex, RxQueue uint32
	Err              error
}

func (e *ZcrxError) Error() string {
	hint := ""
	switch {
	case errors.Is(e.Err, unix.EOPNOTSUPP):
		hint = " (the device has no zero-copy receive support: it needs header/data split and a dedicated RX queue; loopback and veth never do)"
	case errors.Is(e.Err, unix.ENODEV):
		hint = " (no such interface)"
	case errors.Is(e.Err, unix.EINVAL):
		hint = " (the ring needs SINGLE_ISSUER|DEFER_TASKRUN and CQE32, a page-aligned area and a power-of-two refill ring)"
	case errors.Is(e.Err, unix.EPERM):
		hint = " (needs CAP_NET_ADMIN)"
	}
	return fmt.Sprintf("zcrx on ifindex %d rx queue %d: %v%s", e.IfIndex, e.RxQueue, e.Err, hint)
}

func (e *ZcrxError) Unwrap() []error {
	if errors.Is(e.Err, unix.EOPNOTSUPP) {
		return []error{e.Err, ErrNotSupported}
	}
	return []error{e.Err}
}

// RegisterZcrx binds hardware RX queue rxq of interface ifindex to the ring, with area (page
// aligned mmap'd memory the NIC writes payload into) and a refill ring of rqEntries (a power of
// two). The ring must have been set up with SetupSingleIssuer|SetupDeferTaskrun and SetupCQE32.
func (r *Ring) RegisterZcrx(ifindex, rxq uint32, area []byte, rqEntries uint32) (*Zcrx, error) {
	if len(area) == 0 || uintptr(unsafe.Pointer(&area[0]))%uintptr(os.Getpagesize()) != 0 || len(area)%os.Getpagesize() != 0 {
		return nil, &ZcrxError{IfIndex: ifindex, RxQueue: rxq, Err: fmt.Errorf("area must be whole, page-aligned pages: %w", unix.EINVAL)}
	}
	if rqEntries == 0 || rqEntries&(rqEntries-1) != 0 || rqEntries > 32768 {
		return nil, &ZcrxError{IfIndex: ifindex, RxQueue: rxq, Err: fmt.Errorf("refill ring of %d entries: %w", rqEntries, unix.EINVAL)}
	}
	page := os.Getpagesize()
	size := (4096 + int(rqEntries)*int(unsafe.Sizeof(ZcrxRqe{})) + page - 1) &^ (page - 1)
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, os.NewSyscallError("mmap(zcrx refill ring)", err)
	}
	areaReg := zcrxAreaReg{Addr: uint64(uintptr(unsafe.Pointer(&area[0]))), Len: uint64(len(area))}
	rd := regionDesc{UserAddr: uint64(uintptr(unsafe.Pointer(&mem[0]))), Size: uint64(size), Flags: memRegionTypeUser}
	reg := zcrxIfqReg{IfIdx: ifindex, IfRxq: rxq, RqEntries: rqEntries,
		AreaPtr: uint64(uintptr(unsafe.Pointer(&areaReg))), RegionPtr: uint64(uintptr(unsafe.Pointer(&rd)))}
	_, err = register(r.fd, RegisterZcrxIfq, unsafe.Pointer(&reg), 1)
	if err != nil {
		unix.Munmap(mem)
		return nil, &ZcrxError{IfIndex: ifindex, RxQueue: rxq, Err: err}
	}
	z := &Zcrx{ring: r, id: reg.ZcrxID, region: mem, token: areaReg.RqAreaToken}
	z.head = (*uint32)(unsafe.Pointer(&mem[reg.Offsets.Head]))
	z.tail = (*uint32)(unsafe.Pointer(&mem[reg.Offsets.Tail]))
	z.rqes = unsafe.Slice((*ZcrxRqe)(unsafe.Pointer(&mem[reg.Offsets.Rqes])), rqEntries)
	openZcrx.Add(1)
	return z, nil
}

// ID is the zcrx instance id for RECV_ZC SQEs.
func (z *Zcrx) ID() uint32 { return z.id }

// Refill returns buffer (off, n) of a zcrx CQE to the NIC; Flush publishes refills.
func (z *Zcrx) Refill(off uint64, n uint32) {
	e := &z.rqes[z.local&uint32(len(z.rqes)-1)]
	e.Off = off&(1<<ZcrxAreaShift-1) | z.token
	e.Len = n
	z.local++
}

// Flush publishes the refills added since the last Flush.
func (z *Zcrx) Flush() { atomic.StoreUint32(z.tail, z.local) }

// Close unmaps the refill ring; the kernel releases the queue with the ring (it pinned the
// refill ring's pages at registration, so unmapping our view is safe). Close the ring first
// when the queue is in use.
func (z *Zcrx) Close() error {
	if z == nil || z.closed {
		return os.ErrClosed
	}
	z.closed = true
	unix.Munmap(z.region)
	openZcrx.Add(-1)
	return nil
}

// PrepRecvZC prepares a multishot zero-copy receive on fd through zcrx instance id. Its CQEs
// are 32 bytes: the second half holds struct io_uring_zcrx_cqe (offset into the area).
func (s *SQE) PrepRecvZC(fd int32, id uint32) {
	s.prepRW(OpRecvZC, fd, 0, 0, 0)
	s.IoPrio = RecvMultishot
	s.FileIndex = int32(id)
}
