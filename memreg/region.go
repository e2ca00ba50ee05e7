package memreg

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
)

var (
	// ErrStale: the handle no longer owns its buffer (released, or lent to the kernel).
	ErrStale = errors.New("memreg: stale buffer handle")
	// ErrExhausted: every buffer of the region is in use.
	ErrExhausted = errors.New("memreg: no free buffer in region")
	// ErrBusy: the region still has buffers lent to the kernel or registrations.
	ErrBusy = errors.New("memreg: region busy")
	// ErrNotSupported: hugepages were required but are not available.
	// It is the one sentinel every zcnet package shares.
	ErrNotSupported = errs.ErrNotSupported
	// ErrClosed: the region was closed.
	ErrClosed = fmt.Errorf("memreg: region closed: %w", errs.ErrClosed)
)

// State is a buffer's owner.
type State uint8

const (
	Free State = iota
	Held
	Kernel
	// Shared: several owners at once (Buf.Share): the application's handles and Refs, and
	// loans for sends in flight; the buffer goes back when the last of them lets go.
	Shared
)

func (s State) String() string {
	switch s {
	case Free:
		return "free"
	case Held:
		return "held"
	case Kernel:
		return "kernel"
	case Shared:
		return "shared"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Options describe a region.
type Options struct {
	BufSize int // bytes per buffer (> 0)
	Count   int // number of buffers (> 0)
	// HugePages asks for MAP_HUGETLB 2 MiB pages. When none are available the region falls back
	// to normal pages with MADV_HUGEPAGE (transparent hugepages), visible in Info, unless
	// RequireHugePages is set, in which case New fails with ErrNotSupported.
	HugePages        bool
	RequireHugePages bool
	// Dmabuf backs the region with a memfd exported as a dmabuf through /dev/udmabuf
	// (CONFIG_UDMABUF): the application maps the memory as usual and the kernel names it by
	// a dmabuf fd (DmabufFd), for zcrx areas and netdev bind-rx/bind-tx on NICs that can DMA
	// into it. Without /dev/udmabuf New fails with ErrNotSupported.
	Dmabuf bool
}

// Info describes what a region actually got.
type Info struct {
	Size     int    // mapped bytes
	HugeTLB  bool   // backed by MAP_HUGETLB pages
	Fallback string // why hugepages were not used, when they were asked for
	Dmabuf   bool   // backed by a memfd exported as a dmabuf (Options.Dmabuf)
}

// Region is mmap'd memory split into Count buffers of BufSize bytes.
type Region struct {
	mem     []byte
	base    uintptr
	bufSize int
	count   int
	info    Info

	mu    sync.Mutex
	state []State
	gen   []uint32
	// tag mirrors (gen<<8 | state) of each buffer for lock-free readers (Buf.Valid, Bytes):
	// written with state and gen, under mu (pub)
	tag []atomic.Uint64
	// gone mirrors unmapped for lock-free readers
	gone   atomic.Bool
	free   []int32
	lent   int
	held   int  // buffers in the application's hands
	closed bool // no more Get/Lend/Provide
	// unmapped: the memory is gone. A region closed while the application still holds
	// buffers stays mapped until the last of them is released (CloseWhenReleased).
	unmapped bool
	kernRefs int    // kernel tables that refer to the memory (holdForKernel)
	pool     *Pool  // the pool the region belongs to, if any
	onFree   func() // called (unlocked) when a buffer returns to the free list
	// scrub, when set, runs (locked) on a buffer's memory as it returns to the free list, and
	// once on the whole region (PoolOptions.Scrub); keepMapped: never unmap, release the
	// pages instead (PoolOptions.KeepMapped)
	scrub      func([]byte)
	keepMapped bool

	// shares: the shared buffers' owners (shared.go), nil until the first Share
	shares map[int32]*share

	// recycle, when set, takes buffers the application releases instead of the free list
	// (receive buffers go back to their provided-buffer ring). It runs with mu not held.
	recycle func(idx int)

	// memfd and dmabuf are the fds of a dmabuf-backed region (-1 otherwise).
	memfd, dmabuf int
}

var openRegions atomic.Int64

// OpenRegions returns how many regions are mapped; tests use it to find leaks.
func OpenRegions() int64 { return openRegions.Load() }

const hugePage = 2 << 20

// New maps a region.
func New(opt Options) (*Region, error) {
	if opt.BufSize <= 0 || opt.Count <= 0 {
		return nil, fmt.Errorf("memreg: buffer size %d, count %d: both must be > 0: %w", opt.BufSize, opt.Count, unix.EINVAL)
	}
	if opt.Count > 1<<24 || opt.BufSize > 1<<30 || opt.BufSize*opt.Count/opt.Count != opt.BufSize {
		return nil, fmt.Errorf("memreg: %d buffers of %d bytes is too large: %w", opt.Count, opt.BufSize, unix.EINVAL)
	}
	want := opt.BufSize * opt.Count
	page := os.Getpagesize()
	size := (want + page - 1) &^ (page - 1)
	var mem []byte
	var err error
	info := Info{}
	memfd, dmabuf := -1, -1
	if opt.Dmabuf {
		var dm dmabufMem
		dm, err = newDmabufMem(want, opt.HugePages || opt.RequireHugePages)
		if err != nil {
			return nil, err
		}
		if opt.RequireHugePages && !dm.huge {
			dm.close()
			return nil, fmt.Errorf("memreg: dmabuf region of %d bytes: %w", want, errs.NotSupported("huge pages", "reserved pages: /proc/sys/vm/nr_hugepages", dm.hugeErr))
		}
		mem, memfd, dmabuf, size = dm.mem, dm.memfd, dm.dmabuf, len(dm.mem)
		info.HugeTLB, info.Dmabuf = dm.huge, true
		if (opt.HugePages || opt.RequireHugePages) && !dm.huge {
			info.Fallback = fmt.Sprintf("MFD_HUGETLB failed (%v); using normal pages", dm.hugeErr)
		}
	} else if opt.HugePages || opt.RequireHugePages {
		hsize := (want + hugePage - 1) &^ (hugePage - 1)
		mem, err = unix.Mmap(-1, 0, hsize, unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB|unix.MAP_POPULATE)
		if err == nil {
			info.HugeTLB = true
			size = hsize
		} else {
			if opt.RequireHugePages {
				return nil, fmt.Errorf("memreg: MAP_HUGETLB of %d bytes: %w", hsize, errs.NotSupported("huge pages", "reserved pages: /proc/sys/vm/nr_hugepages", err))
			}
			info.Fallback = fmt.Sprintf("MAP_HUGETLB failed (%v); using normal pages with MADV_HUGEPAGE", err)
			mem = nil
		}
	}
	if mem == nil && !opt.Dmabuf {
		mem, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, fmt.Errorf("memreg: mmap %d bytes: %w", size, os.NewSyscallError("mmap", err))
		}
		if opt.HugePages {
			unix.Madvise(mem, unix.MADV_HUGEPAGE) // advisory: THP may be off
		}
		// Fault the pages in now, so registration and first use do not pay for it.
		for i := 0; i < len(mem); i += page {
			mem[i] = 0
		}
	}
	info.Size = size
	r := &Region{
		mem: mem, base: uintptr(unsafe.Pointer(&mem[0])), bufSize: opt.BufSize, count: opt.Count, info: info,
		state: make([]State, opt.Count), gen: make([]uint32, opt.Count), tag: make([]atomic.Uint64, opt.Count),
		free:  make([]int32, opt.Count),
		memfd: memfd, dmabuf: dmabuf,
	}
	for i := range r.free {
		r.free[i] = int32(opt.Count - 1 - i) // pop from the end: buffer 0 first
	}
	openRegions.Add(1)
	return r, nil
}

// Info reports how the region is backed.
func (r *Region) Info() Info { return r.info }

// BufSize returns the size of each buffer.
func (r *Region) BufSize() int { return r.bufSize }

// Count returns the number of buffers.
func (r *Region) Count() int { return r.count }

// Base returns the address of buffer 0.
func (r *Region) Base() uintptr { return r.base }

// Addr returns the address of buffer idx.
func (r *Region) Addr(idx int) uintptr { return r.base + uintptr(idx)*uintptr(r.bufSize) }

// Contains reports whether [addr, addr+n) lies inside the region.
func (r *Region) Contains(addr uintptr, n int) bool {
	return addr >= r.base && n >= 0 && addr-r.base <= uintptr(len(r.mem)) && uintptr(n) <= uintptr(len(r.mem))-(addr-r.base)
}

// slice returns buffer idx's bytes.
func (r *Region) slice(idx int) []byte {
	o := idx * r.bufSize
	return r.mem[o : o+r.bufSize : o+r.bufSize]
}

// Buf is a handle on one buffer. The zero Buf is invalid.
type Buf struct {
	r   *Region
	idx int32
	gen uint32
}

// Get hands a free buffer to the application.
func (r *Region) Get() (Buf, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return Buf{}, ErrClosed
	}
	n := len(r.free)
	if n == 0 {
		return Buf{}, ErrExhausted
	}
	idx := r.free[n-1]
	r.free = r.free[:n-1]
	r.state[idx] = Held
	r.pub(idx)
	r.held++
	return Buf{r: r, idx: idx, gen: r.gen[idx]}, nil
}

