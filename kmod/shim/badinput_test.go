package shim

import (
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/zcnet/zcnet/kmod/internal/abi"
	"golang.org/x/sys/unix"
)

// rawFd opens the device without setting it up.
func rawFd(t *testing.T) int {
	t.Helper()
	q := open(t, Config{Entries: 1}) // probes/skips like every test
	q.Close()
	fd, err := unix.Open(DevicePath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func wantErrno(t *testing.T, what string, err error, want unix.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
}

// TestBadSQE: every malformed entry is consumed and completes with the
// documented error and no notification.
func TestBadSQE(t *testing.T) {
	q := open(t, Config{Entries: 64})
	a, b := tcpPair(t)
	_ = b
	ida, err := q.Attach(a)
	if err != nil {
		t.Fatal(err)
	}
	mem := mmap(t, 64<<10)
	kw, err := q.RegisterBytes(mem[:32<<10], 0)
	if err != nil {
		t.Fatal(err)
	}
	kr, err := q.RegisterBytes(mem[32<<10:], RegionReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	s, r, k := uint32(ida), uint32(kw), uint32(kr)
	send := func(mod func(*abi.Sqe)) abi.Sqe {
		e := abi.Sqe{Opcode: abi.OpSend, Sock: s, Region: r, Off: 0, Len: 100}
		mod(&e)
		return e
	}
	cases := []struct {
		name string
		sqe  abi.Sqe
		want unix.Errno
	}{
		{"opcode 3", abi.Sqe{Opcode: abi.OpLast}, unix.EINVAL},
		{"opcode 255", abi.Sqe{Opcode: 255}, unix.EINVAL},
		{"nop flags", abi.Sqe{Flags: 1}, unix.EINVAL},
		{"nop resv0", abi.Sqe{Resv0: 1}, unix.EINVAL},
		{"nop op_flags", abi.Sqe{Op_flags: 1}, unix.EINVAL},
		{"nop resv1", abi.Sqe{Resv1: 1}, unix.EINVAL},
		{"nop resv2[2]", abi.Sqe{Resv2: [3]uint64{0, 0, 1}}, unix.EINVAL},
		{"nop sock", abi.Sqe{Sock: s}, unix.EINVAL},
		{"nop region", abi.Sqe{Region: r}, unix.EINVAL},
		{"nop len", abi.Sqe{Len: 1}, unix.EINVAL},
		{"nop off", abi.Sqe{Off: 1}, unix.EINVAL},
		{"send flags", send(func(e *abi.Sqe) { e.Flags = 0x80 }), unix.EINVAL},
		{"send op_flags", send(func(e *abi.Sqe) { e.Op_flags = 1 }), unix.EINVAL},
		{"send resv2", send(func(e *abi.Sqe) { e.Resv2[0] = 1 }), unix.EINVAL},
		{"send len 0", send(func(e *abi.Sqe) { e.Len = 0 }), unix.EINVAL},
		{"send region 0", send(func(e *abi.Sqe) { e.Region = 0 }), unix.ENOENT},
		{"send region unknown", send(func(e *abi.Sqe) { e.Region = 9999 }), unix.ENOENT},
		{"send region max", send(func(e *abi.Sqe) { e.Region = math.MaxUint32 }), unix.ENOENT},
		{"send region int max+1", send(func(e *abi.Sqe) { e.Region = 1 << 31 }), unix.ENOENT},
		{"send off past end", send(func(e *abi.Sqe) { e.Off = 32<<10 + 1; e.Len = 1 }), unix.EINVAL},
		{"send off at end", send(func(e *abi.Sqe) { e.Off = 32 << 10; e.Len = 1 }), unix.EINVAL},
		{"send len past end", send(func(e *abi.Sqe) { e.Off = 1; e.Len = 32 << 10 }), unix.EINVAL},
		{"send off+len overflow", send(func(e *abi.Sqe) { e.Off = math.MaxUint64; e.Len = 2 }), unix.EINVAL},
		{"send off huge", send(func(e *abi.Sqe) { e.Off = 1 << 63 }), unix.EINVAL},
		{"send len max", send(func(e *abi.Sqe) { e.Len = math.MaxUint32 }), unix.EINVAL},
		{"send sock 0", send(func(e *abi.Sqe) { e.Sock = 0 }), unix.EBADF},
		{"send sock unknown", send(func(e *abi.Sqe) { e.Sock = 777 }), unix.EBADF},
		{"send sock max", send(func(e *abi.Sqe) { e.Sock = math.MaxUint32 }), unix.EBADF},
		{"recv readonly region", abi.Sqe{Opcode: abi.OpRecv, Sock: s, Region: k, Len: 10}, unix.EACCES},
		{"recv len 0", abi.Sqe{Opcode: abi.OpRecv, Sock: s, Region: r}, unix.EINVAL},
		{"recv past end", abi.Sqe{Opcode: abi.OpRecv, Sock: s, Region: r, Off: 32 << 10, Len: 1}, unix.EINVAL},
	}
	for i, c := range cases {
		c.sqe.User_data = uint64(1000 + i)
		if err := q.prepRaw(c.sqe); err != nil {
			t.Fatal(err)
		}
	}
	got := reap(t, q, len(cases), 10*time.Second)
	for i, c := range got {
		tc := cases[c.UserData-1000]
		if c.Err() != tc.want || c.More() || c.Notif() {
			t.Errorf("%s: %v (err %v), want %v without More", tc.name, c, c.Err(), tc.want)
		}
		_ = i
	}
	t.Logf("%d malformed entries rejected", len(cases))
	if st, _ := q.Stats(); st.Ops != 0 {
		t.Errorf("ops queued after only bad entries: %+v", st)
	}
}

func TestBadSetup(t *testing.T) {
	bad := []abi.Setup{
		{Sq_entries: 0},
		{Sq_entries: 3},
		{Sq_entries: abi.MaxEntries * 2},
		{Sq_entries: 1 << 31},
		{Sq_entries: 8, Cq_entries: 8},
		{Sq_entries: 8, Cq_entries: 24},
		{Sq_entries: 8, Cq_entries: abi.MaxEntries * 2},
		{Sq_entries: 8, Flags: 1},
		{Sq_entries: 8, Abi_version: 1},
		{Sq_entries: 8, Ring_size: 1},
		{Sq_entries: 8, Sqes_off: 1},
		{Sq_entries: 8, Resv: [2]uint64{0, 1}},
	}
	for i, s := range bad {
		fd := rawFd(t)
		_, err := ioctl(fd, abi.IocSetup, unsafe.Pointer(&s))
		if !errors.Is(err, unix.EINVAL) {
			t.Errorf("setup case %d %+v: %v, want EINVAL", i, s, err)
		}
	}
	fd := rawFd(t)
	// Before SETUP: no rings.
	e := abi.Enter{To_submit: 1}
	_, err := ioctl(fd, abi.IocEnter, unsafe.Pointer(&e))
	wantErrno(t, "enter before setup", err, unix.ENXIO)
	at := abi.Attach{Fd: 0}
	_, err = ioctl(fd, abi.IocAttach, unsafe.Pointer(&at))
	wantErrno(t, "attach before setup", err, unix.ENXIO)
	_, err = unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	wantErrno(t, "mmap before setup", err, unix.ENXIO)

	s := abi.Setup{Sq_entries: 4}
	if _, err := ioctl(fd, abi.IocSetup, unsafe.Pointer(&s)); err != nil {
		t.Fatal(err)
	}
	if s.Cq_entries != 8 || s.Abi_version != abi.ABIVersion || s.Ring_size == 0 {
		t.Fatalf("setup out: %+v", s)
	}
	s2 := abi.Setup{Sq_entries: 4}
	_, err = ioctl(fd, abi.IocSetup, unsafe.Pointer(&s2))
	wantErrno(t, "second setup", err, unix.EBUSY)
	_, err = unix.Mmap(fd, 4096, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	wantErrno(t, "mmap at offset 4096", err, unix.EINVAL)
	_, err = unix.Mmap(fd, 0, int(s.Ring_size)+4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	wantErrno(t, "mmap past the ring", err, unix.EINVAL)
	m, err := unix.Mmap(fd, 0, int(s.Ring_size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	unix.Munmap(m)

	_, err = ioctl(fd, 0x7a99, nil)
	wantErrno(t, "unknown ioctl", err, unix.ENOTTY)
	for _, cmd := range []uint{abi.IocSetup, abi.IocRegister, abi.IocUnregister, abi.IocAttach, abi.IocDetach, abi.IocEnter, abi.IocStats} {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(cmd), 8) // a pointer into the null page
		wantErrno(t, "bad pointer", e, unix.EFAULT)
	}
	for i, e := range []abi.Enter{
		{Flags: 2},
		{Submitted: 1},
		{Flags: abi.EnterGetevents, Min_complete: s.Cq_entries + 1},
	} {
		_, err := ioctl(fd, abi.IocEnter, unsafe.Pointer(&e))
		if !errors.Is(err, unix.EINVAL) {
			t.Errorf("enter case %d: %v, want EINVAL", i, err)
		}
	}
}

func TestBadRegister(t *testing.T) {
	q := open(t, Config{Entries: 4})
	mem := mmap(t, 1<<20)
	base := uintptr(unsafe.Pointer(&mem[0]))
	regs := []struct {
		name string
		r    abi.Region
		want unix.Errno
	}{
		{"len 0", abi.Region{Addr: uint64(base)}, unix.EINVAL},
		{"too long", abi.Region{Addr: uint64(base), Len: abi.MaxRegionLen + 1}, unix.EINVAL},
		{"wraps", abi.Region{Addr: math.MaxUint64 - 4095, Len: 8192}, unix.EINVAL},
		{"kernel address", abi.Region{Addr: 0xffff888000000000, Len: 4096}, unix.EINVAL},
		{"flags", abi.Region{Addr: uint64(base), Len: 4096, Flags: 2}, unix.EINVAL},
		{"key set", abi.Region{Addr: uint64(base), Len: 4096, Key: 5}, unix.EINVAL},
		{"null page", abi.Region{Addr: 0, Len: 4096}, unix.EFAULT},
	}
	for _, c := range regs {
		_, err := ioctl(q.fd, abi.IocRegister, unsafe.Pointer(&c.r))
		wantErrno(t, "register "+c.name, err, c.want)
	}
	// Unmapped memory.
	hole, err := Mmap(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	addr := uintptr(unsafe.Pointer(&hole[0]))
	Munmap(hole)
	_, err = q.RegisterRegion(addr, 1<<16, 0)
	wantErrno(t, "register unmapped", err, unix.EFAULT)
	// Half mapped: two pages fine, the third unmapped; nothing stays pinned.
	m3 := mmap(t, 3*4096)
	b3 := uintptr(unsafe.Pointer(&m3[0]))
	if _, _, e := unix.Syscall(unix.SYS_MUNMAP, b3+8192, 4096, 0); e != 0 {
		t.Fatal(e)
	}
	_, err = q.RegisterRegion(b3, 3*4096, 0)
	wantErrno(t, "register past the mapping", err, unix.EFAULT)
	// Read-only mapping: writable pin refused, read-only pin fine.
	ro, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(ro)
	_, err = q.RegisterBytes(ro, 0)
	wantErrno(t, "writable pin of PROT_READ memory", err, unix.EFAULT)
	k, err := q.RegisterBytes(ro, RegionReadOnly)
	if err != nil {
		t.Fatalf("read-only pin of PROT_READ memory: %v", err)
	}
	if err := q.Unregister(k); err != nil {
		t.Fatal(err)
	}
	for _, key := range []RegionKey{0, k, 9999, math.MaxUint32, 1 << 31} {
		wantErrno(t, "unregister unknown", q.Unregister(key), unix.ENOENT)
	}
	id := abi.ID{Id: 1, Resv: 1}
	_, err = ioctl(q.fd, abi.IocUnregister, unsafe.Pointer(&id))
	wantErrno(t, "unregister resv", err, unix.EINVAL)
	// Region release runs on a workqueue: poll briefly.
	for i := 0; ; i++ {
		st, _ := q.Stats()
		if st.Regions == 0 && st.PinnedPages == 0 {
			break
		}
		if i == 250 {
			t.Fatalf("pinned after failed registrations: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The region cap.
	small := mmap(t, 4096)
	var keys []RegionKey
	for i := 0; i < MaxRegions; i++ {
		k, err := q.RegisterBytes(small, 0)
		if err != nil {
			t.Fatalf("region %d: %v", i, err)
		}
		keys = append(keys, k)
	}
	_, err = q.RegisterBytes(small, 0)
	wantErrno(t, "region over the cap", err, unix.ENOSPC)
	for _, k := range keys {
		if err := q.Unregister(k); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBadAttach(t *testing.T) {
	q := open(t, Config{Entries: 4})
	_, err := q.Attach(-1)
	wantErrno(t, "attach -1", err, unix.EBADF)
	_, err = q.Attach(1 << 20)
	wantErrno(t, "attach unopened fd", err, unix.EBADF)
	_, err = q.Attach(q.Fd())
	wantErrno(t, "attach the shim itself", err, unix.ENOTSOCK)
	pr, pw, _ := pipe(t)
	_, err = q.Attach(pr)
	wantErrno(t, "attach a pipe", err, unix.ENOTSOCK)
	_ = pw
	udp, _ := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	defer unix.Close(udp)
	_, err = q.Attach(udp)
	wantErrno(t, "attach UDP", err, unix.EOPNOTSUPP)
	us, _ := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	defer unix.Close(us[0])
	defer unix.Close(us[1])
	_, err = q.Attach(us[0])
	wantErrno(t, "attach AF_UNIX", err, unix.EOPNOTSUPP)
	if mp, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 262 /* IPPROTO_MPTCP */); err == nil {
		_, err = q.Attach(mp)
		wantErrno(t, "attach MPTCP", err, unix.EOPNOTSUPP)
		unix.Close(mp)
	} else {
		t.Logf("MPTCP sockets unavailable here (%v): case not exercised", err)
	}
	fresh, _ := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	defer unix.Close(fresh)
	_, err = q.Attach(fresh)
	wantErrno(t, "attach unconnected TCP", err, unix.ENOTCONN)
	ln, _ := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	defer unix.Close(ln)
	unix.Bind(ln, &unix.SockaddrInet6{})
	unix.Listen(ln, 1)
	_, err = q.Attach(ln)
	wantErrno(t, "attach listener", err, unix.ENOTCONN)

	a, _ := tcpPair(t)
	id, err := q.Attach(a)
	if err != nil {
		t.Fatal(err)
	}
	_, err = q.Attach(a)
	wantErrno(t, "attach twice", err, unix.EBUSY)
	for _, at := range []abi.Attach{{Fd: int32(a), Flags: 1}, {Fd: int32(a), Id: 1}, {Fd: int32(a), Resv: 1}} {
		_, err := ioctl(q.fd, abi.IocAttach, unsafe.Pointer(&at))
		wantErrno(t, "attach reserved fields", err, unix.EINVAL)
	}
	if err := q.Detach(id); err != nil {
		t.Fatal(err)
	}
	for _, x := range []SockID{id, 0, 12345, math.MaxUint32} {
		wantErrno(t, "detach unknown", q.Detach(x), unix.EBADF)
	}
	x := abi.ID{Id: 1, Resv: 1}
	_, err = ioctl(q.fd, abi.IocDetach, unsafe.Pointer(&x))
	wantErrno(t, "detach resv", err, unix.EINVAL)
}

func pipe(t *testing.T) (int, int, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1], nil
}

// TestBadRingIndexes: garbage written to the shared indexes cannot make
// the kernel misbehave; it only refuses or stops.
func TestBadRingIndexes(t *testing.T) {
	q := open(t, Config{Entries: 8})
	// An SQ tail far ahead of the head: EINVAL, nothing consumed.
	head := atomic.LoadUint32(q.sqHead)
	atomic.StoreUint32(q.sqTail, head+1000)
	e := abi.Enter{To_submit: 8}
	_, err := ioctl(q.fd, abi.IocEnter, unsafe.Pointer(&e))
	wantErrno(t, "sq tail +1000", err, unix.EINVAL)
	if atomic.LoadUint32(q.sqHead) != head {
		t.Fatal("kernel consumed entries past a bogus tail")
	}
	atomic.StoreUint32(q.sqTail, head-1)
	_, err = ioctl(q.fd, abi.IocEnter, unsafe.Pointer(&e))
	wantErrno(t, "sq tail behind head", err, unix.EINVAL)
	atomic.StoreUint32(q.sqTail, q.sqLocal)

	// A CQ head claiming more than was posted: the kernel treats the CQ as
	// full instead of overwriting.
	for i := 0; i < 8; i++ {
		q.PrepNop(uint64(i))
	}
	reap(t, q, 8, 5*time.Second)
	saved := q.cqLocal
	atomic.StoreUint32(q.cqHead, saved+100)
	q.PrepNop(1)
	_, err = q.Submit(-1, 0, 0)
	if !errors.Is(err, ErrCQFull) {
		t.Fatalf("submit with a bogus CQ head: %v, want ErrCQFull", err)
	}
	atomic.StoreUint32(q.cqHead, saved)
	reap(t, q, 1, 5*time.Second)
}

// TestCQFull: the kernel stops consuming when completions would not fit,
// counting two slots for every SEND.
func TestCQFull(t *testing.T) {
	q := open(t, Config{Entries: 8}) // CQ 16
	for round := 0; round < 2; round++ {
		for i := 0; i < 8; i++ {
			q.PrepNop(uint64(i))
		}
		if n, err := q.Submit(-1, 0, 0); n != 8 || err != nil {
			t.Fatalf("round %d: submitted %d, %v", round, n, err)
		}
	}
	q.PrepNop(99)
	if n, err := q.Submit(-1, 0, 0); n != 0 || !errors.Is(err, ErrCQFull) {
		t.Fatalf("submit into a full CQ: %d, %v; want ErrCQFull", n, err)
	}
	got := make([]Completion, 32)
	if n := q.Completions(got); n != 16 {
		t.Fatalf("%d completions, want 16", n)
	}
	reap(t, q, 1, 5*time.Second)

	// SENDs: 15 free slots hold 7 sends (14 CQEs), the 8th must wait.
	a, b := tcpPair(t)
	_ = b
	id, _ := q.Attach(a)
	mem := mmap(t, 4096)
	k, _ := q.RegisterBytes(mem, 0)
	q.PrepNop(1)
	q.Submit(-1, 0, 0)
	for i := 0; i < 8; i++ {
		q.PrepSend(id, k, 0, 1, uint64(i))
	}
	n, err := q.Submit(-1, 0, 0)
	if n != 7 || err != nil {
		t.Fatalf("submitted %d sends (%v), want 7 (15 free CQ slots)", n, err)
	}
	reap(t, q, 15, 5*time.Second)
	if _, err := q.Submit(-1, 0, 0); err != nil {
		t.Fatal(err)
	}
	reap(t, q, 2, 5*time.Second)
}
