package hwq

import (
	"errors"
	"fmt"
	"math/bits"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/eintr"
	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/internal/memregops"
	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/memreg"
)

// ErrNoDevice: the interface does not exist, or went away while a raw queue was bound to
// it (the kernel unbinds the socket and reports ENETDOWN).
var ErrNoDevice = errors.New("no such network interface")

// RawQueueOptions says how OpenRawQueue builds a raw queue. The zero value is usable.
type RawQueueOptions struct {
	// NetNS, when > 0, is an open descriptor of the network namespace the interface lives in;
	// 0 means the calling thread's namespace.
	NetNS int
	// RingSize is the number of entries of each of the four rings (fill, completion, RX,
	// TX): a power of two, default 2048.
	RingSize int
	// FillSize is the number of entries of the fill and completion rings: a power of two,
	// default RingSize. A fill ring larger than the RX ring keeps the kernel supplied with
	// buffers while the application holds received frames.
	FillSize int
	// TxReserve is how many of the region's buffers the fill ring never takes: they stay
	// free for Get, so a queue that receives can always send. 0 means the default, a quarter
	// of the region (at least one buffer, and none of a one-buffer region); a negative value keeps none (a receive-only
	// queue: Get may then find every free buffer lent to the fill ring). It must leave the
	// fill ring at least one buffer.
	TxReserve int
	// RequireZeroCopy refuses copy mode: where the driver cannot bind the queue in
	// zero-copy mode, OpenRawQueue fails with an error matching ErrNotSupported instead of
	// falling back.
	RequireZeroCopy bool
	// RxCoalesce: a Receive that had to wait sleeps this long after it is woken before it
	// takes the frames, so a batch builds up and the kernel finds no waiter to wake for
	// the frames in between (each wake-up costs the sending side's kernel path as well as
	// the receiver; TPACKET_V3's block retire timeout does the same). It adds up to
	// RxCoalesce to a frame's latency (and Close or a deadline may find a Receive asleep
	// for up to as long); 0, the default, takes frames as soon as one is there, up to 1s.
	// TryReceive is not affected.
	RxCoalesce time.Duration
	// NoNeedWakeup binds without XDP_USE_NEED_WAKEUP: the queue then kicks the kernel on
	// every send instead of only when the kernel asks.
	NoNeedWakeup bool
	// Steering is the raw-queue program of the interface when several raw queues share it
	// (the queue adds its socket at Open and removes it at Close). Nil: the queue attaches a
	// program of its own (RawQueue.Steering), detached at Close.
	Steering *bpf.RawSteering
	// XDP says how an own program is attached (bpf.XDPAuto: native, then generic as a
	// visible fallback — generic from the start on veth, where native would turn off the
	// peer's TSO (RawQueue.Mode says so); bpf.XDPDriver refuses the fallback). Ignored with
	// Steering.
	XDP bpf.XDPMode
	// Metadata asks an own program for the device's RX timestamp and hash (see
	// bpf.RawSteeringOptions.Metadata). Ignored with Steering.
	Metadata bool
}

// RawQueueMode says what a raw queue got from the kernel.
type RawQueueMode struct {
	// ZeroCopy: the socket is bound in zero-copy mode (the NIC DMAs into the region).
	ZeroCopy bool
	// CopyReason is why zero-copy bind failed and copy mode is used (an error matching
	// ErrNotSupported); nil in zero-copy mode.
	CopyReason error
	// NeedWakeup: the kernel asks for kicks (XDP_USE_NEED_WAKEUP) instead of being kicked
	// on every send.
	NeedWakeup bool
	// XDP is how the steering program runs; XDPReason why native mode was not used.
	XDP       bpf.RawAttachMode
	XDPReason error
}

// RawQueueStats are a raw queue's counters. The kernel's (XDP_STATISTICS) are read at the
// call; the others are kept by the queue.
type RawQueueStats struct {
	RxFrames, RxBytes uint64 // frames handed to the application
	TxFrames, TxBytes uint64 // frames put on the TX ring
	TxCompleted       uint64 // frames the kernel finished sending (completion ring)
	// TxRingFull: frames Send could not queue because the TX ring was full (Send returned
	// fewer than it was given).
	TxRingFull uint64
	// FillShort: times the fill ring was empty and no free buffer of the region could refill
	// it (the application holds them all): frames arriving then are dropped, RxDropped.
	FillShort uint64
	// Kicks: wake-up calls made (recvfrom / sendto), as need_wakeup asked.
	RxKicks, TxKicks uint64

	// The kernel's counters (XDP_STATISTICS).
	RxDropped       uint64 // frames dropped for want of a fill-ring buffer, or too large
	RxInvalid       uint64 // invalid fill-ring descriptors
	TxInvalid       uint64 // invalid TX descriptors
	RxRingFull      uint64 // frames dropped because the RX ring was full
	FillRingEmpty   uint64 // times the kernel found the fill ring empty
	TxRingEmptyDesc uint64 // times the kernel found the TX ring empty on a kick
}

// Frame is one frame in a raw queue's region: a memreg buffer and where the frame lies in
// it. A received Frame's Buf belongs to the application until Buf.Release or
// RawQueue.Release (then it refills the fill ring); a Frame given to Send is lent to the
// kernel until its completion.
type Frame struct {
	Buf memreg.Buf
	Off int // offset of the first byte in the buffer
	Len int // frame length, Ethernet header included
}

// Bytes is the frame's memory (nil when the handle is stale).
func (f Frame) Bytes() []byte {
	b := f.Buf.Bytes()
	if b == nil || f.Off < 0 || f.Len < 0 || f.Off+f.Len > len(b) {
		return nil
	}
	return b[f.Off : f.Off+f.Len]
}

// Meta reads the RX metadata the steering program put before the frame (RawSteering with
// Metadata): ok is false when there is none.
func (f Frame) Meta() (m bpf.RawMeta, ok bool) {
	b := f.Buf.Bytes()
	if b == nil || f.Off < bpf.RawMetaSize || f.Off > len(b) {
		return m, false
	}
	return bpf.ParseRawMeta(b[:f.Off])
}