// Held returns how many buffers the application holds.
func (r *Region) Held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held
}

// Pool returns the pool the region belongs to (nil for a region made with New).
func (r *Region) Pool() *Pool { return r.pool }

// Free returns how many buffers are free.
func (r *Region) Free() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.free)
}

// Lent returns how many buffers are lent to the kernel.
func (r *Region) Lent() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lent
}

func (b Buf) check() error {
	if b.r == nil {
		return ErrStale
	}
	// A handle that no longer owns its buffer is stale, whether or not the region is still
	// mapped (a second Release after the owner closed is ErrStale, as before it).
	switch b.r.state[b.idx] {
	case Held:
		if b.r.gen[b.idx] != b.gen {
			return ErrStale
		}
	case Shared:
		if sh := b.r.shares[b.idx]; !sh.base || sh.baseGen != b.gen {
			return ErrStale
		}
	default:
		return ErrStale
	}
	if b.r.unmapped {
		return ErrClosed
	}
	return nil
}

// Valid reports whether the handle still owns its buffer.
func (b Buf) Valid() bool {
	if b.r == nil {
		return false
	}
	// The owner's common case without the lock: its buffer is held under its generation
	// and mapped. Everything else (shared buffers, stale handles) takes the lock.
	if b.r.tag[b.idx].Load() == uint64(b.gen)<<8|uint64(Held) && !b.r.gone.Load() {
		return true
	}
	b.r.mu.Lock()
	defer b.r.mu.Unlock()
	return b.check() == nil
}

