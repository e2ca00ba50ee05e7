package uring

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
)

// Zero-copy receive (zcrx): a NIC hardware RX queue is bound to the ring (Linux 6.15+), payload
// lands in a registered area, and the application hands buffers back through a refill ring.
// From Linux 7.1 a device-less instance (ZcrxConfig.NoDev) runs the same data path on any TCP
// socket with the payload copied into the area. Structures and constants from
// include/uapi/linux/io_uring/zcrx.h and io_uring/query.h (Linux 7.3), generated into
// zabi_linux.go; TestZcrxLayout checks sizes and offsets, TestZcrxLayoutAgainst73Header
// compares them with the 7.3 header.

// Derived from the generated uapi values (zabi_linux.go), or not in the uapi headers.
const (
	// ZcrxAreaMask selects the area bits of an offset (IORING_ZCRX_AREA_MASK, a C
	// expression cgo -godefs does not evaluate; TestZcrxLayoutAgainst73Header compares it).
	ZcrxAreaMask = ^uint64(1<<ZcrxAreaShift - 1)

	// zcrxMaxRQEntries is the kernel's bound on a refill ring (IO_RQ_MAX_ENTRIES in
	// io_uring/zcrx.c): not in the uapi headers.
	zcrxMaxRQEntries = 32768
)

// QueryZcrx asks the kernel what its zcrx supports (IORING_REGISTER_QUERY, Linux 6.18+). A
// kernel without the query answers ErrNotSupported; so does one without zcrx.
func QueryZcrx() (ZcrxQuery, error) {
	q, err := queryZcrx()
	if err != nil {
		return q, errs.NotSupported("io_uring zcrx query", "a kernel whose io_uring query knows zcrx (Linux 7.x, CONFIG_IO_URING_ZCRX)", err)
	}
	return q, nil
}

func queryZcrx() (ZcrxQuery, error) {
	q := new(ZcrxQuery)
	escape(q) // the kernel writes it through h.QueryData
	h := queryHdr{QueryData: uint64(uintptr(unsafe.Pointer(q))), QueryOp: queryOpZcrx, Size: uint32(unsafe.Sizeof(*q))}
	_, err := register(-1, RegisterQuery, unsafe.Pointer(&h), 0)
	runtime.KeepAlive(q)
	if err != nil {
		return *q, err
	}
	if h.Result < 0 {
		return *q, os.NewSyscallError("io_uring_register(query zcrx)", unix.Errno(-h.Result))
	}
	return *q, nil
}

// ZcrxArea is the memory a zcrx instance receives into: page-aligned user memory (Mem), or a
// dmabuf (DmabufFd >= 0 with DmabufLen bytes; needs a device that can map it).
type ZcrxArea struct {
	Mem       []byte
	DmabufFd  int
	DmabufLen uint64
}

// UserArea returns an area over mapped memory.
func UserArea(mem []byte) ZcrxArea { return ZcrxArea{Mem: mem, DmabufFd: -1} }

// DmabufArea returns an area over the first n bytes of the dmabuf fd.
func DmabufArea(fd int, n uint64) ZcrxArea { return ZcrxArea{DmabufFd: fd, DmabufLen: n} }

func (a ZcrxArea) isDmabuf() bool { return a.Mem == nil && (a.DmabufFd > 0 || a.DmabufLen > 0) }

func (a ZcrxArea) reg() (zcrxAreaReg, error) {
	page := uint64(os.Getpagesize())
	if a.isDmabuf() {
		if a.DmabufLen == 0 || a.DmabufLen%page != 0 {
			return zcrxAreaReg{}, fmt.Errorf("dmabuf area of %d bytes (need whole pages): %w", a.DmabufLen, unix.EINVAL)
		}
		return zcrxAreaReg{Len: a.DmabufLen, Flags: ZcrxAreaDmabuf, DmabufFd: uint32(a.DmabufFd)}, nil
	}
	if len(a.Mem) == 0 || uint64(uintptr(unsafe.Pointer(&a.Mem[0])))%page != 0 || uint64(len(a.Mem))%page != 0 {
		return zcrxAreaReg{}, fmt.Errorf("area must be whole, page-aligned pages: %w", unix.EINVAL)
	}
	return zcrxAreaReg{Addr: uint64(uintptr(unsafe.Pointer(&a.Mem[0]))), Len: uint64(len(a.Mem))}, nil
}