// RawQueue is an AF_XDP socket bound to one RX/TX queue pair of a device: its UMEM is a
// memreg region (frames are the region's buffers: nothing is copied between the UMEM and
// what the application reads or fills), its four rings are mapped into the process, and a
// steering program (bpf.RawSteering) sends it the frames its rules pick while the kernel
// stack gets the rest.
//
// One goroutine may receive while another sends; Close may be called from any goroutine,
// wakes a blocked Receive, and tears everything down.
type RawQueue struct {
	ifname   string
	ifindex  int
	queue    int
	mtu      int
	mac      net.HardwareAddr
	region   *memreg.Region
	bufSize  uint64
	reserve  int           // region buffers the fill ring leaves free (TxReserve)
	coalesce time.Duration // RxCoalesce
	// fd is the socket. It is not in Go's netpoller: in copy mode the kernel's xsk_poll
	// transmits whatever is on the TX ring, so a poller thread would fight the sending
	// goroutine over the socket. The hot paths use it under rxMu or txMu, Stats and the
	// RawConn under fdMu's read lock; teardown closes it holding all three.
	fd   int
	fdMu sync.RWMutex
	// closeFd (an eventfd written once by Close, never drained) and kickFd (written by
	// SetReadDeadline, drained by Receive) end a Receive's wait.
	closeFd, kickFd int
	mode            RawQueueMode

	steer    *bpf.RawSteering
	ownSteer bool

	rxMu       sync.Mutex
	fill, rx   ring
	emptyPolls uint32         // TryReceives that found nothing since the last device check (rxMu)
	rxHot      bool           // the last Receive took frames and RxCoalesce is set (rxMu)
	provide    []memreg.Loan  // refill's scratch (rxMu)
	rxIdx      []int          // take's scratch (rxMu)
	rxBufs     []memreg.Buf   // take's scratch (rxMu)
	pfds       [3]unix.PollFd // Receive's wait (rxMu)
	txMu       sync.Mutex
	tx, comp   ring
	reaped     []memreg.Loan // reap's scratch (txMu)
	txBufs     []memreg.Buf  // Send's scratch (txMu)
	txLoans    []memreg.Loan // Send's scratch (txMu)
	// loans: buffers in the kernel's hands, by region index: those of the fill ring are
	// written under rxMu, those of the TX ring under txMu (a buffer moves between the two
	// only through the region's free list).
	loans  []memreg.Loan
	inFill int // buffers on the fill ring or being received into (rxMu)

	deadline  atomic.Pointer[time.Time] // Receive's deadline (nil: none)
	gone      atomic.Pointer[error]     // the interface went away: every later call returns it
	closeOnce sync.Once
	closed    atomic.Bool
	closeErr  error

	st struct {
		rxFrames, rxBytes, txFrames, txBytes, txCompleted atomic.Uint64
		txRingFull, fillShort, rxKicks, txKicks           atomic.Uint64
	}
}

var openRawQueues atomic.Int64

// OpenRawQueues is the number of raw queues not yet closed (for leak checks).
func OpenRawQueues() int64 { return openRawQueues.Load() }

var copyModeFallbacks atomic.Int64

// CopyModeFallbacks counts, process-wide, the raw queues bound in copy mode because the
// zero-copy bind failed.
func CopyModeFallbacks() int64 { return copyModeFallbacks.Load() }

// ring is one of the four mapped rings. The process is the only producer of fill and TX
// and the only consumer of RX and completion; local is its own index.
type ring struct {
	mem   []byte
	prod  *uint32
	cons  *uint32
	flags *uint32
	desc  unsafe.Pointer
	mask  uint32
	size  uint32
	local uint32
}

func (r *ring) unmap() {
	if r.mem != nil {
		unix.Munmap(r.mem)
		*r = ring{}
	}
}

// producer side: free entries.
func (r *ring) free() uint32 { return r.size - (r.local - atomic.LoadUint32(r.cons)) }

// consumer side: entries ready.
func (r *ring) ready() uint32 { return atomic.LoadUint32(r.prod) - r.local }

func (r *ring) addr(i uint32) *uint64 {
	return (*uint64)(unsafe.Add(r.desc, uintptr(i&r.mask)*8))
}

func (r *ring) xdesc(i uint32) *unix.XDPDesc {
	return (*unix.XDPDesc)(unsafe.Add(r.desc, uintptr(i&r.mask)*unsafe.Sizeof(unix.XDPDesc{})))
}

func (r *ring) needWakeup() bool { return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0 }

// OpenRawQueue opens a raw queue on RX/TX queue `queue` of interface ifname with region as
// its UMEM. The region's buffers are the frames: BufSize must be a power of two from 2048
// to the page size, and every buffer must be free (the queue lends them to the kernel
// through the fill ring as it needs). Steps: socket, UMEM registration, the four rings,
// bind (zero-copy first, copy mode as the visible fallback), the steering program, the
// socket's XSKMAP entry. A failing step undoes the ones before it.
func OpenRawQueue(ifname string, queue int, region *memreg.Region, opts *RawQueueOptions) (*RawQueue, error) {
	const op = "open raw queue"
	var o RawQueueOptions
	if opts != nil {
		o = *opts
	}
	if o.RingSize == 0 {
		o.RingSize = 2048
	}
	if o.FillSize == 0 {
		o.FillSize = o.RingSize
	}
	if err := checkRawArgs(queue, region, &o); err != nil {
		return nil, opErr(op, ifname, err)
	}
	q := &RawQueue{ifname: ifname, queue: queue, region: region, bufSize: uint64(region.BufSize()), fd: -1, closeFd: -1, kickFd: -1}
	if o.RxCoalesce > 0 {
		q.coalesce = o.RxCoalesce
	}
	switch {
	case o.TxReserve < 0:
	case o.TxReserve == 0:
		q.reserve = min(max(1, region.Count()/4), region.Count()-1)
	default:
		q.reserve = o.TxReserve
	}
	var err error
	if o.NetNS > 0 {
		err = netns.Do(o.NetNS, func() error { return q.open(&o) })
	} else {
		err = q.open(&o)
	}
	if err != nil {
		q.teardown()
		return nil, opErr(op, ifname, err)
	}
	openRawQueues.Add(1)
	return q, nil
}