// Bytes returns the buffer's memory, or nil when the handle is stale. The slice must not be
// used after Release or after the buffer was passed to a send.
func (b Buf) Bytes() []byte {
	if !b.Valid() {
		return nil
	}
	return b.r.slice(int(b.idx))
}

// pub publishes buffer idx's generation and state to lock-free readers (mu held): every
// change of r.state or r.gen is followed by it.
func (r *Region) pub(i int32) {
	idx := int(i)
	r.tag[idx].Store(uint64(r.gen[idx])<<8 | uint64(r.state[idx]))
}

// Index returns the buffer's index in its region.
func (b Buf) Index() int { return int(b.idx) }

// Region returns the region the buffer belongs to.
func (b Buf) Region() *Region { return b.r }

// Addr returns the buffer's address.
func (b Buf) Addr() uintptr {
	if b.r == nil {
		return 0
	}
	return b.r.Addr(int(b.idx))
}

// Release gives the buffer back. Afterwards the handle is stale.
func (b Buf) Release() error {
	if b.r == nil {
		return ErrStale
	}
	r := b.r
	r.mu.Lock()
	if err := b.check(); err != nil {
		r.mu.Unlock()
		return err
	}
	if r.state[b.idx] == Shared {
		r.shares[b.idx].base = false
		r.dropOwner(b.idx) // unlocks
		return nil
	}
	r.gen[b.idx]++
	r.pub(b.idx)
	r.held--
	if r.recycle != nil && !r.closed {
		r.state[b.idx] = Kernel
		r.pub(b.idx)
		r.lent++
		r.mu.Unlock()
		r.recycle(int(b.idx))
		return nil
	}
	r.freeLocked(b.idx)
	r.unmapIfDoneLocked()
	onFree := r.onFree
	r.mu.Unlock()
	if onFree != nil {
		onFree()
	}
	return nil
}

