package uring

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

func TestNop(t *testing.T) {
	r := newRing(t, 8, nil)
	for i := uint64(1); i <= 3; i++ {
		sqe := r.GetSQE()
		sqe.PrepNop()
		sqe.UserData = i
	}
	if n, err := r.SubmitAndWait(3); err != nil || n != 3 {
		t.Fatalf("SubmitAndWait = %d, %v", n, err)
	}
	var cqes [8]CQE
	n := r.PeekBatch(cqes[:])
	if n != 3 {
		t.Fatalf("got %d CQEs, want 3", n)
	}
	for i := 0; i < n; i++ {
		if cqes[i].UserData != uint64(i+1) || cqes[i].Res != 0 {
			t.Errorf("cqe %d = %+v", i, cqes[i])
		}
	}
	if _, ok := r.PeekCQE(); ok {
		t.Fatal("unexpected extra CQE")
	}
}

func TestSQFull(t *testing.T) {
	r := newRing(t, 4, nil)
	for i := 0; i < 4; i++ {
		if r.GetSQE() == nil {
			t.Fatalf("GetSQE %d returned nil", i)
		}
	}
	if r.GetSQE() != nil {
		t.Fatal("GetSQE on a full SQ returned an entry")
	}
	if r.Pending() != 4 || r.SQSpace() != 0 {
		t.Fatalf("pending %d space %d", r.Pending(), r.SQSpace())
	}
	mustSubmit(t, r)
	if r.SQSpace() != 4 {
		t.Fatalf("space after submit %d", r.SQSpace())
	}
	if _, err := r.WaitCQE(); err != nil {
		t.Fatal(err)
	}
}

