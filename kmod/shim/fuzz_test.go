package shim

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/zcnet/zcnet/kmod/internal/abi"
	"golang.org/x/sys/unix"
)

func fuzzSeed(t *testing.T) uint64 {
	if s := os.Getenv("ZCSHIM_FUZZ_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// allowed is every per-entry result the ABI documents for a failure.
var allowed = map[unix.Errno]bool{
	unix.EINVAL: true, unix.ENOENT: true, unix.EBADF: true, unix.EACCES: true,
	unix.ECANCELED: true, unix.EPIPE: true, unix.ECONNRESET: true,
}

// TestFuzzRing drives the queue with a bounded stream of random entries
// (valid, malformed and mixed), random detach/attach and
// unregister/register, and checks the completion contract: every entry
// completes exactly once, a notification follows exactly the completions
// flagged More, and every error is a documented one. The module must end
// idle with nothing leaked. Reproduce with ZCSHIM_FUZZ_SEED.
func TestFuzzRing(t *testing.T) {
	seed := fuzzSeed(t)
	t.Logf("seed %d (set ZCSHIM_FUZZ_SEED to reproduce)", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	before, err := ReadStats()
	q := open(t, Config{Entries: 32})
	if err != nil {
		t.Fatal(err)
	}

	const npairs = 3
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ids [npairs]SockID
	var fds [npairs]int
	for i := range npairs {
		a, b := tcpPair(t)
		fds[i] = a
		if ids[i], err = q.Attach(a); err != nil {
			t.Fatal(err)
		}
		wg.Add(2)
		go func() { // peer reader
			defer wg.Done()
			buf := make([]byte, 256<<10)
			for {
				if n, err := unix.Read(b, buf); n <= 0 && err != unix.EINTR {
					return
				}
			}
		}()
		go func() { // peer writer: feeds RECVs, bounded
			defer wg.Done()
			buf := make([]byte, 1500)
			for k := 0; k < 2000; k++ {
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
				if _, err := unix.Write(b, buf[:1+k%len(buf)]); err != nil {
					return
				}
			}
		}()
		t.Cleanup(func() { unix.Shutdown(b, unix.SHUT_RDWR) })
	}
	const rsize = 256 << 10
	mem := mmap(t, 4*rsize)
	var keys [4]RegionKey
	for i := range keys {
		if keys[i], err = q.RegisterBytes(mem[i*rsize:(i+1)*rsize], RegionFlags(i&1)); err != nil {
			t.Fatal(err)
		}
	}

	type state struct{ done, wantNotif, notified bool }
	seen := map[uint64]*state{}
	var next uint64 = 1
	var completed, notifs, errs int
	cs := make([]Completion, 64)
	consume := func() {
		n := q.Completions(cs)
		for _, c := range cs[:n] {
			st := seen[c.UserData]
			if st == nil {
				t.Fatalf("completion for unknown user_data: %v", c)
			}
			if c.Notif() {
				if !st.wantNotif || st.notified || !st.done {
					t.Fatalf("unexpected notification %v (state %+v)", c, *st)
				}
				st.notified = true
				notifs++
				continue
			}
			if st.done {
				t.Fatalf("second completion %v", c)
			}
			st.done, st.wantNotif = true, c.More()
			completed++
			if c.Res < 0 {
				errs++
				if !allowed[unix.Errno(-c.Res)] {
					t.Fatalf("undocumented error %v", c)
				}
			}
		}
	}
	pick := func(vals ...uint64) uint64 { return vals[r.IntN(len(vals))] }
	const total = 5000
	for submitted := 0; submitted < total; {
		switch r.IntN(40) {
		case 0: // detach and re-attach a socket
			i := r.IntN(npairs)
			if err := q.Detach(ids[i]); err != nil {
				t.Fatal(err)
			}
			if ids[i], err = q.Attach(fds[i]); err != nil {
				t.Fatal(err)
			}
		case 1: // unregister and re-register a region
			i := r.IntN(len(keys))
			if err := q.Unregister(keys[i]); err != nil {
				t.Fatal(err)
			}
			if keys[i], err = q.RegisterBytes(mem[i*rsize:(i+1)*rsize], RegionFlags(i&1)); err != nil {
				t.Fatal(err)
			}
		}
		batch := 1 + r.IntN(8)
		for k := 0; k < batch && q.SQSpace() > 0; k++ {
			e := abi.Sqe{
				Opcode:    uint8(pick(0, 1, 1, 2, 2, 3, uint64(r.UintN(256)))),
				Sock:      uint32(pick(uint64(ids[r.IntN(npairs)]), uint64(ids[r.IntN(npairs)]), 0, uint64(r.Uint32()))),
				Region:    uint32(pick(uint64(keys[r.IntN(4)]), uint64(keys[r.IntN(4)]), 0, uint64(r.Uint32()))),
				Off:       pick(0, uint64(r.IntN(rsize)), rsize-1, rsize, math.MaxUint64, r.Uint64()),
				Len:       uint32(pick(0, 1, uint64(1+r.IntN(64<<10)), rsize, rsize+1, uint64(r.Uint32()))),
				User_data: next,
			}
			if r.IntN(2) == 0 { // well-formed: exercises the data paths
				e.Opcode = uint8(r.IntN(3))
				e.Sock = uint32(ids[r.IntN(npairs)])
				e.Region = uint32(keys[r.IntN(4)])
				e.Off = uint64(r.IntN(rsize))
				e.Len = uint32(1 + r.IntN(rsize-int(e.Off)))
			}
			if e.Opcode == 0 && r.IntN(2) == 0 {
				e.Sock, e.Region, e.Off, e.Len = 0, 0, 0, 0
			}
			if e.Off > rsize && r.IntN(2) == 0 {
				e.Off = uint64(r.IntN(rsize))
			}
			if r.IntN(20) == 0 {
				switch r.IntN(4) {
				case 0:
					e.Flags = uint8(1 + r.IntN(255))
				case 1:
					e.Op_flags = 1 + r.Uint32N(1000)
				case 2:
					e.Resv2[r.IntN(3)] = 1 + r.Uint64N(1000)
				case 3:
					e.Resv0 = 1
				}
			}
			if err := q.prepRaw(e); err != nil {
				t.Fatal(err)
			}
			seen[next] = &state{}
			next++
			submitted++
		}
		n, err := q.Submit(-1, 0, 0)
		if err != nil && !errors.Is(err, ErrCQFull) {
			t.Fatalf("submit: %v", err)
		}
		_ = n
		if r.IntN(4) == 0 || errors.Is(err, ErrCQFull) {
			q.Submit(0, 1, 20*time.Millisecond)
		}
		consume()
	}
	// Everything queued completes or is cancelled by detaching.
	for i := range ids {
		if err := q.Detach(ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		q.Submit(-1, 0, 0)
		consume()
		pending := 0
		for _, st := range seen {
			if !st.done || (st.wantNotif && !st.notified) {
				pending++
			}
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d entries never completed or were never notified", pending)
		}
		q.Submit(0, 1, 50*time.Millisecond)
	}
	close(stop)
	for i := range fds {
		unix.Shutdown(fds[i], unix.SHUT_RDWR)
	}
	wg.Wait()
	t.Logf("%d entries: %d completions (%d errors), %d notifications", len(seen), completed, errs, notifs)
	q.Close()
	if _, err := waitIdle(before.Contexts-1, 20*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestFuzzIoctl throws random argument bytes at every ioctl of fresh and
// set-up contexts. Anything may be refused; nothing may crash, warn or leak
// (the harness checks the kernel log and TestMain the module counters).
func TestFuzzIoctl(t *testing.T) {
	seed := fuzzSeed(t)
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	open(t, Config{Entries: 1}).Close() // probe
	mem := mmap(t, 1<<20)
	base := uint64(uintptr(unsafe.Pointer(&mem[0])))
	cmds := []uint{abi.IocSetup, abi.IocRegister, abi.IocUnregister, abi.IocAttach, abi.IocDetach, abi.IocEnter, abi.IocStats}
	var arg [64]byte
	ok, refused := 0, 0
	for round := 0; round < 40; round++ {
		fd, err := unix.Open(DevicePath, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.IntN(2) == 0 {
			s := abi.Setup{Sq_entries: 1 << r.IntN(6)}
			ioctl(fd, abi.IocSetup, unsafe.Pointer(&s))
		}
		for k := 0; k < 50; k++ {
			for i := range arg {
				arg[i] = byte(r.Uint32())
			}
			cmd := cmds[r.IntN(len(cmds))]
			switch {
			case cmd == abi.IocRegister && r.IntN(2) == 0:
				// Plausible addresses: inside, across and past our mapping.
				reg := (*abi.Region)(unsafe.Pointer(&arg[0]))
				reg.Addr = base + r.Uint64N(2<<20)
				reg.Len = r.Uint64N(2 << 20)
				reg.Flags &= 1
				reg.Key = 0
			case cmd == abi.IocEnter && r.IntN(2) == 0:
				e := (*abi.Enter)(unsafe.Pointer(&arg[0]))
				e.Flags &= 1
				e.Submitted = 0
				e.Timeout_ns = r.Uint64N(1e6) + 1
				e.Min_complete %= 4
			case cmd == abi.IocAttach && r.IntN(2) == 0:
				a := (*abi.Attach)(unsafe.Pointer(&arg[0]))
				a.Fd = int32(r.IntN(20))
				a.Flags, a.Id, a.Resv = 0, 0, 0
			case (cmd == abi.IocUnregister || cmd == abi.IocDetach) && r.IntN(2) == 0:
				x := (*abi.ID)(unsafe.Pointer(&arg[0]))
				x.Id = r.Uint32N(4)
				x.Resv = 0
			}
			if _, err := ioctl(fd, cmd, unsafe.Pointer(&arg[0])); err == nil {
				ok++
			} else {
				refused++
			}
		}
		if r.IntN(3) == 0 {
			if m, err := unix.Mmap(fd, int64(r.IntN(3))*4096, 4096*(1+r.IntN(3)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
				unix.Munmap(m)
			}
		}
		unix.Close(fd)
	}
	t.Logf("%d ioctls accepted, %d refused", ok, refused)
}