// Lend moves the buffer from the application to the kernel (a send is about to be submitted).
// The handle becomes stale; the returned Loan is what comes back with Return.
func (b Buf) Lend() (Loan, error) {
	l, _, err := b.lendShared()
	return l, err
}

// lendShared is Lend that also reports whether the loan is one owner of a shared buffer
// (what Shared would have said just before), under one lock: a send of a received buffer
// asks both.
func (b Buf) lendShared() (Loan, bool, error) {
	if b.r == nil {
		return Loan{}, false, ErrStale
	}
	r := b.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := b.check(); err != nil {
		return Loan{}, false, err
	}
	if r.closed {
		return Loan{}, false, ErrClosed
	}
	if sh := r.shares[b.idx]; r.state[b.idx] == Shared {
		sh.base = false // the handle's ownership becomes the loan's
		sh.loans++
		return Loan{r: r, idx: b.idx, gen: r.gen[b.idx]}, true, nil
	}
	r.gen[b.idx]++
	r.state[b.idx] = Kernel
	r.pub(b.idx)
	r.held--
	r.lent++
	return Loan{r: r, idx: b.idx, gen: r.gen[b.idx]}, false, nil
}

// Loan is a buffer in the kernel's hands.
type Loan struct {
	r   *Region
	idx int32
	gen uint32
}

// Index returns the lent buffer's index.
func (l Loan) Index() int { return int(l.idx) }

// Addr returns the lent buffer's address.
func (l Loan) Addr() uintptr { return l.r.Addr(int(l.idx)) }

// Region returns the loan's region.
func (l Loan) Region() *Region { return l.r }

func (l Loan) settle(to State) (Buf, error) {
	if l.r == nil {
		return Buf{}, ErrStale
	}
	if r := l.r; true {
		r.mu.Lock()
		if r.state[l.idx] == Shared {
			sh := r.shares[l.idx]
			if r.gen[l.idx] != l.gen || sh.loans <= 0 {
				r.mu.Unlock()
				return Buf{}, ErrStale
			}
			// One owner of a shared buffer: the buffer itself goes back with the last one
			// (a shared buffer cannot be reclaimed: others may still read it).
			sh.loans--
			r.dropOwner(l.idx) // unlocks
			if to == Held {
				return Buf{}, ErrStale
			}
			return Buf{}, nil
		}
		r.mu.Unlock()
	}
	b, freed, err := l.settleLocked(to)
	if freed && l.r.onFree != nil {
		l.r.onFree() // after the unlock: it may take buffers from this region
	}
	return b, err
}

func (l Loan) settleLocked(to State) (b Buf, freed bool, err error) {
	r := l.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state[l.idx] != Kernel || r.gen[l.idx] != l.gen {
		return Buf{}, false, ErrStale
	}
	r.gen[l.idx]++
	r.pub(l.idx)
	if to == Free && r.recycle != nil && !r.closed {
		// A recycled region's buffers go back to their provider, still lent.
		r.mu.Unlock()
		r.recycle(int(l.idx))
		r.mu.Lock()
		return Buf{}, false, nil
	}
	r.lent--
	if to == Held && r.closed {
		to = Free
	}
	r.state[l.idx] = to
	r.pub(l.idx)
	if to == Free {
		r.free = append(r.free, l.idx)
		r.scrubFreedLocked(l.idx)
		r.unmapIfDoneLocked()
		return Buf{}, true, nil
	}
	r.held++
	return Buf{r: r, idx: l.idx, gen: r.gen[l.idx]}, false, nil
}

// Return is called when the kernel released the buffer (for a zero-copy send: its
// notification). The buffer goes back to the free list, or to the recycler of a region that
// has one (a receive buffer forwarded by a send goes back to its provided-buffer ring).
func (l Loan) Return() error {
	_, err := l.settle(Free)
	return err
}

