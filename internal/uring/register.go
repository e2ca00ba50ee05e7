package uring

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RegisterBuffers registers iovecs as fixed buffers 0..len-1, with optional tags (one per
// buffer; a non-zero tag posts a CQE with that user_data when the buffer is finally released
// after unregistration or replacement). iovecs with Base 0 and Len 0 leave a sparse slot.
func (r *Ring) RegisterBuffers(iovecs []Iovec, tags []uint64) error {
	if len(iovecs) == 0 {
		return fmt.Errorf("uring: register 0 buffers: %w", unix.EINVAL)
	}
	if tags != nil && len(tags) != len(iovecs) {
		return fmt.Errorf("uring: %d tags for %d buffers: %w", len(tags), len(iovecs), unix.EINVAL)
	}
	escape(iovecs) // read through reg's addresses: never from a stack that may move
	escape(tags)
	reg := rsrcRegister{Nr: uint32(len(iovecs)), Data: uint64(uintptr(unsafe.Pointer(&iovecs[0])))}
	if tags != nil {
		reg.Tags = uint64(uintptr(unsafe.Pointer(&tags[0])))
	}
	_, err := register(r.fd, RegisterBuffers2, unsafe.Pointer(&reg), uint32(unsafe.Sizeof(reg)))
	runtime.KeepAlive(iovecs)
	runtime.KeepAlive(tags)
	return err
}

// RegisterBuffersSparse creates an empty fixed-buffer table of n slots, filled later with
// UpdateBuffers.
func (r *Ring) RegisterBuffersSparse(n uint32) error {
	reg := rsrcRegister{Nr: n, Flags: RsrcRegisterSparse}
	_, err := register(r.fd, RegisterBuffers2, unsafe.Pointer(&reg), uint32(unsafe.Sizeof(reg)))
	return err
}

// UpdateBuffers replaces fixed buffers off..off+len-1 (Base 0, Len 0 empties a slot).
func (r *Ring) UpdateBuffers(off uint32, iovecs []Iovec, tags []uint64) (int, error) {
	if len(iovecs) == 0 || (tags != nil && len(tags) != len(iovecs)) {
		return 0, fmt.Errorf("uring: update buffers: %w", unix.EINVAL)
	}
	escape(iovecs)
	escape(tags)
	up := rsrcUpdate2{Offset: off, Nr: uint32(len(iovecs)), Data: uint64(uintptr(unsafe.Pointer(&iovecs[0])))}
	if tags != nil {
		up.Tags = uint64(uintptr(unsafe.Pointer(&tags[0])))
	}
	n, err := register(r.fd, RegisterBuffersUpdate, unsafe.Pointer(&up), uint32(unsafe.Sizeof(up)))
	runtime.KeepAlive(iovecs)
	runtime.KeepAlive(tags)
	return n, err
}

// UnregisterBuffers drops the whole fixed-buffer table.
func (r *Ring) UnregisterBuffers() error {
	_, err := register(r.fd, UnregisterBuffers, nil, 0)
	return err
}

// RegisterFilesSparse creates a registered-file table of n empty slots.
func (r *Ring) RegisterFilesSparse(n uint32) error {
	reg := rsrcRegister{Nr: n, Flags: RsrcRegisterSparse}
	_, err := register(r.fd, RegisterFiles2, unsafe.Pointer(&reg), uint32(unsafe.Sizeof(reg)))
	return err
}

// UpdateFiles installs fds into slots off..off+len-1 (-1 empties a slot).
func (r *Ring) UpdateFiles(off uint32, fds []int32) (int, error) {
	if len(fds) == 0 {
		return 0, fmt.Errorf("uring: update files: %w", unix.EINVAL)
	}
	escape(fds)
	up := rsrcUpdate2{Offset: off, Nr: uint32(len(fds)), Data: uint64(uintptr(unsafe.Pointer(&fds[0])))}
	n, err := register(r.fd, RegisterFilesUpdate2, unsafe.Pointer(&up), uint32(unsafe.Sizeof(up)))
	runtime.KeepAlive(fds)
	return n, err
}

// UnregisterFiles drops the registered-file table.
func (r *Ring) UnregisterFiles() error {
	_, err := register(r.fd, UnregisterFiles, nil, 0)
	return err
}

// RegisterEventfd makes the kernel signal efd whenever a CQE is posted.
func (r *Ring) RegisterEventfd(efd int) error {
	v := int32(efd)
	_, err := register(r.fd, RegisterEventfd, unsafe.Pointer(&v), 1)
	return err
}

// UnregisterEventfd removes the eventfd.
func (r *Ring) UnregisterEventfd() error {
	_, err := register(r.fd, UnregisterEventfd, nil, 0)
	return err
}

// RegisterRingFd registers the ring fd with the calling task so io_uring_enter skips the fd
// lookup. The registration belongs to the OS thread's task: call it only from a goroutine
// locked to its thread (runtime.LockOSThread), which must stay the ring's only user.
func (r *Ring) RegisterRingFd() error {
	up := rsrcUpdate{Offset: ^uint32(0), Data: uint64(r.fd)}
	n, err := register(r.fd, RegisterRingFds, unsafe.Pointer(&up), 1)
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("uring: register ring fd: kernel registered %d", n)
	}
	r.enterFd = int(up.Offset)
	r.enterFlags |= EnterRegisteredRing
	return nil
}