// ZcrxConfig describes a zcrx instance.
type ZcrxConfig struct {
	// IfIndex and RxQueue name the NIC hardware RX queue to bind. Leave both 0 with NoDev.
	IfIndex, RxQueue uint32
	// NoDev registers a device-less instance (Linux 7.1+): RECV_ZC then works on any TCP socket
	// and copies the payload into the area; refills need FlushRQ.
	NoDev bool
	// RqEntries is the refill ring size (a power of two, at most 32768).
	RqEntries uint32
	Area      ZcrxArea
	// RxBufLen asks for a receive buffer size (0: the page size; a device-less instance
	// accepts nothing else).
	RxBufLen uint32
	// Stats asks the kernel to count its copies in the refill region (ZcrxFeatureEvent).
	Stats bool
}

// zcrxRQ is the refill ring, shared by a zcrx instance and its imports in other rings (the
// same user memory); mu serialises producers.
type zcrxRQ struct {
	mu      sync.Mutex
	mem     []byte
	head    *uint32
	tail    *uint32
	rqes    []ZcrxRqe
	local   uint32
	stats   *ZcrxStats
	users   int
	refills uint64
}

// Zcrx is a zcrx instance registered with a ring. The kernel keeps it until the ring closes.
type Zcrx struct {
	ring     *Ring
	id       uint32
	token    uint64
	rxBufLen uint32
	nodev    bool
	rq       *zcrxRQ
	closed   bool
}

var openZcrx atomic.Int64

// OpenZcrx returns how many Zcrx objects are open; tests use it to find leaks.
func OpenZcrx() int64 { return openZcrx.Load() }

// ZcrxError explains a failed zcrx operation. Refusals (the kernel or device cannot) wrap a
// *errs.NotSupportedError and so match ErrNotSupported; the errno matches too.
type ZcrxError struct {
	Op      string // "register", "import", "export", "flush", "add area"
	IfIndex uint32
	RxQueue uint32
	NoDev   bool
	Err     error
}

func (e *ZcrxError) Error() string {
	where := fmt.Sprintf("ifindex %d rx queue %d", e.IfIndex, e.RxQueue)
	if e.NoDev {
		where = "device-less"
	}
	return fmt.Sprintf("uring: zcrx %s (%s): %v", e.Op, where, e.Err)
}

func (e *ZcrxError) Unwrap() error { return e.Err }

// zcrxDrivers is what a device-backed zcrx needs, in the words of every refusal.
const zcrxDrivers = "a NIC driver with zcrx support (mlx5, gve, fbnic, bnxt)"

func (cfg *ZcrxConfig) regError(op string, err error) error {
	e := &ZcrxError{Op: op, IfIndex: cfg.IfIndex, RxQueue: cfg.RxQueue, NoDev: cfg.NoDev, Err: err}
	switch {
	case errors.Is(err, unix.EPERM):
		e.Err = errs.NotSupported("zcrx", "CAP_NET_ADMIN", err)
	case cfg.Area.isDmabuf() && cfg.NoDev && errors.Is(err, unix.EINVAL):
		e.Err = errs.NotSupported("zcrx dmabuf area", "a device to map the dmabuf for: "+zcrxDrivers+"; a device-less instance takes user memory only", err)
	case errors.Is(err, unix.EOPNOTSUPP) && !cfg.NoDev:
		e.Err = errs.NotSupported(fmt.Sprintf("zcrx on ifindex %d rx queue %d", cfg.IfIndex, cfg.RxQueue), zcrxDrivers, err)
	case errors.Is(err, unix.ENODEV):
		e.Err = fmt.Errorf("%w (no interface with that index in this network namespace)", err)
	case errors.Is(err, unix.ENOMEM):
		e.Err = fmt.Errorf("%w (the area counts against RLIMIT_MEMLOCK without CAP_IPC_LOCK: raise it with ulimit -l or memreg.RaiseMemlock)", err)
	case errors.Is(err, unix.EINVAL):
		e.Err = fmt.Errorf("%w (zcrx needs a ring set up with DEFER_TASKRUN and CQE32, a page-aligned area and a power-of-two refill ring of at most 32768 entries)", err)
	}
	return e
}