// Reclaim is like Return but hands the buffer straight back to the application (a copying send
// completed and the caller wants to reuse the same buffer).
func (l Loan) Reclaim() (Buf, error) { return l.settle(Held) }

// provide lends free buffers to the kernel for receiving: up to n buffers are taken from the
// free list and passed to fn with their loans (fn adds them to a provided-buffer ring). It
// returns how many were provided.
func (r *Region) provide(n int, fn func(l Loan)) int {
	r.mu.Lock()
	var loans []Loan
	for len(loans) < n && len(r.free) > 0 && !r.closed {
		k := len(r.free) - 1
		idx := r.free[k]
		r.free = r.free[:k]
		r.gen[idx]++
		r.state[idx] = Kernel
		r.pub(idx)
		r.lent++
		loans = append(loans, Loan{r: r, idx: idx, gen: r.gen[idx]})
	}
	r.mu.Unlock()
	for _, l := range loans {
		fn(l)
	}
	return len(loans)
}

// provideTo is provide without a callback and without allocating: it lends up to
// len(loans) free buffers to the kernel, leaving at least keep buffers on the free list, and
// writes their loans to loans. It returns how many it lent (0 on a closed region).
func (r *Region) provideTo(loans []Loan, keep int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for n < len(loans) && len(r.free) > keep && !r.closed {
		k := len(r.free) - 1
		idx := r.free[k]
		r.free = r.free[:k]
		r.gen[idx]++
		r.state[idx] = Kernel
		r.pub(idx)
		r.lent++
		loans[n] = Loan{r: r, idx: idx, gen: r.gen[idx]}
		n++
	}
	return n
}

// received turns a buffer the kernel filled (provided-buffer ring id idx) into a handle the
// application borrows; its Release goes to the recycler set with setRecycler.
func (r *Region) received(idx int) (Buf, error) {
	if idx < 0 || idx >= r.count {
		return Buf{}, fmt.Errorf("memreg: buffer id %d outside region of %d: %w", idx, r.count, ErrStale)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state[idx] != Kernel {
		return Buf{}, fmt.Errorf("memreg: buffer %d is %v, not in the kernel: %w", idx, r.state[idx], ErrStale)
	}
	r.gen[idx]++
	r.pub(int32(idx))
	r.lent--
	r.held++
	r.state[idx] = Held
	r.pub(int32(idx))
	return Buf{r: r, idx: int32(idx), gen: r.gen[idx]}, nil
}

// receivedBatch is received for several buffers under one lock: out[i] becomes the handle
// of buffer idx[i]. It stops at the first index that is out of range or not in the
// kernel's hands and returns how many it turned into handles, with that error.
func (r *Region) receivedBatch(idx []int, out []Buf) (int, error) {
	n := min(len(idx), len(out))
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, id := range idx[:n] {
		if id < 0 || id >= r.count {
			return i, fmt.Errorf("memreg: buffer id %d outside region of %d: %w", id, r.count, ErrStale)
		}
		if r.state[id] != Kernel {
			return i, fmt.Errorf("memreg: buffer %d is %v, not in the kernel: %w", id, r.state[id], ErrStale)
		}
		r.gen[id]++
		r.lent--
		r.held++
		r.state[id] = Held
		r.pub(int32(id))
		out[i] = Buf{r: r, idx: int32(id), gen: r.gen[id]}
	}
	return n, nil
}

// ReleaseBatch releases several buffers of this region under one lock, as Release does each
// (a buffer of another region, a shared one, or any buffer of a region with a recycler goes
// through Release itself). Every buffer is tried; the first error is returned (a stale
// handle's ErrStale: it released nothing).
func (r *Region) ReleaseBatch(bufs []Buf) error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	r.mu.Lock()
	freed := false
	for _, b := range bufs {
		if b.r != r || r.recycle != nil || (b.r != nil && r.state[b.idx] == Shared) {
			r.mu.Unlock()
			if err := b.Release(); err != nil {
				keep(err)
			}
			r.mu.Lock()
			continue
		}
		if err := b.check(); err != nil {
			keep(err)
			continue
		}
		r.gen[b.idx]++
		r.held--
		r.freeLocked(b.idx)
		freed = true
	}
	r.unmapIfDoneLocked()
	onFree := r.onFree
	r.mu.Unlock()
	if freed && onFree != nil {
		onFree()
	}
	return first
}