// UnregisterRingFd undoes RegisterRingFd (from the same thread).
func (r *Ring) UnregisterRingFd() error {
	if r.enterFlags&EnterRegisteredRing == 0 {
		return nil
	}
	up := rsrcUpdate{Offset: uint32(r.enterFd)}
	if _, err := register(r.fd, UnregisterRingFds, unsafe.Pointer(&up), 1); err != nil {
		return err
	}
	r.enterFd = r.fd
	r.enterFlags &^= EnterRegisteredRing
	return nil
}

// Probe is the set of opcodes this kernel supports (IORING_REGISTER_PROBE).
type Probe struct {
	LastOp uint8
	ops    [256]bool
}

// Supports reports whether op is supported.
func (p *Probe) Supports(op uint8) bool { return p != nil && p.ops[op] }

// Probe asks the kernel which opcodes it supports.
func (r *Ring) Probe() (*Probe, error) {
	const n = 256
	buf := make([]byte, unsafe.Sizeof(probeHdr{})+n*unsafe.Sizeof(probeOp{}))
	if _, err := register(r.fd, RegisterProbe, unsafe.Pointer(&buf[0]), n); err != nil {
		return nil, err
	}
	hdr := (*probeHdr)(unsafe.Pointer(&buf[0]))
	ops := unsafe.Slice((*probeOp)(unsafe.Pointer(&buf[unsafe.Sizeof(probeHdr{})])), n)
	p := &Probe{LastOp: hdr.LastOp}
	for i := 0; i < int(hdr.OpsLen) && i < n; i++ {
		if ops[i].Flags&opSupported != 0 {
			p.ops[ops[i].Op] = true
		}
	}
	return p, nil
}

// Capabilities is what this kernel and process can do with io_uring, decided by probing.
type Capabilities struct {
	Err        error  // why io_uring cannot be used at all (nil when it can)
	Features   uint32 // Feat* word
	Probe      *Probe
	SetupFlags uint32 // setup flags (and combinations) that were accepted, see DetectCapabilities
	// RecvMultishotLimit: a multishot RECV takes a limit on its total bytes in the SQE's
	// optlen (PrepRecvMultishotLimit; Linux 6.17+, EINVAL before): it ends, without
	// CQEFMore, once that many bytes were delivered. Probed on a socket pair.
	RecvMultishotLimit bool
}

// Has reports whether every bit of feat is in the kernel's feature word.
func (c *Capabilities) Has(feat uint32) bool { return c.Err == nil && c.Features&feat == feat }