// needZcrx returns nil when this kernel supports what cfg asks for (probing, not guessing).
func (cfg *ZcrxConfig) needZcrx() error {
	q, qerr := queryZcrx()
	if cfg.NoDev {
		if qerr != nil {
			return errs.NotSupported("device-less zcrx (ZCRX_REG_NODEV)", "Linux 7.1 or newer", qerr)
		}
		if q.RegisterFlags&ZcrxRegNodev == 0 {
			return errs.NotSupported("device-less zcrx (ZCRX_REG_NODEV)", "Linux 7.1 or newer", nil)
		}
	}
	if cfg.Stats && (qerr != nil || q.Features&ZcrxFeatureEvent == 0) {
		return errs.NotSupported("zcrx copy statistics (ZCRX_FEATURE_EVENT)", "Linux 7.2 or newer", qerr)
	}
	return nil
}

// RegisterZcrx registers a zcrx instance with the ring: a hardware RX queue (IfIndex/RxQueue)
// or, with NoDev, a device-less one. The ring must have been set up with SetupDeferTaskrun
// (and SetupSingleIssuer) and SetupCQE32. The area stays the caller's: it must stay mapped
// until the ring is closed (the kernel pins its pages until then).
func (r *Ring) RegisterZcrx(cfg ZcrxConfig) (*Zcrx, error) {
	if cfg.NoDev && (cfg.IfIndex != 0 || cfg.RxQueue != 0) {
		return nil, cfg.regError("register", fmt.Errorf("a device-less instance takes no interface or queue: %w", unix.EINVAL))
	}
	n := cfg.RqEntries
	if n == 0 || n&(n-1) != 0 || n > zcrxMaxRQEntries {
		return nil, cfg.regError("register", fmt.Errorf("refill ring of %d entries (need a power of two <= %d): %w", n, zcrxMaxRQEntries, unix.EINVAL))
	}
	areaReg, err := cfg.Area.reg()
	if err != nil {
		return nil, cfg.regError("register", err)
	}
	if err := cfg.needZcrx(); err != nil {
		return nil, cfg.regError("register", err)
	}
	// Refill region: one page of header (head and tail; 128 bytes on 7.3), the entries, and
	// a stats block after them.
	page := os.Getpagesize()
	statsOff := page + int(n)*int(unsafe.Sizeof(ZcrxRqe{}))
	size := (statsOff + int(unsafe.Sizeof(ZcrxStats{})) + page - 1) &^ (page - 1)
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, cfg.regError("register", os.NewSyscallError("mmap(zcrx refill ring)", err))
	}
	// The kernel reads these (and writes areaReg's token) through addresses in reg: keep them
	// off the stack (see escape).
	ar := &areaReg
	rd := &regionDesc{UserAddr: uint64(uintptr(unsafe.Pointer(&mem[0]))), Size: uint64(size), Flags: memRegionTypeUser}
	ev := new(zcrxEventDesc)
	escape(ar)
	escape(rd)
	escape(ev)
	reg := zcrxIfqReg{IfIdx: cfg.IfIndex, IfRxq: cfg.RxQueue, RqEntries: n, RxBufLen: cfg.RxBufLen,
		AreaPtr: uint64(uintptr(unsafe.Pointer(ar))), RegionPtr: uint64(uintptr(unsafe.Pointer(rd)))}
	if cfg.NoDev {
		reg.Flags = ZcrxRegNodev
	}
	if cfg.Stats {
		*ev = zcrxEventDesc{Flags: zcrxEventDescFlagStats, StatsOffset: uint64(statsOff)}
		reg.EventDesc = uint64(uintptr(unsafe.Pointer(ev)))
	}
	_, err = register(r.fd, RegisterZcrxIfq, unsafe.Pointer(&reg), 1)
	runtime.KeepAlive(ar)
	runtime.KeepAlive(rd)
	runtime.KeepAlive(ev)
	if err != nil {
		unix.Munmap(mem)
		return nil, cfg.regError("register", err)
	}
	rq := &zcrxRQ{mem: mem, users: 1}
	rq.head = (*uint32)(unsafe.Pointer(&mem[reg.Offsets.Head]))
	rq.tail = (*uint32)(unsafe.Pointer(&mem[reg.Offsets.Tail]))
	rq.rqes = unsafe.Slice((*ZcrxRqe)(unsafe.Pointer(&mem[reg.Offsets.Rqes])), reg.RqEntries)
	if cfg.Stats {
		rq.stats = (*ZcrxStats)(unsafe.Pointer(&mem[statsOff]))
	}
	openZcrx.Add(1)
	return &Zcrx{ring: r, id: reg.ZcrxID, token: areaReg.RqAreaToken, rxBufLen: reg.RxBufLen, nodev: cfg.NoDev, rq: rq}, nil
}