func TestBadInput(t *testing.T) {
	if _, err := New(0, nil); !errors.Is(err, unix.EINVAL) {
		t.Errorf("New(0) = %v, want EINVAL", err)
	}
	if _, err := New(1<<20, nil); !errors.Is(err, unix.EINVAL) {
		t.Errorf("New(1<<20) = %v, want EINVAL", err)
	}
	var se *SetupError
	if _, err := New(8, &Options{Flags: 1 << 30}); !errors.As(err, &se) || !errors.Is(err, ErrNotSupported) {
		t.Errorf("New(bogus flag) = %v, want *SetupError matching ErrNotSupported", err)
	}
	r := newRing(t, 8, nil)
	if _, err := r.RegisterBufRing(3, 1, 0); !errors.Is(err, unix.EINVAL) {
		t.Errorf("RegisterBufRing(3) = %v", err)
	}
	if _, err := r.RegisterBufRing(0, 1, 0); !errors.Is(err, unix.EINVAL) {
		t.Errorf("RegisterBufRing(0) = %v", err)
	}
	if err := r.RegisterBuffers(nil, nil); !errors.Is(err, unix.EINVAL) {
		t.Errorf("RegisterBuffers(nil) = %v", err)
	}
	// A buffer the kernel cannot pin (unmapped address) is refused by the kernel.
	if err := r.RegisterBuffers([]Iovec{{Base: 4096, Len: 4096}}, nil); err == nil {
		t.Error("registering an unmapped address succeeded")
	}
	// Recv into an invalid address fails the request, not the process.
	a, b := socketpair(t)
	unix.Write(b, []byte("x"))
	sqe := r.GetSQE()
	sqe.PrepRecv(int32(a), 8, 1, 0)
	cqe := submitWait(t, r)
	if cqe.Res != -int32(unix.EFAULT) {
		t.Errorf("recv into bad address: res %d, want -EFAULT", cqe.Res)
	}
	// A bad fd fails the request with EBADF.
	sqe = r.GetSQE()
	sqe.PrepSend(99999, 0, 0, 0)
	if cqe := submitWait(t, r); cqe.Res != -int32(unix.EBADF) {
		t.Errorf("send on bad fd: res %d", cqe.Res)
	}
	r2, err := New(4, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r2.Close(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("second Close = %v, want os.ErrClosed", err)
	}
	if _, err := r2.Submit(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Submit after Close = %v", err)
	}
	if n := r2.PeekBatch(make([]CQE, 4)); n != 0 {
		t.Errorf("PeekBatch after Close = %d", n)
	}
}

func submitWait(t testing.TB, r *Ring) CQE {
	t.Helper()
	mustSubmit(t, r)
	c, err := r.WaitCQETimeout(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// roundTrip sends size checksummed bytes from a to b through the ring, with SEND and RECV
// (resubmitting short transfers), and checks they arrive intact.
func roundTrip(t *testing.T, r *Ring, a, b int, size int) {
	src := mmapBuf(t, size)
	dst := mmapBuf(t, size)
	fill(src, uint64(size))
	sent, rcvd := 0, 0
	const sendTag, recvTag = 1, 2
	sendBusy, recvBusy := false, false
	for sent < size || rcvd < size {
		if !sendBusy && sent < size {
			r.GetSQE().PrepSend(int32(a), addr(src)+uintptr(sent), uint32(min(size-sent, 1<<20)), 0)
			r.lastSQE().UserData = sendTag
			sendBusy = true
		}
		if !recvBusy && rcvd < size {
			r.GetSQE().PrepRecv(int32(b), addr(dst)+uintptr(rcvd), uint32(size-rcvd), 0)
			r.lastSQE().UserData = recvTag
			recvBusy = true
		}
		c := submitWait(t, r)
		if c.Res < 0 {
			t.Fatalf("op %d failed: %v", c.UserData, unix.Errno(-c.Res))
		}
		switch c.UserData {
		case sendTag:
			sent += int(c.Res)
			sendBusy = false
		case recvTag:
			if c.Res == 0 {
				t.Fatal("unexpected EOF")
			}
			rcvd += int(c.Res)
			recvBusy = false
		}
	}
	if crc32.ChecksumIEEE(src) != crc32.ChecksumIEEE(dst) || !bytes.Equal(src, dst) {
		t.Fatal("data corrupted in transit")
	}
}

// lastSQE returns the SQE most recently taken (test helper for setting UserData).
func (r *Ring) lastSQE() *SQE {
	return (*SQE)(unsafe.Add(r.sqes, uintptr((r.sqeTail-1)&r.sqMask)<<(6+r.sqeShift)))
}

func TestSendRecvSocketpair(t *testing.T) {
	r := newRing(t, 16, nil)
	a, b := socketpair(t)
	roundTrip(t, r, a, b, 1<<20+123)
}

func TestSendRecvTCP(t *testing.T) {
	r := newRing(t, 16, nil)
	c, s := tcpPair(t)
	roundTrip(t, r, c, s, 4<<20+7)
	roundTrip(t, r, s, c, 77)
}

func TestSetupFlagVariants(t *testing.T) {
	caps := DetectCapabilities()
	if caps.Err != nil {
		t.Fatalf("io_uring unavailable: %v", caps.Err)
	}
	for _, tc := range []struct {
		name  string
		flags uint32
		since string // the kernel that accepts the flags (unprivileged SQPOLL: 5.11)
	}{
		{"defer-taskrun", SetupSingleIssuer | SetupDeferTaskrun | SetupTaskrunFlag, "6.1"},
		{"coop-taskrun", SetupCoopTaskrun | SetupTaskrunFlag, "5.19"},
		{"no-sqarray", SetupNoSQArray, "6.6"},
		{"cqe32", SetupCQE32, "5.19"},
		{"sqe128", SetupSQE128, "5.19"},
		{"sqpoll", SetupSQPoll | SetupSQAff, "5.11"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.RequireFeature(t, caps.SetupOK(tc.flags&^SetupTaskrunFlag), fmt.Sprintf("setup flags %#x", tc.flags), tc.since)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			r := newRing(t, 16, &Options{Flags: tc.flags, SQThreadIdle: 10})
			a, b := socketpair(t)
			roundTrip(t, r, a, b, 300<<10)
			for i := 0; i < 10; i++ {
				r.GetSQE().PrepNop()
				r.lastSQE().UserData = 42
			}
			mustSubmit(t, r)
			got := 0
			for got < 10 {
				c, err := r.WaitCQETimeout(5 * time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if c.UserData == 42 {
					got++
				}
			}
		})
	}
}

func TestRegisteredRingFd(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newRing(t, 8, nil)
	if err := r.RegisterRingFd(); err != nil {
		t.Fatal(err)
	}
	a, b := socketpair(t)
	roundTrip(t, r, a, b, 64<<10)
	if err := r.UnregisterRingFd(); err != nil {
		t.Fatal(err)
	}
}

func TestProbe(t *testing.T) {
	caps := DetectCapabilities()
	if caps.Err != nil {
		t.Fatal(caps.Err)
	}
	for _, op := range []uint8{OpNop, OpSend, OpRecv, OpAccept, OpConnect, OpClose, OpShutdown, OpMsgRing,
		OpAsyncCancel, OpTimeout, OpReadFixed, OpWriteFixed, OpSendZC} {
		if !caps.Probe.Supports(op) {
			t.Errorf("opcode %d not reported as supported", op)
		}
	}
	if caps.Probe.Supports(255) {
		t.Error("opcode 255 reported as supported")
	}
	if !caps.Has(FeatNodrop | FeatExtArg | FeatSingleMmap) {
		t.Errorf("features %#x lack NODROP|EXT_ARG|SINGLE_MMAP", caps.Features)
	}
	if err := caps.NeedOp(255, "bogus", "99"); !errors.Is(err, ErrNotSupported) {
		t.Errorf("NeedOp(255) = %v", err)
	}
}

// TestCQOverflow posts more completions than the CQ holds without reaping; with FeatNodrop the
// kernel keeps the excess and nothing is lost.
func TestCQOverflow(t *testing.T) {
	r := newRing(t, 8, nil) // CQ of 16
	const total = 200
	for i := 0; i < total; i++ {
		sqe := r.GetSQE()
		if sqe == nil {
			mustSubmit(t, r)
			sqe = r.GetSQE()
		}
		sqe.PrepNop()
		sqe.UserData = uint64(i)
	}
	mustSubmit(t, r)
	seen := make([]bool, total)
	buf := make([]CQE, 5)
	got := 0
	for deadline := time.Now().Add(5 * time.Second); got < total && time.Now().Before(deadline); {
		n := r.PeekBatch(buf)
		for _, c := range buf[:n] {
			if seen[c.UserData] {
				t.Fatalf("duplicate CQE %d", c.UserData)
			}
			seen[c.UserData] = true
			got++
		}
	}
	if got != total {
		t.Fatalf("got %d of %d completions", got, total)
	}
	if r.CQOverflow() != 0 {
		t.Errorf("kernel dropped %d CQEs", r.CQOverflow())
	}
	if r.Stats().OverflowFlushes == 0 {
		t.Error("no overflow flush was needed: the test did not overflow the CQ")
	}
}

func TestTimeoutAndCancel(t *testing.T) {
	r := newRing(t, 8, nil)
	ts := &Timespec{Nsec: int64(time.Millisecond)}
	sqe := r.GetSQE()
	sqe.PrepTimeout(r, ts, 0, 0)
	sqe.UserData = 1
	if c := submitWait(t, r); c.UserData != 1 || c.Res != -int32(unix.ETIME) {
		t.Fatalf("timeout cqe %+v", c)
	}
	// A recv that never completes, cancelled by user_data.
	a, _ := socketpair(t)
	buf := mmapBuf(t, 64)
	r.GetSQE().PrepRecv(int32(a), addr(buf), 64, 0)
	r.lastSQE().UserData = 7
	r.GetSQE().PrepCancel(7, 0)
	r.lastSQE().UserData = 8
	mustSubmit(t, r)
	res := map[uint64]int32{}
	for len(res) < 2 {
		c, err := r.WaitCQETimeout(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		res[c.UserData] = c.Res
	}
	if res[7] != -int32(unix.ECANCELED) || res[8] != 0 {
		t.Fatalf("cancel results %v", res)
	}
	// Waiting with nothing in flight times out with ETIME.
	if _, err := r.WaitCQETimeout(20 * time.Millisecond); !errors.Is(err, unix.ETIME) {
		t.Fatalf("idle wait = %v, want ETIME", err)
	}
}

func TestMsgRing(t *testing.T) {
	src := newRing(t, 8, nil)
	dst := newRing(t, 8, nil)
	src.GetSQE().PrepMsgRing(int32(dst.Fd()), 1234, 0xfeed, 0)
	src.lastSQE().UserData = 1
	if c := submitWait(t, src); c.Res != 0 {
		t.Fatalf("msg_ring res %d", c.Res)
	}
	c, err := dst.WaitCQETimeout(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if c.UserData != 0xfeed || c.Res != 1234 {
		t.Fatalf("target got %+v", c)
	}
}

func TestAcceptConnectShutdownClose(t *testing.T) {
	r := newRing(t, 16, nil)
	lfd, port := tcpListener(t)
	r.GetSQE().PrepMultishotAccept(int32(lfd), unix.SOCK_CLOEXEC)
	r.lastSQE().UserData = 100
	var accepted []int
	const n = 3
	for i := 0; i < n; i++ {
		cfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if err != nil {
			t.Fatal(err)
		}
		closeFD(t, cfd)
		sa := &unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: [4]byte{127, 0, 0, 1}}
		sa.Port = uint16(port>>8) | uint16(port&0xff)<<8
		sqe := r.GetSQE()
		sqe.PrepConnect(int32(cfd), uintptr(unsafe.Pointer(sa)), uint32(unsafe.Sizeof(*sa)))
		sqe.UserData = 200
		r.Keep(sa)
	}
	mustSubmit(t, r)
	connects := 0
	for len(accepted) < n || connects < n {
		c, err := r.WaitCQETimeout(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		switch c.UserData {
		case 100:
			if c.Res < 0 {
				t.Fatalf("accept: %v", unix.Errno(-c.Res))
			}
			if !c.More() {
				t.Fatal("multishot accept ended early")
			}
			accepted = append(accepted, int(c.Res))
		case 200:
			if c.Res != 0 {
				t.Fatalf("connect: %v", unix.Errno(-c.Res))
			}
			connects++
		}
	}
	// Shut down and close the accepted sockets through the ring.
	for _, fd := range accepted {
		r.GetSQE().PrepShutdown(int32(fd), unix.SHUT_WR)
		r.lastSQE().UserData = 300
		r.lastSQE().Flags |= SQEIOLink // close only after shutdown ran
		r.GetSQE().PrepClose(int32(fd))
		r.lastSQE().UserData = 400
	}
	r.GetSQE().PrepCancelFd(int32(lfd), CancelAll)
	r.lastSQE().UserData = 500
	mustSubmit(t, r)
	closed, shut := 0, 0
	for closed < n || shut < n {
		c, err := r.WaitCQETimeout(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		switch c.UserData {
		case 300:
			if c.Res != 0 {
				t.Fatalf("shutdown: %v", unix.Errno(-c.Res))
			}
			shut++
		case 400:
			if c.Res != 0 {
				t.Fatalf("close: %v", unix.Errno(-c.Res))
			}
			closed++
		}
	}
}

func TestReadWriteFixedAndFiles(t *testing.T) {
	r := newRing(t, 8, nil)
	f, err := os.CreateTemp(t.TempDir(), "fixed")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := mmapBuf(t, 64<<10)
	fill(buf[:32<<10], 9)
	if err := r.RegisterBuffers([]Iovec{{Base: uint64(addr(buf)), Len: uint64(len(buf))}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterFilesSparse(4); err != nil {
		t.Fatal(err)
	}
	if n, err := r.UpdateFiles(2, []int32{int32(f.Fd())}); err != nil || n != 1 {
		t.Fatalf("UpdateFiles = %d, %v", n, err)
	}
	sqe := r.GetSQE()
	sqe.PrepWriteFixed(2, addr(buf), 32<<10, 0, 0)
	sqe.SetFixedFile()
	if c := submitWait(t, r); c.Res != 32<<10 {
		t.Fatalf("write_fixed res %d", c.Res)
	}
	r.GetSQE().PrepReadFixed(int32(f.Fd()), addr(buf)+32<<10, 32<<10, 0, 0)
	if c := submitWait(t, r); c.Res != 32<<10 {
		t.Fatalf("read_fixed res %d", c.Res)
	}
	if !bytes.Equal(buf[:32<<10], buf[32<<10:]) {
		t.Fatal("read_fixed data differs")
	}
	// Outside the registered buffer: refused with EFAULT.
	other := mmapBuf(t, 4096)
	r.GetSQE().PrepReadFixed(int32(f.Fd()), addr(other), 4096, 0, 0)
	if c := submitWait(t, r); c.Res != -int32(unix.EFAULT) {
		t.Fatalf("read_fixed outside buffer: res %d, want -EFAULT", c.Res)
	}
	// Unknown buffer index: EFAULT (6.x) — a clean per-request error in any case.
	r.GetSQE().PrepReadFixed(int32(f.Fd()), addr(buf), 4096, 0, 7)
	if c := submitWait(t, r); c.Res >= 0 {
		t.Fatalf("read_fixed with bad index succeeded: %d", c.Res)
	}
	if err := r.UnregisterFiles(); err != nil {
		t.Fatal(err)
	}
	if err := r.UnregisterBuffers(); err != nil {
		t.Fatal(err)
	}
}

func TestBuffersSparseUpdateTags(t *testing.T) {
	r := newRing(t, 8, nil)
	if err := r.RegisterBuffersSparse(8); err != nil {
		t.Fatal(err)
	}
	buf := mmapBuf(t, 8192)
	if n, err := r.UpdateBuffers(3, []Iovec{{Base: uint64(addr(buf)), Len: 8192}}, []uint64{0xabc}); err != nil || n != 1 {
		t.Fatalf("UpdateBuffers = %d, %v", n, err)
	}
	// Replacing the slot releases the old buffer, which posts its tag.
	if _, err := r.UpdateBuffers(3, []Iovec{{}}, nil); err != nil {
		t.Fatal(err)
	}
	c, err := r.WaitCQETimeout(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if c.UserData != 0xabc {
		t.Fatalf("tag CQE %+v", c)
	}
	if _, err := r.UpdateBuffers(100, []Iovec{{Base: uint64(addr(buf)), Len: 8192}}, nil); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("update out of range = %v, want EINVAL", err)
	}
}

func TestEventfd(t *testing.T) {
	r := newRing(t, 8, nil)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	if err := r.RegisterEventfd(efd); err != nil {
		t.Fatal(err)
	}
	r.GetSQE().PrepNop()
	mustSubmit(t, r)
	var v [8]byte
	if _, err := unix.Read(efd, v[:]); err != nil {
		t.Fatal(err)
	}
	if *(*uint64)(unsafe.Pointer(&v[0])) == 0 {
		t.Fatal("eventfd not signalled")
	}
	if err := r.UnregisterEventfd(); err != nil {
		t.Fatal(err)
	}
}