// SetupOK reports whether the setup flags were accepted when probed.
func (c *Capabilities) SetupOK(flags uint32) bool { return c.Err == nil && c.SetupFlags&flags == flags }

var (
	capsMu sync.Mutex
	caps   *Capabilities
)

// DetectCapabilities probes io_uring once per process (later calls return the cached answer):
// whether a ring can be set up at all, the feature word, the opcode probe, and which of the
// setup flags zcnet uses are accepted. Reprobe refreshes the answer.
func DetectCapabilities() *Capabilities {
	capsMu.Lock()
	defer capsMu.Unlock()
	if caps == nil {
		caps = detect()
	}
	return caps
}

// Reprobe probes again (io_uring may have been enabled or disabled since, by sysctl or a
// seccomp filter) and caches the new answer.
func Reprobe() *Capabilities {
	c := detect()
	capsMu.Lock()
	caps = c
	capsMu.Unlock()
	return c
}

func detect() *Capabilities {
	c := &Capabilities{}
	r, err := New(2, nil)
	if err != nil {
		c.Err = err
		return c
	}
	c.Features = r.Features()
	c.Probe, err = r.Probe()
	r.Close()
	if err != nil {
		c.Err = err
		return c
	}
	for _, f := range []uint32{
		SetupSingleIssuer | SetupDeferTaskrun,
		SetupCoopTaskrun | SetupTaskrunFlag,
		SetupNoSQArray,
		SetupCQE32,
		SetupSQE128,
		SetupSQPoll | SetupSQAff,
		SetupSubmitAll,
	} {
		t, err := New(2, &Options{Flags: f})
		if err == nil {
			t.Close()
			c.SetupFlags |= f
		}
	}
	c.RecvMultishotLimit = probeRecvMultishotLimit()
	return c
}

// probeRecvMultishotLimit arms a multishot RECV limited to 4 bytes in all on a socket pair
// holding 16, with two buffers to pick from: true when it delivers and ends (no CQEFMore)
// although a buffer is left, false on EINVAL (older kernels refuse a non-zero
// optlen/file_index) or anything else. (Without bundles the kernel checks the limit after a
// receive: this one brings all 16 bytes. With bundles the limit caps the receive itself.)
func probeRecvMultishotLimit() bool {
	r, err := New(4, nil)
	if err != nil {
		return false
	}
	defer r.Close()
	// Mapped, never Go heap: the kernel may write it until the ring is closed (unmapped
	// after the Close above, deferred later so it runs first).
	buf, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return false
	}
	defer unix.Munmap(buf)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	br, err := r.RegisterBufRing(2, 1, 0)
	if err != nil {
		return false
	}
	defer br.Close()
	br.Add(uintptr(unsafe.Pointer(&buf[0])), 32, 0, 0)
	br.Add(uintptr(unsafe.Pointer(&buf[32])), 32, 1, 1)
	br.Advance(2)
	if _, err := unix.Write(fds[1], make([]byte, 16)); err != nil {
		return false
	}
	sqe := r.GetSQE()
	sqe.PrepRecvMultishotLimit(int32(fds[0]), 1, false, 4)
	sqe.UserData = 1
	if _, err := r.Submit(); err != nil {
		return false
	}
	cqe, err := r.WaitCQETimeout(time.Second)
	return err == nil && cqe.UserData == 1 && cqe.Res > 0 && !cqe.More()
}

// NeedOp returns nil if op is supported, or an error wrapping ErrNotSupported naming it.
func (c *Capabilities) NeedOp(op uint8, name, minKernel string) error {
	if c.Err != nil {
		return c.Err
	}
	if !c.Probe.Supports(op) {
		return fmt.Errorf("io_uring %s (Linux %s+): %w", name, minKernel, ErrNotSupported)
	}
	return nil
}