// LendBatch is Lend for several buffers of this region under one lock: loans[i] becomes
// the loan of bufs[i]. It stops at the first buffer it cannot lend (a stale handle, another
// region's, a shared one: lend those with Lend) and returns how many it lent, with that
// error.
func (r *Region) LendBatch(bufs []Buf, loans []Loan) (int, error) {
	n := min(len(bufs), len(loans))
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, ErrClosed
	}
	for i, b := range bufs[:n] {
		if b.r != r {
			return i, ErrStale
		}
		if err := b.check(); err != nil {
			return i, err
		}
		if r.state[b.idx] == Shared {
			return i, fmt.Errorf("memreg: buffer %d is shared: lend it with Lend: %w", b.idx, ErrStale)
		}
		r.gen[b.idx]++
		r.state[b.idx] = Kernel
		r.pub(b.idx)
		r.held--
		r.lent++
		loans[i] = Loan{r: r, idx: b.idx, gen: r.gen[b.idx]}
	}
	return n, nil
}

// ReturnBatch is Return for several loans of this region under one lock (a loan of another
// region, a shared buffer's, or any loan of a region with a recycler goes through Return
// itself). Every loan is tried; the first error is returned.
func (r *Region) ReturnBatch(loans []Loan) error {
	var first error
	r.mu.Lock()
	freed := false
	for _, l := range loans {
		if l.r != r || r.recycle != nil || (l.r != nil && r.state[l.idx] == Shared) {
			r.mu.Unlock()
			if err := l.Return(); err != nil && first == nil {
				first = err
			}
			r.mu.Lock()
			continue
		}
		if r.state[l.idx] != Kernel || r.gen[l.idx] != l.gen {
			if first == nil {
				first = ErrStale
			}
			continue
		}
		r.gen[l.idx]++
		r.lent--
		r.freeLocked(l.idx)
		freed = true
	}
	r.unmapIfDoneLocked()
	onFree := r.onFree
	r.mu.Unlock()
	if freed && onFree != nil {
		onFree()
	}
	return first
}

// freeLocked puts buffer idx on the free list (its state Free, published, scrubbed when the
// region scrubs). r.mu is held.
func (r *Region) freeLocked(idx int32) {
	r.state[idx] = Free
	r.pub(idx)
	r.free = append(r.free, idx)
	r.scrubFreedLocked(idx)
}

// scrubFreedLocked scrubs a buffer that just went to the free list, when the region scrubs
// and is still mapped. r.mu is held.
func (r *Region) scrubFreedLocked(idx int32) {
	if r.scrub != nil && !r.unmapped {
		r.scrub(r.slice(int(idx)))
	}
}

// setRecycler makes released buffers go to fn (with the buffer lent to the kernel again)
// instead of the free list. Used for receive regions feeding a provided-buffer ring.
func (r *Region) setRecycler(fn func(idx int)) { r.recycle = fn }

// StateOf returns buffer idx's state (for tests and diagnostics).
func (r *Region) StateOf(idx int) State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state[idx]
}

// Close unmaps the region. It refuses with ErrBusy while buffers are lent to the kernel or a
// kernel table of its owner holds the region (the owner's rings keep it until they close).
// A second Close returns ErrClosed.
func (r *Region) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if r.lent > 0 {
		return fmt.Errorf("memreg: close with %d buffers lent to the kernel: %w", r.lent, ErrBusy)
	}
	if r.kernRefs > 0 {
		return fmt.Errorf("memreg: close while registered with %d kernel tables: %w", r.kernRefs, ErrBusy)
	}
	if r.held > 0 {
		return fmt.Errorf("memreg: close with %d buffers held by the application: %w", r.held, ErrBusy)
	}
	r.closed = true
	r.unmapLocked()
	return nil
}