func checkRawArgs(queue int, region *memreg.Region, o *RawQueueOptions) error {
	if region == nil {
		return &ValueError{"region", nil, "a memreg region is needed as the UMEM"}
	}
	if queue < 0 || queue >= bpf.MaxRawQueues {
		return &ValueError{"queue", queue, fmt.Sprintf("want 0..%d", bpf.MaxRawQueues-1)}
	}
	bs := region.BufSize()
	page := os.Getpagesize()
	if bs < xdpUmemMinChunk || bs > page || bits.OnesCount(uint(bs)) != 1 {
		return &ValueError{"region buffer size", bs, fmt.Sprintf("AF_XDP frames (aligned mode) are a power of two from %d to the page size %d", xdpUmemMinChunk, page)}
	}
	mem := region.Memory()
	if mem == nil {
		return &ValueError{"region", "closed", "the region is closed"}
	}
	if region.Base()%uintptr(page) != 0 {
		return &ValueError{"region base", fmt.Sprintf("%#x", region.Base()), "a UMEM starts on a page boundary"}
	}
	if region.Free() != region.Count() {
		return &ValueError{"region", fmt.Sprintf("%d of %d buffers free", region.Free(), region.Count()), "every buffer must be free: the raw queue owns the region"}
	}
	for _, rs := range []int{o.RingSize, o.FillSize} {
		if rs <= 0 || rs > 1<<20 || bits.OnesCount(uint(rs)) != 1 {
			return &ValueError{"ring size", rs, "a power of two up to 1<<20"}
		}
	}
	if o.RxCoalesce < 0 || o.RxCoalesce > time.Second {
		return &ValueError{"RxCoalesce", o.RxCoalesce, "want 0 to 1s"}
	}
	if o.TxReserve >= region.Count() {
		return &ValueError{"TxReserve", o.TxReserve, fmt.Sprintf("the region has %d buffers: the fill ring needs at least one", region.Count())}
	}
	if o.Steering != nil && o.Metadata {
		return &ValueError{"Metadata", true, "set it on the shared Steering (bpf.RawSteeringOptions)"}
	}
	return nil
}

// open runs in the interface's namespace.
func (q *RawQueue) open(o *RawQueueOptions) error {
	ifi, err := net.InterfaceByName(q.ifname)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoDevice, err)
	}
	q.ifindex, q.mtu, q.mac = ifi.Index, ifi.MTU, ifi.HardwareAddr
	nrx, ntx, qerr := linkQueues(ifi.Index)
	if qerr == nil && (q.queue >= nrx || q.queue >= ntx) {
		return &ValueError{"queue", q.queue, fmt.Sprintf("%s has %d RX and %d TX queues", q.ifname, nrx, ntx)}
	}
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.EAFNOSUPPORT) {
			return errs.NotSupported("AF_XDP sockets", "CONFIG_XDP_SOCKETS=y (Linux 4.18+)", err)
		}
		return os.NewSyscallError("socket AF_XDP", err)
	}
	q.fd = fd
	mem := q.region.Memory()
	reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(&mem[0]))), Len: uint64(q.region.Count()) * q.bufSize, Size: uint32(q.bufSize)}
	err = xdpSetsockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg))
	if err != nil {
		switch {
		case errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.ENOBUFS):
			return fmt.Errorf("%w (RLIMIT_MEMLOCK too low for a %d-byte UMEM? raise it with ulimit -l)", os.NewSyscallError("setsockopt XDP_UMEM_REG", err), reg.Len)
		case errors.Is(err, unix.EINVAL):
			return fmt.Errorf("%w: %w", &ValueError{"UMEM", fmt.Sprintf("%d frames of %d bytes at %#x", q.region.Count(), q.bufSize, reg.Addr), "refused by the kernel"}, os.NewSyscallError("setsockopt XDP_UMEM_REG", err))
		}
		return os.NewSyscallError("setsockopt XDP_UMEM_REG", err)
	}
	nr, nf := uint32(o.RingSize), uint32(o.FillSize)
	for _, rs := range []struct {
		opt int
		n   *uint32
	}{{unix.XDP_UMEM_FILL_RING, &nf}, {unix.XDP_UMEM_COMPLETION_RING, &nf}, {unix.XDP_RX_RING, &nr}, {unix.XDP_TX_RING, &nr}} {
		if err := xdpSetsockopt(fd, rs.opt, unsafe.Pointer(rs.n), 4); err != nil {
			return os.NewSyscallError(fmt.Sprintf("setsockopt SOL_XDP %d (ring size %d)", rs.opt, *rs.n), err)
		}
	}
	var off unix.XDPMmapOffsets
	if _, err := xdpGetsockopt(fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off)); err != nil {
		return os.NewSyscallError("getsockopt XDP_MMAP_OFFSETS", err)
	}
	for _, m := range []struct {
		r     *ring
		o     unix.XDPRingOffset
		pgoff int64
		esz   uint64
		n     uint32
	}{
		{&q.fill, off.Fr, unix.XDP_UMEM_PGOFF_FILL_RING, 8, nf},
		{&q.comp, off.Cr, unix.XDP_UMEM_PGOFF_COMPLETION_RING, 8, nf},
		{&q.rx, off.Rx, unix.XDP_PGOFF_RX_RING, uint64(unsafe.Sizeof(unix.XDPDesc{})), nr},
		{&q.tx, off.Tx, unix.XDP_PGOFF_TX_RING, uint64(unsafe.Sizeof(unix.XDPDesc{})), nr},
	} {
		n := m.n
		size := int(m.o.Desc + uint64(n)*m.esz)
		b, err := unix.Mmap(fd, m.pgoff, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return os.NewSyscallError("mmap AF_XDP ring", err)
		}
		base := unsafe.Pointer(&b[0])
		*m.r = ring{mem: b, prod: (*uint32)(unsafe.Add(base, m.o.Producer)), cons: (*uint32)(unsafe.Add(base, m.o.Consumer)),
			flags: (*uint32)(unsafe.Add(base, m.o.Flags)), desc: unsafe.Add(base, m.o.Desc), mask: n - 1, size: n}
	}
	// The process produces fill and TX (its index is the producer's) and consumes RX and
	// completion.
	q.fill.local, q.tx.local = atomic.LoadUint32(q.fill.prod), atomic.LoadUint32(q.tx.prod)
	q.rx.local, q.comp.local = atomic.LoadUint32(q.rx.cons), atomic.LoadUint32(q.comp.cons)

	if err := q.bind(o); err != nil {
		return err
	}
	if o.Steering != nil {
		// An ifindex names an interface only within its namespace: both must be this
		// interface's, or the queue's frames would go to another interface's program.
		ns, err := threadNetNS()
		if err != nil {
			return err
		}
		if o.Steering.Ifindex() != q.ifindex || o.Steering.NetNS() != ns {
			return &ValueError{"Steering", fmt.Sprintf("ifindex %d in net:[%d]", o.Steering.Ifindex(), o.Steering.NetNS()),
				fmt.Sprintf("the steering is another interface's: %s is ifindex %d in net:[%d]", q.ifname, q.ifindex, ns)}
		}
		q.steer = o.Steering
	} else {
		s, err := bpf.NewRawSteering(q.ifindex, &bpf.RawSteeringOptions{Mode: o.XDP, Metadata: o.Metadata})
		if err != nil {
			return err
		}
		q.steer, q.ownSteer = s, true
	}
	q.mode.XDP, q.mode.XDPReason = q.steer.Mode(), q.steer.Fallback()
	if err := q.steer.SetSocket(q.queue, fd); err != nil {
		return err
	}
	for _, p := range []*int{&q.closeFd, &q.kickFd} {
		if *p, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
			return os.NewSyscallError("eventfd", err)
		}
	}
	q.pfds = [3]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(q.closeFd), Events: unix.POLLIN}, {Fd: int32(q.kickFd), Events: unix.POLLIN}}
	q.loans = make([]memreg.Loan, q.region.Count())
	q.provide = make([]memreg.Loan, nf)
	q.rxIdx, q.rxBufs = make([]int, nr), make([]memreg.Buf, nr)
	q.reaped = make([]memreg.Loan, nf)
	q.txBufs, q.txLoans = make([]memreg.Buf, nr), make([]memreg.Loan, nr)
	q.rxMu.Lock()
	q.refill()
	q.rxMu.Unlock()
	return nil
}