// BufRing is a provided-buffer ring (IORING_REGISTER_PBUF_RING) in mmap'd memory: the
// application adds buffers at the tail, the kernel picks them for recvs with buffer select.
type BufRing struct {
	ring    *Ring
	mem     []byte
	entries uint32
	mask    uint32
	bgid    uint16
	tail    uint32 // local tail (the kernel sees the low 16 bits once Advance publishes it)
	closed  bool
}

var openBufRings atomic.Int64

// OpenBufRings returns how many BufRings this process has registered; tests use it for leaks.
func OpenBufRings() int64 { return openBufRings.Load() }

// RegisterBufRing creates and registers a provided-buffer ring of entries (a power of two, at
// most 32768) slots for buffer group bgid. flags may hold PbufRingInc (incremental
// consumption: one buffer serves several recvs, CQEFBufMore says it is not finished).
func (r *Ring) RegisterBufRing(entries uint32, bgid uint16, flags uint16) (*BufRing, error) {
	if entries == 0 || entries > 32768 || entries&(entries-1) != 0 {
		return nil, fmt.Errorf("uring: buffer ring of %d entries (need a power of two <= 32768): %w", entries, unix.EINVAL)
	}
	if flags&PbufRingMmap != 0 {
		return nil, fmt.Errorf("uring: kernel-allocated buffer rings are not used by zcnet: %w", unix.EINVAL)
	}
	size := int(entries) * int(unsafe.Sizeof(bufEntry{}))
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, os.NewSyscallError("mmap(buffer ring)", err)
	}
	reg := bufReg{RingAddr: uint64(uintptr(unsafe.Pointer(&mem[0]))), RingEntries: entries, Bgid: bgid, Flags: flags}
	if _, err := register(r.fd, RegisterPbufRing, unsafe.Pointer(&reg), 1); err != nil {
		unix.Munmap(mem)
		if errors.Is(err, unix.EINVAL) && flags&PbufRingInc != 0 {
			return nil, fmt.Errorf("%w (incremental buffer rings need Linux 6.12+: %w)", err, ErrNotSupported)
		}
		return nil, err
	}
	openBufRings.Add(1)
	return &BufRing{ring: r, mem: mem, entries: entries, mask: entries - 1, bgid: bgid}, nil
}

// Group returns the buffer group id.
func (b *BufRing) Group() uint16 { return b.bgid }

// Entries returns the ring size.
func (b *BufRing) Entries() uint32 { return b.entries }

// Add writes buffer bid (addr, length) into the slot offset places after the local tail. It is
// not visible to the kernel until Advance.
func (b *BufRing) Add(addr uintptr, length uint32, bid uint16, offset int) {
	e := (*bufEntry)(unsafe.Pointer(&b.mem[uintptr((b.tail+uint32(offset))&b.mask)*unsafe.Sizeof(bufEntry{})]))
	e.Addr = uint64(addr)
	e.Len = length
	e.Bid = bid
}

// Advance publishes count added buffers to the kernel.
func (b *BufRing) Advance(count int) {
	b.tail += uint32(count)
	// The 16-bit tail overlays entry 0's resv field, right after entry 0's bid. Go has no 16-bit
	// atomic store, so store the aligned 32-bit word (bid0 | tail<<16) atomically; bid0 is
	// ours and is rewritten unchanged, so the kernel never sees a torn value.
	w := (*uint32)(unsafe.Pointer(&b.mem[12]))
	bid0 := uint32(*(*uint16)(unsafe.Pointer(&b.mem[12])))
	atomic.StoreUint32(w, bid0|uint32(uint16(b.tail))<<16)
}

// Close unregisters the ring and unmaps it. Recvs still armed on this group end with ENOBUFS.
func (b *BufRing) Close() error {
	if b == nil || b.closed {
		return os.ErrClosed
	}
	b.closed = true
	reg := bufReg{Bgid: b.bgid}
	var err error
	if !b.ring.closed {
		_, err = register(b.ring.fd, UnregisterPbufRing, unsafe.Pointer(&reg), 1)
	}
	unix.Munmap(b.mem)
	b.mem = nil
	openBufRings.Add(-1)
	return err
}