func (r *Region) unmapLocked() {
	if r.unmapped {
		return
	}
	r.unmapped = true
	r.gone.Store(true)
	if r.keepMapped {
		// A slice kept past Release stays writable (into pages given back to the system)
		// instead of faulting: the mapping's address range is never reused.
		unix.Madvise(r.mem, unix.MADV_DONTNEED)
	} else {
		unix.Munmap(r.mem)
	}
	r.mem = nil
	if r.dmabuf >= 0 {
		unix.Close(r.dmabuf)
		unix.Close(r.memfd)
		r.dmabuf, r.memfd = -1, -1
	}
	openRegions.Add(-1)
}

// unmapIfDoneLocked unmaps a region closed with CloseWhenReleased once nothing is held or lent.
func (r *Region) unmapIfDoneLocked() {
	if r.closed && !r.unmapped && r.held == 0 && r.lent == 0 && r.kernRefs == 0 {
		r.unmapLocked()
	}
}

// CloseWhenReleased closes the region for its owner (a queue going away): no more Get, Lend or
// buffers provided to the kernel. Loans and registrations are forgotten (the caller guarantees the kernel is done
// with them: its rings are closed). Buffers the application still holds stay valid: the
// memory is unmapped when the last of them is released, never under the application.
// It returns whether the region was unmapped now. Idempotent.
func (r *Region) CloseWhenReleased() bool {
	r.mu.Lock()
	if r.unmapped {
		r.mu.Unlock()
		return true
	}
	r.closed = true
	for i, st := range r.state {
		if st == Kernel {
			r.gen[i]++
			r.state[i] = Free
			r.pub(int32(i))
			r.free = append(r.free, int32(i))
		}
	}
	r.lent = 0
	r.kernRefs = 0
	last := r.forgetSharedLoansLocked()
	r.unmapIfDoneLocked()
	unmapped := r.unmapped
	r.mu.Unlock()
	for _, f := range last {
		f()
	}
	return unmapped
}

// Memory returns the whole mapping (every buffer, back to back, and the rounding up to whole
// pages), for memory handed to the kernel as one piece such as a zcrx area. Nil after Close.
func (r *Region) Memory() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mem
}

// abandon forgets every loan and registration: call it only after the rings that held them are
// closed (the kernel has dropped its references). Close may follow.
func (r *Region) abandon() {
	r.mu.Lock()
	for i, s := range r.state {
		if s == Kernel {
			r.gen[i]++
			r.state[i] = Free
			r.pub(int32(i))
			r.free = append(r.free, int32(i))
		}
	}
	r.lent = 0
	r.kernRefs = 0
	last := r.forgetSharedLoansLocked()
	r.mu.Unlock()
	for _, f := range last {
		f()
	}
}

// Data returns the lent buffer's memory for the code that performs the send (the plain
// backend writes it with write(2)). It must not be modified while lent.
func (l Loan) Data() []byte {
	if l.r == nil {
		return nil
	}
	l.r.mu.Lock()
	defer l.r.mu.Unlock()
	if l.r.mem == nil {
		return nil
	}
	return l.r.slice(int(l.idx))
}

// Valid reports whether the loan still stands (the buffer was not returned or reclaimed).
func (l Loan) Valid() bool {
	if l.r == nil {
		return false
	}
	l.r.mu.Lock()
	defer l.r.mu.Unlock()
	if l.r.state[l.idx] == Shared {
		return !l.r.unmapped && l.r.gen[l.idx] == l.gen && l.r.shares[l.idx].loans > 0
	}
	return !l.r.unmapped && l.r.state[l.idx] == Kernel && l.r.gen[l.idx] == l.gen
}

// Pointer returns the address of byte off of the lent buffer as a pointer, for building iovecs
// of a send (the region's memory is mmap'd, never Go heap). It is nil when the region is
// already unmapped.
func (l Loan) Pointer(off int) *byte {
	if l.r == nil || l.r.mem == nil || off < 0 || off >= l.r.bufSize {
		return nil
	}
	return &l.r.mem[int(l.idx)*l.r.bufSize+off]
}