// threadNetNS is the inode of the calling thread's network namespace.
func threadNetNS() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0, os.NewSyscallError("stat /proc/thread-self/ns/net", err)
	}
	return st.Ino, nil
}

// bind binds the socket: zero-copy first, copy mode when the driver refuses it.
func (q *RawQueue) bind(o *RawQueueOptions) error {
	var wake uint16 = unix.XDP_USE_NEED_WAKEUP
	if o.NoNeedWakeup {
		wake = 0
	}
	sa := &unix.SockaddrXDP{Flags: unix.XDP_ZEROCOPY | wake, Ifindex: uint32(q.ifindex), QueueID: uint32(q.queue)}
	err := bindBusyRetry(q.fd, sa)
	if err == nil {
		q.mode.ZeroCopy, q.mode.NeedWakeup = true, wake != 0
		return nil
	}
	if errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("%w: %w", ErrNoDevice, os.NewSyscallError("bind AF_XDP", err))
	}
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("queue %d of %s already has an AF_XDP socket or memory provider: %w", q.queue, q.ifname, os.NewSyscallError("bind AF_XDP", err))
	}
	if errors.Is(err, unix.EINVAL) {
		return &ValueError{"queue", q.queue, fmt.Sprintf("refused by the kernel for %s (%v)", q.ifname, err)}
	}
	reason := errs.NotSupported("AF_XDP zero-copy", "a driver with XSK zero-copy (xdp-features xsk-zerocopy: i40e, ice, mlx5, ...)", os.NewSyscallError("bind AF_XDP XDP_ZEROCOPY", err))
	if o.RequireZeroCopy {
		return reason
	}
	sa.Flags = unix.XDP_COPY | wake
	if err := bindBusyRetry(q.fd, sa); err != nil {
		return os.NewSyscallError("bind AF_XDP XDP_COPY", err)
	}
	q.mode.CopyReason, q.mode.NeedWakeup = reason, wake != 0
	copyModeFallbacks.Add(1)
	return nil
}

// bindBusyRetry binds, retrying EBUSY for up to a second: the kernel detaches a closed
// socket's buffer pool from its queue in a workqueue after close(2) returns, so a queue
// closed just before (by this process or a killed one) can still look taken for a moment.
func bindBusyRetry(fd int, sa *unix.SockaddrXDP) error {
	var err error
	for wait := time.Millisecond; ; wait *= 2 {
		err = unix.Bind(fd, sa)
		if !errors.Is(err, unix.EBUSY) || wait > 512*time.Millisecond {
			return err
		}
		time.Sleep(wait)
	}
}