// ID is the instance id for RECV_ZC SQEs on this ring.
func (z *Zcrx) ID() uint32 { return z.id }

// AreaToken is the area's id in the high bits of CQE offsets (0 for the first area).
func (z *Zcrx) AreaToken() uint64 { return z.token }

// RxBufLen is the size of the area's receive buffers (the kernel's niov size).
func (z *Zcrx) RxBufLen() uint32 { return z.rxBufLen }

// NoDev reports whether this is a device-less instance (refills need FlushRQ).
func (z *Zcrx) NoDev() bool { return z.nodev }

// RQEntries returns the refill ring size.
func (z *Zcrx) RQEntries() uint32 { return uint32(len(z.rq.rqes)) }

// Refill returns buffers to the kernel: each entry is a CQE's offset (area bits included)
// and length. It writes as many as the refill ring has room for, publishes them, and returns
// how many it took; the rest must wait until the kernel consumed entries (FlushRQ for a
// device-less instance). Safe for concurrent use by the instance and its imports.
func (z *Zcrx) Refill(entries []ZcrxRqe) int {
	rq := z.rq
	rq.mu.Lock()
	defer rq.mu.Unlock()
	if rq.mem == nil {
		return 0
	}
	mask := uint32(len(rq.rqes) - 1)
	room := uint32(len(rq.rqes)) - (rq.local - atomic.LoadUint32(rq.head))
	k := min(uint32(len(entries)), room)
	for i := uint32(0); i < k; i++ {
		e := &rq.rqes[(rq.local+i)&mask]
		e.Off = entries[i].Off
		e.Len = entries[i].Len
		e.Pad = 0
	}
	if k > 0 {
		rq.local += k
		rq.refills += uint64(k)
		atomic.StoreUint32(rq.tail, rq.local)
	}
	return int(k)
}

// RQPending returns how many published refill entries the kernel has not consumed yet.
func (z *Zcrx) RQPending() uint32 {
	rq := z.rq
	rq.mu.Lock()
	defer rq.mu.Unlock()
	if rq.mem == nil {
		return 0
	}
	return rq.local - atomic.LoadUint32(rq.head)
}

// Refills returns how many refill entries were published in total (all sharers).
func (z *Zcrx) Refills() uint64 {
	z.rq.mu.Lock()
	defer z.rq.mu.Unlock()
	return z.rq.refills
}

// Stats returns the kernel's copy counters when the instance was registered with Stats.
func (z *Zcrx) Stats() (ZcrxStats, bool) {
	z.rq.mu.Lock()
	defer z.rq.mu.Unlock()
	if z.rq.stats == nil || z.rq.mem == nil {
		return ZcrxStats{}, false
	}
	return ZcrxStats{CopyCount: atomic.LoadUint64(&z.rq.stats.CopyCount), CopyBytes: atomic.LoadUint64(&z.rq.stats.CopyBytes)}, true
}

func (z *Zcrx) ctrl(op uint32, c *zcrxCtrl, what string) error {
	if z.closed || z.ring.closed {
		return &ZcrxError{Op: what, NoDev: z.nodev, Err: os.ErrClosed}
	}
	c.ZcrxID = z.id
	c.Op = op
	_, err := register(z.ring.fd, RegisterZcrxCtrl, unsafe.Pointer(c), 0)
	runtime.KeepAlive(c)
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			err = errs.NotSupported("zcrx control "+what, "Linux 7.0 or newer", err)
		}
		return &ZcrxError{Op: what, NoDev: z.nodev, Err: err}
	}
	return nil
}

// FlushRQ makes the kernel consume the published refill entries now (ZCRX_CTRL_FLUSH_RQ). A
// device-less instance has no page pool pulling them, so it needs this after Refill.
func (z *Zcrx) FlushRQ() error {
	var c zcrxCtrl
	return z.ctrl(zcrxCtrlFlushRQ, &c, "flush")
}