// linkQueues reads the device's RX and TX queue counts (IFLA_NUM_RX_QUEUES,
// IFLA_NUM_TX_QUEUES) in the calling thread's namespace.
func linkQueues(ifindex int) (rx, tx int, err error) {
	b, err := syscall.NetlinkRIB(syscall.RTM_GETLINK, syscall.AF_UNSPEC)
	if err != nil {
		return 0, 0, err
	}
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return 0, 0, err
	}
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != syscall.RTM_NEWLINK || len(m.Data) < syscall.SizeofIfInfomsg {
			continue
		}
		ifm := (*syscall.IfInfomsg)(unsafe.Pointer(&m.Data[0]))
		if int(ifm.Index) != ifindex {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			return 0, 0, err
		}
		for _, a := range attrs {
			if len(a.Value) < 4 {
				continue
			}
			v := int(*(*uint32)(unsafe.Pointer(&a.Value[0])))
			switch a.Attr.Type {
			case unix.IFLA_NUM_RX_QUEUES:
				rx = v
			case unix.IFLA_NUM_TX_QUEUES:
				tx = v
			}
		}
		if rx == 0 || tx == 0 {
			return 0, 0, errors.New("no queue counts in RTM_NEWLINK")
		}
		return rx, tx, nil
	}
	return 0, 0, ErrNoDevice
}

// Mode says what the queue got: zero-copy or copy mode (and why), need_wakeup, native or
// generic XDP (and why).
func (q *RawQueue) Mode() RawQueueMode { return q.mode }

// Steering is the queue's steering program: add rules to it (AddRule) to pick the frames
// the queue receives.
func (q *RawQueue) Steering() *bpf.RawSteering { return q.steer }

// Queue is the device queue the raw queue is bound to; Ifindex its interface.
func (q *RawQueue) Queue() int   { return q.queue }
func (q *RawQueue) Ifindex() int { return q.ifindex }

// MTU is the interface's MTU when the queue was opened: Send takes frames of up to
// MTU + 14 bytes.
func (q *RawQueue) MTU() int { return q.mtu }

// HardwareAddr is the interface's MAC address when the queue was opened (the source
// address of frames the application builds).
func (q *RawQueue) HardwareAddr() net.HardwareAddr { return q.mac }

// refill lends free region buffers to the kernel through the fill ring, leaving the
// region's TxReserve free for Get. rxMu held.
func (q *RawQueue) refill() {
	room := q.fill.free()
	if room > 0 {
		n := memregops.ProvideTo(q.region, q.provide[:room], q.reserve)
		idx := q.fill.local
		for _, l := range q.provide[:n] {
			q.loans[l.Index()] = l
			*q.fill.addr(idx) = uint64(l.Index()) * q.bufSize
			idx++
		}
		clear(q.provide[:n])
		if n > 0 {
			q.inFill += n
			q.fill.local = idx
			atomic.StoreUint32(q.fill.prod, idx)
		} else if q.fill.free() == q.fill.size {
			q.st.fillShort.Add(1)
		}
	}
	if q.mode.NeedWakeup && q.fill.needWakeup() {
		q.st.rxKicks.Add(1)
		unix.Syscall6(unix.SYS_RECVFROM, uintptr(q.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	}
}

// take moves up to len(frames) received frames from the RX ring (their buffers become the
// application's under one lock of the region). rxMu held.
func (q *RawQueue) take(frames []Frame) (int, error) {
	avail := q.rx.ready()
	n := min(int(avail), len(frames), len(q.rxIdx))
	if n == 0 {
		return 0, nil
	}
	for i := range n {
		q.rxIdx[i] = int(q.rx.xdesc(q.rx.local+uint32(i)).Addr / q.bufSize)
	}
	n, err := memregops.ReceivedBatch(q.region, q.rxIdx[:n], q.rxBufs[:n])
	if err != nil {
		// A descriptor naming a buffer the kernel does not hold is a bug; stop there.
		err = fmt.Errorf("RX descriptor %d: %w", n, err)
	}
	var bytes uint64
	for i, b := range q.rxBufs[:n] {
		d := q.rx.xdesc(q.rx.local + uint32(i))
		q.loans[b.Index()] = memreg.Loan{}
		frames[i] = Frame{Buf: b, Off: int(d.Addr % q.bufSize), Len: int(d.Len)}
		bytes += uint64(d.Len)
	}
	clear(q.rxBufs[:n])
	if n > 0 {
		q.rx.local += uint32(n)
		atomic.StoreUint32(q.rx.cons, q.rx.local)
		q.inFill -= n
		q.st.rxFrames.Add(uint64(n))
		q.st.rxBytes.Add(bytes)
	}
	return n, err
}

// Release gives received frames' buffers back (Buf.Release for each, under one lock of the
// region: cheaper per frame than releasing them one by one); the next receive lends them to
// the kernel again. It may be called from any goroutine, also after Close, and does not
// allocate. Every frame is tried; the first error is returned (a frame released before
// gives an error matching memreg.ErrStale).
func (q *RawQueue) Release(frames []Frame) error {
	var bufs [64]memreg.Buf
	var first error
	for len(frames) > 0 {
		k := min(len(frames), len(bufs))
		for i, f := range frames[:k] {
			bufs[i] = f.Buf
		}
		if err := q.region.ReleaseBatch(bufs[:k]); err != nil && first == nil {
			first = opErr("raw release", q.ifname, err)
		}
		frames = frames[k:]
	}
	return first
}

// live says why the queue cannot be used: closed, or its interface gone.
func (q *RawQueue) live() error {
	if q.closed.Load() {
		return os.ErrClosed
	}
	if e := q.gone.Load(); e != nil {
		return *e
	}
	return nil
}

// noDevice records that the interface went away (err matches ErrNoDevice): every later
// call returns it. It returns err.
func (q *RawQueue) noDevice(err error) error {
	if err != nil && errors.Is(err, ErrNoDevice) {
		q.setGone(err)
	}
	return err
}

// setGone stores err as the queue's ErrNoDevice (a function of its own: the error escapes
// to the heap here, not on every call of noDevice).
func (q *RawQueue) setGone(err error) {
	e := err
	q.gone.CompareAndSwap(nil, &e)
}

func (q *RawQueue) lockRx(op string) error {
	q.rxMu.Lock()
	if err := q.live(); err != nil {
		q.rxMu.Unlock()
		return opErr(op, q.ifname, err)
	}
	return nil
}

// deviceCheckPolls is how many empty TryReceives pass between two reads of the socket's
// error (the interface went away): a system call, so a polling loop pays it rarely, and
// no clock is read.
const deviceCheckPolls = 1024

// TryReceive takes up to len(frames) received frames without waiting (0 when none is
// there) after refilling the fill ring from the region's free buffers. Each returned
// frame's Buf belongs to the caller until Release. It enters the kernel only when the
// kernel asks for a wake-up, and, once every 1,024 calls that find nothing, to see whether
// the interface went away (ErrNoDevice, then returned by every later call). It neither
// allocates nor reads the clock.
func (q *RawQueue) TryReceive(frames []Frame) (int, error) {
	const op = "raw receive"
	if err := q.lockRx(op); err != nil {
		return 0, err
	}
	defer q.rxMu.Unlock()
	q.refill()
	n, err := q.take(frames)
	if n == 0 && err == nil {
		if q.emptyPolls++; q.emptyPolls >= deviceCheckPolls {
			q.emptyPolls = 0
			err = q.noDevice(sockErr(q.fd))
		}
	}
	return n, opErr(op, q.ifname, err)
}

// Receive waits until at least one frame is there, then takes up to len(frames) of them
// (see TryReceive). It returns early with an error on Close (os.ErrClosed), on the read
// deadline (os.ErrDeadlineExceeded) and when the interface goes away (ErrNoDevice, then
// returned by every later call). When frames are there it neither waits nor reads the
// clock; otherwise it waits in ppoll(2) on the socket and two eventfds (Close's and
// SetReadDeadline's), not in Go's netpoller; with RxCoalesce, while frames keep coming it
// sleeps on a Go timer instead (time.Sleep: the goroutine parks, so no thread blocks in a
// system call and Go's scheduler has no processor to hand over; a blocking nanosleep cost
// two futex calls per period besides). The kernel does not report an
// unbound socket through poll (xsk_poll has no EPOLLERR), so a wait that brings nothing
// (at most DeviceCheck long) reads the socket's error.
func (q *RawQueue) Receive(frames []Frame) (int, error) {
	const op = "raw receive"
	if len(frames) == 0 {
		return 0, nil
	}
	if err := q.lockRx(op); err != nil {
		return 0, err
	}
	defer q.rxMu.Unlock()
	coalesce := q.coalesce > 0
	for {
		q.refill()
		n, err := q.take(frames)
		if n > 0 || err != nil {
			q.rxHot = coalesce
			return n, opErr(op, q.ifname, err)
		}
		if q.rxHot {
			// Frames came in the last period: wait one more period on a timer instead of
			// on the socket (one system call per batch while traffic flows; back to a
			// wait on the socket once a period brings nothing).
			q.rxHot = false
			time.Sleep(q.coalesce)
			if q.closed.Load() {
				return 0, opErr(op, q.ifname, os.ErrClosed)
			}
			continue
		}
		wait := DeviceCheck
		if d := q.deadline.Load(); d != nil {
			left := time.Until(*d)
			if left <= 0 {
				return 0, opErr(op, q.ifname, os.ErrDeadlineExceeded)
			}
			wait = min(wait, left)
		}
		ready, perr := eintr.Poll(q.pfds[:], wait)
		if perr != nil {
			return 0, opErr(op, q.ifname, os.NewSyscallError("poll", perr))
		}
		if ready == 0 {
			// A period without a frame: is the interface still there? (Not read while
			// frames flow: a system call per wait otherwise.)
			if err := q.noDevice(sockErr(q.fd)); err != nil {
				return 0, opErr(op, q.ifname, err)
			}
		}
		if q.pfds[2].Revents != 0 {
			var b [8]byte
			unix.Read(q.kickFd, b[:])
		}
		if q.closed.Load() {
			return 0, opErr(op, q.ifname, os.ErrClosed)
		}
		if q.pfds[0].Revents&unix.POLLIN != 0 && coalesce {
			// Let a batch build up; nobody waits on the socket meanwhile, so the kernel
			// wakes no one for the frames that follow. Close and deadlines are seen after.
			time.Sleep(q.coalesce)
		}
	}
}

// DeviceCheck is how often a waiting Receive checks that its interface still exists.
const DeviceCheck = 250 * time.Millisecond

// SyscallConn gives the socket to an event loop that polls it itself (an io_uring
// POLL_ADD on the fd, epoll): on readiness it calls TryReceive. The fd stays valid while
// Control's function runs; do not close it. The socket is not in Go's netpoller: Read and
// Write wait in ppoll(2) (Close wakes them).
func (q *RawQueue) SyscallConn() (syscall.RawConn, error) {
	if q.closed.Load() {
		return nil, opErr("raw syscall conn", q.ifname, os.ErrClosed)
	}
	return rawConn{q}, nil
}

// rawConn is the socket as a syscall.RawConn.
type rawConn struct{ q *RawQueue }

func (c rawConn) Control(f func(fd uintptr)) error {
	q := c.q
	q.fdMu.RLock()
	defer q.fdMu.RUnlock()
	if q.closed.Load() {
		return os.ErrClosed
	}
	f(uintptr(q.fd))
	return nil
}

func (c rawConn) Read(f func(fd uintptr) bool) error  { return c.wait(f, unix.POLLIN) }
func (c rawConn) Write(f func(fd uintptr) bool) error { return c.wait(f, unix.POLLOUT) }

func (c rawConn) wait(f func(fd uintptr) bool, ev int16) error {
	q := c.q
	q.fdMu.RLock()
	defer q.fdMu.RUnlock()
	for {
		if q.closed.Load() {
			return os.ErrClosed
		}
		if f(uintptr(q.fd)) {
			return nil
		}
		pfds := [2]unix.PollFd{{Fd: int32(q.fd), Events: ev}, {Fd: int32(q.closeFd), Events: unix.POLLIN}}
		if _, err := eintr.Poll(pfds[:], DeviceCheck); err != nil {
			return os.NewSyscallError("poll", err)
		}
	}
}

// SetReadDeadline sets the deadline of Receive (the zero time: none); a waiting Receive
// sees the new one at once.
func (q *RawQueue) SetReadDeadline(t time.Time) error {
	if q.closed.Load() {
		return opErr("raw set deadline", q.ifname, os.ErrClosed)
	}
	if t.IsZero() {
		q.deadline.Store(nil)
	} else {
		q.deadline.Store(&t)
	}
	q.fdMu.RLock()
	if !q.closed.Load() {
		one := [8]byte{1}
		unix.Write(q.kickFd, one[:])
	}
	q.fdMu.RUnlock()
	return nil
}

// sockErr reads the socket's pending error (which the read clears): the kernel sets
// ENETDOWN when the device goes away.
func sockErr(fd int) error {
	e, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if e == 0 {
		return nil
	}
	return xskErrno("AF_XDP socket", unix.Errno(e))
}

// xskErrno turns an errno of the socket into an error: ENETDOWN (the device went away)
// and ENXIO (the socket is unbound since) match ErrNoDevice.
func xskErrno(what string, e unix.Errno) error {
	if e == unix.ENETDOWN || e == unix.ENXIO {
		return fmt.Errorf("%w: the interface went away: %w", ErrNoDevice, os.NewSyscallError(what, e))
	}
	return os.NewSyscallError(what, e)
}

// Get takes a free buffer of the region for a frame to send. When none is free it first
// takes the completed sends off the completion ring. The fill ring never takes the
// region's TxReserve, so with nothing in flight and no frame held Get finds a buffer.
// After Close it fails with os.ErrClosed, after the interface went away with ErrNoDevice.
func (q *RawQueue) Get() (memreg.Buf, error) {
	const op = "raw get buffer"
	if err := q.live(); err != nil {
		return memreg.Buf{}, opErr(op, q.ifname, err)
	}
	b, err := q.region.Get()
	if errors.Is(err, memreg.ErrExhausted) {
		q.txMu.Lock()
		if !q.closed.Load() {
			q.reap()
		}
		q.txMu.Unlock()
		b, err = q.region.Get()
	}
	return b, opErr(op, q.ifname, err)
}

// Send queues frames on the TX ring (each Buf is lent to the kernel until its completion,
// after which it returns to the region's free list) and kicks the kernel from the calling
// goroutine. It returns how many were queued: fewer than len(frames) when the TX ring is
// full (counted in TxRingFull; send the rest later). A frame must lie inside its buffer
// and be 14 to MTU+14 bytes long; the first bad frame stops Send with a *ValueError. It
// does not allocate.
func (q *RawQueue) Send(frames []Frame) (int, error) {
	const op = "raw send"
	q.txMu.Lock()
	defer q.txMu.Unlock()
	if err := q.live(); err != nil {
		return 0, opErr(op, q.ifname, err)
	}
	q.reap()
	room := min(int(q.tx.free()), len(q.txBufs))
	// Check the frames that fit, then lend their buffers under one lock of the region.
	m := 0
	var ferr error
	for _, f := range frames {
		if m == room {
			q.st.txRingFull.Add(uint64(len(frames) - m))
			break
		}
		if f.Buf.Region() != q.region {
			ferr = q.badFrame(f, "the buffer is not from the raw queue's region")
			break
		}
		if f.Len < 14 || f.Len > q.mtu+14 || f.Off < 0 || uint64(f.Off+f.Len) > q.bufSize {
			ferr = q.badFrame(f, "")
			break
		}
		q.txBufs[m] = f.Buf
		m++
	}
	n := 0
	for n < m {
		k, _ := q.region.LendBatch(q.txBufs[n:m], q.txLoans[n:m])
		if n += k; n == m {
			break
		}
		// What the batch could not lend (a shared buffer, a stale handle): Lend says.
		l, err := q.txBufs[n].Lend()
		if err != nil {
			ferr = err
			break
		}
		q.txLoans[n] = l
		n++
	}
	clear(q.txBufs[:m])
	var bytes uint64
	for i, l := range q.txLoans[:n] {
		f := frames[i]
		q.loans[l.Index()] = l
		d := q.tx.xdesc(q.tx.local + uint32(i))
		d.Addr = uint64(l.Index())*q.bufSize + uint64(f.Off)
		d.Len = uint32(f.Len)
		d.Options = 0
		bytes += uint64(f.Len)
	}
	clear(q.txLoans[:n])
	if n > 0 {
		q.tx.local += uint32(n)
		atomic.StoreUint32(q.tx.prod, q.tx.local)
		q.st.txFrames.Add(uint64(n))
		q.st.txBytes.Add(bytes)
	}
	kerr := q.noDevice(q.kick())
	if ferr == nil {
		ferr = kerr
	}
	return n, opErr(op, q.ifname, ferr)
}

// badFrame is the *ValueError of a frame Send refuses (off the hot path: it allocates).
func (q *RawQueue) badFrame(f Frame, why string) error {
	if why != "" {
		return &ValueError{"frame", f.Buf.Index(), why}
	}
	return &ValueError{"frame", fmt.Sprintf("off %d len %d", f.Off, f.Len), fmt.Sprintf("a frame is 14..%d bytes (MTU %d + Ethernet header) inside its %d-byte buffer", q.mtu+14, q.mtu, q.bufSize)}
}

// kick asks the kernel to transmit what is on the TX ring, with sendto(2) on the calling
// thread (in copy mode the kernel sends a batch of up to 32 frames per call: it is
// repeated while the kernel makes progress). txMu held.
func (q *RawQueue) kick() error {
	for range 1 << 12 {
		if q.tx.free() == q.tx.size {
			return nil
		}
		if q.mode.NeedWakeup && !q.tx.needWakeup() {
			return nil
		}
		before := atomic.LoadUint32(q.tx.cons)
		q.st.txKicks.Add(1)
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(q.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0, unix.EAGAIN, unix.EBUSY, unix.ENOBUFS:
		default:
			return xskErrno("sendto AF_XDP", e)
		}
		q.reap()
		if atomic.LoadUint32(q.tx.cons) == before && e != unix.EAGAIN {
			return nil // no progress: the next Send or Flush tries again
		}
	}
	return nil
}

// reap takes completed TX frames off the completion ring and returns their buffers.
// txMu held.
func (q *RawQueue) reap() int {
	n := int(q.comp.ready())
	if n == 0 {
		return 0
	}
	loans := q.reaped[:0]
	for i := range n {
		idx := *q.comp.addr(q.comp.local + uint32(i)) / q.bufSize
		if idx < uint64(len(q.loans)) {
			loans = append(loans, q.loans[idx])
			q.loans[idx] = memreg.Loan{}
		}
	}
	q.comp.local += uint32(n)
	atomic.StoreUint32(q.comp.cons, q.comp.local)
	q.region.ReturnBatch(loans)
	clear(loans)
	q.st.txCompleted.Add(uint64(n))
	return n
}

// Flush kicks the kernel for frames still on the TX ring and returns the buffers of
// completed ones. It returns how many frames are still in flight (queued or not yet
// completed). It does not allocate.
func (q *RawQueue) Flush() (int, error) {
	const op = "raw flush"
	q.txMu.Lock()
	defer q.txMu.Unlock()
	if err := q.live(); err != nil {
		return 0, opErr(op, q.ifname, err)
	}
	err := q.noDevice(q.kick())
	q.reap()
	inflight := int(q.st.txFrames.Load() - q.st.txCompleted.Load())
	return inflight, opErr(op, q.ifname, err)
}

// Stats reads the counters. After Close, or once the interface went away, it returns the
// queue's own counters with the error.
func (q *RawQueue) Stats() (RawQueueStats, error) {
	s := RawQueueStats{
		RxFrames: q.st.rxFrames.Load(), RxBytes: q.st.rxBytes.Load(),
		TxFrames: q.st.txFrames.Load(), TxBytes: q.st.txBytes.Load(), TxCompleted: q.st.txCompleted.Load(),
		TxRingFull: q.st.txRingFull.Load(), FillShort: q.st.fillShort.Load(),
		RxKicks: q.st.rxKicks.Load(), TxKicks: q.st.txKicks.Load(),
	}
	if err := q.live(); err != nil {
		return s, opErr("raw stats", q.ifname, err)
	}
	var ks unix.XDPStatistics
	var serr error
	err := rawConn{q}.Control(func(fd uintptr) {
		_, serr = xdpGetsockopt(int(fd), unix.XDP_STATISTICS, unsafe.Pointer(&ks), uintptr(sizeofXDPStatistics))
	})
	if err == nil && serr != nil {
		err = os.NewSyscallError("getsockopt XDP_STATISTICS", serr)
	}
	if err != nil {
		return s, opErr("raw stats", q.ifname, err)
	}
	s.RxDropped, s.RxInvalid, s.TxInvalid = ks.Rx_dropped, ks.Rx_invalid_descs, ks.Tx_invalid_descs
	s.RxRingFull, s.FillRingEmpty, s.TxRingEmptyDesc = ks.Rx_ring_full, ks.Rx_fill_ring_empty_descs, ks.Tx_ring_empty_descs
	return s, nil
}

// Close tears the queue down: its XSKMAP entry, its own steering program (a shared
// Steering stays), the socket (the kernel drops the UMEM registration with it) and the
// rings. Buffers on the fill and TX rings go back to the region's free list; received
// frames the application still holds stay valid until their Release. Close wakes a
// blocked Receive. It is idempotent and nil-safe; later calls of other methods fail with
// os.ErrClosed.
func (q *RawQueue) Close() error {
	if q == nil {
		return nil
	}
	q.closeOnce.Do(func() {
		q.closed.Store(true)
		q.closeErr = opErr("close raw queue", q.ifname, q.teardown())
		openRawQueues.Add(-1)
	})
	return q.closeErr
}

// teardown undoes open, whatever it got to; every step is tried.
func (q *RawQueue) teardown() error {
	var errl []error
	if q.steer != nil {
		if q.ownSteer {
			errl = append(errl, q.steer.Close())
		} else if err := q.steer.DeleteSocket(q.queue); err != nil && !errors.Is(err, bpf.ErrClosed) {
			errl = append(errl, err)
		}
		q.steer = nil
	}
	if q.closeFd >= 0 {
		// Wakes a waiting Receive or RawConn.Read/Write: it sees closed and lets go of its
		// lock. The eventfd stays readable until it is closed below.
		one := [8]byte{1}
		unix.Write(q.closeFd, one[:])
	}
	q.rxMu.Lock()
	q.txMu.Lock()
	q.fdMu.Lock()
	for _, p := range []*int{&q.fd, &q.closeFd, &q.kickFd} {
		if *p >= 0 {
			if err := unix.Close(*p); err != nil {
				errl = append(errl, os.NewSyscallError("close", err))
			}
			*p = -1
		}
	}
	for _, r := range []*ring{&q.fill, &q.comp, &q.rx, &q.tx} {
		r.unmap()
	}
	loans := q.loans
	q.loans = nil
	q.fdMu.Unlock()
	q.txMu.Unlock()
	q.rxMu.Unlock()
	for _, l := range loans {
		if l.Valid() {
			l.Return()
		}
	}
	return errors.Join(errl...)
}

// NewRawSteering attaches the raw-queue steering program to interface ifname of the
// network namespace netNS (an open descriptor; 0: the calling thread's), for several raw
// queues of the interface to share (RawQueueOptions.Steering). The caller closes it after
// the queues.
func NewRawSteering(ifname string, netNS int, o *bpf.RawSteeringOptions) (*bpf.RawSteering, error) {
	var s *bpf.RawSteering
	fn := func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrNoDevice, err)
		}
		s, err = bpf.NewRawSteering(ifi.Index, o)
		return err
	}
	var err error
	if netNS > 0 {
		err = netns.Do(netNS, fn)
	} else {
		err = fn()
	}
	return s, opErr("raw steering", ifname, err)
}