// Export returns a new file descriptor (O_CLOEXEC, the caller's to close) that another ring
// imports with ImportZcrx: both rings then receive into the same area and share the refill
// ring.
func (z *Zcrx) Export() (int, error) {
	var c zcrxCtrl
	if err := z.ctrl(zcrxCtrlExport, &c, "export"); err != nil {
		return -1, err
	}
	return int(uint32(c.Arg[0])), nil
}

// ImportZcrx registers, in this ring, the instance exported as fd by from (another ring of
// this process). The import shares from's refill ring and area; it stays usable after from's
// ring closes (the kernel keeps the instance until the last ring or exported fd goes).
func (r *Ring) ImportZcrx(fd int, from *Zcrx) (*Zcrx, error) {
	if from == nil || fd < 0 {
		return nil, &ZcrxError{Op: "import", Err: fmt.Errorf("no exported instance: %w", unix.EBADF)}
	}
	from.rq.mu.Lock()
	if from.rq.mem == nil {
		from.rq.mu.Unlock()
		return nil, &ZcrxError{Op: "import", NoDev: from.nodev, Err: os.ErrClosed}
	}
	from.rq.users++
	from.rq.mu.Unlock()
	reg := zcrxIfqReg{IfIdx: uint32(fd), Flags: ZcrxRegImport}
	_, err := register(r.fd, RegisterZcrxIfq, unsafe.Pointer(&reg), 1)
	if err != nil {
		from.releaseRQ()
		if errors.Is(err, unix.EINVAL) {
			err = errs.NotSupported("zcrx import (ZCRX_REG_IMPORT)", "Linux 7.0 or newer and a ring with DEFER_TASKRUN and CQE32", err)
		}
		return nil, &ZcrxError{Op: "import", NoDev: from.nodev, Err: err}
	}
	openZcrx.Add(1)
	return &Zcrx{ring: r, id: reg.ZcrxID, token: from.token, rxBufLen: from.rxBufLen, nodev: from.nodev, rq: from.rq}, nil
}

// AddArea gives the instance another area (ZCRX_CTRL_ADD_AREA, Linux 7.3) and returns its
// token (the high bits of the offsets that name it). The area must stay mapped until the
// ring closes.
func (z *Zcrx) AddArea(a ZcrxArea) (uint64, error) {
	areaReg, err := a.reg()
	if err != nil {
		return 0, &ZcrxError{Op: "add area", NoDev: z.nodev, Err: err}
	}
	var c zcrxCtrl
	ar := &areaReg
	escape(ar) // the kernel reads it, and writes its token, through c.Arg[0]
	c.Arg[0] = uint64(uintptr(unsafe.Pointer(ar)))
	err = z.ctrl(zcrxCtrlAddArea, &c, "add area")
	runtime.KeepAlive(ar)
	if err != nil {
		return 0, err
	}
	return areaReg.RqAreaToken, nil
}

func (z *Zcrx) releaseRQ() {
	rq := z.rq
	rq.mu.Lock()
	defer rq.mu.Unlock()
	rq.users--
	if rq.users == 0 && rq.mem != nil {
		// The kernel pinned the region's pages at registration; unmapping our view is safe.
		unix.Munmap(rq.mem)
		rq.mem, rq.head, rq.tail, rq.rqes, rq.stats = nil, nil, nil, nil, nil
	}
}

// Close drops this handle; the refill ring is unmapped when its last sharer closes. The
// kernel releases the instance (and the pins on the area) when the ring closes. A second
// Close returns os.ErrClosed.
func (z *Zcrx) Close() error {
	if z == nil || z.closed {
		return os.ErrClosed
	}
	z.closed = true
	z.releaseRQ()
	openZcrx.Add(-1)
	return nil
}

// PrepRecvZC prepares a multishot zero-copy receive on fd through zcrx instance id. Every
// completion is 32 bytes: CQE32.ZcrxOffset is where the res bytes lie in the area. n > 0
// ends the request after n bytes; 0 receives until EOF or an error.
func (s *SQE) PrepRecvZC(fd int32, id uint32, n uint32) {
	s.prepRW(OpRecvZC, fd, 0, n, 0)
	s.IoPrio = RecvMultishot
	s.FileIndex = int32(id)
}

// ZcrxOffset returns a RECV_ZC completion's offset (struct io_uring_zcrx_cqe.off): the area
// token in the high bits, the byte offset in the area below ZcrxAreaShift.
func (c *CQE32) ZcrxOffset() uint64 { return c.Big[0] }
