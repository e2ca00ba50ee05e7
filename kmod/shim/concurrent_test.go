package shim

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/zcnet/zcnet/kmod/internal/abi"
	"golang.org/x/sys/unix"
)

// TestConcurrentControl: while the owner goroutine streams SENDs and
// RECVs, other threads detach/re-attach the socket, unregister/re-register
// the regions, wait on the CQ and read stats — raw ioctls on the same fd,
// which the Go API forbids but the kernel must survive. Every entry still
// completes exactly once, and the module ends idle.
func TestConcurrentControl(t *testing.T) {
	before, _ := ReadStats()
	q := open(t, Config{Entries: 32})
	a, b := tcpPair(t)
	var sock, key atomic.Uint32
	id, err := q.Attach(a)
	if err != nil {
		t.Fatal(err)
	}
	sock.Store(uint32(id))
	mem := mmap(t, 512<<10)
	k, err := q.RegisterBytes(mem, 0)
	if err != nil {
		t.Fatal(err)
	}
	key.Store(uint32(k))
	got := drain(b, nil)
	go func() { // the peer also sends, so RECVs complete
		buf := make([]byte, 4096)
		for i := 0; i < 500; i++ {
			if _, err := unix.Write(b, buf); err != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	control := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			for {
				select {
				case <-stop:
					return
				default:
				}
				f()
				time.Sleep(time.Duration(1+time.Now().UnixNano()%3) * time.Millisecond)
			}
		}()
	}
	var mu sync.Mutex // serializes the id swaps among controllers, not with the kernel
	control(func() {
		mu.Lock()
		defer mu.Unlock()
		x := abi.ID{Id: sock.Load()}
		ioctl(q.fd, abi.IocDetach, unsafe.Pointer(&x))
		at := abi.Attach{Fd: int32(a)}
		if _, err := ioctl(q.fd, abi.IocAttach, unsafe.Pointer(&at)); err == nil {
			sock.Store(at.Id)
		}
	})
	control(func() {
		mu.Lock()
		defer mu.Unlock()
		x := abi.ID{Id: key.Load()}
		ioctl(q.fd, abi.IocUnregister, unsafe.Pointer(&x))
		r := abi.Region{Addr: uint64(uintptr(unsafe.Pointer(&mem[0]))), Len: uint64(len(mem))}
		if _, err := ioctl(q.fd, abi.IocRegister, unsafe.Pointer(&r)); err == nil {
			key.Store(r.Key)
		}
	})
	control(func() {
		e := abi.Enter{Flags: abi.EnterGetevents, Min_complete: 1, Timeout_ns: 1e6}
		ioctl(q.fd, abi.IocEnter, unsafe.Pointer(&e))
		var s abi.Stats
		ioctl(q.fd, abi.IocStats, unsafe.Pointer(&s))
	})

	type st struct{ done, more, notif bool }
	seen := map[uint64]*st{}
	cs := make([]Completion, 64)
	consume := func() {
		for _, c := range cs[:q.Completions(cs)] {
			s := seen[c.UserData]
			switch {
			case s == nil:
				t.Fatalf("unknown completion %v", c)
			case c.Notif():
				if !s.more || s.notif {
					t.Fatalf("bad notification %v", c)
				}
				s.notif = true
			case s.done:
				t.Fatalf("second completion %v", c)
			default:
				s.done, s.more = true, c.More()
			}
		}
	}
	var next uint64 = 1
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		for q.SQSpace() > 0 && next%4 != 0 {
			off := uint64(next%8) * (64 << 10)
			if next%3 == 0 {
				q.PrepRecv(SockID(sock.Load()), RegionKey(key.Load()), off, 64<<10, next)
			} else {
				q.PrepSend(SockID(sock.Load()), RegionKey(key.Load()), off, 64<<10, next)
			}
			seen[next] = &st{}
			next++
		}
		next++
		q.Submit(-1, 1, 10*time.Millisecond)
		consume()
	}
	close(stop)
	wg.Wait()
	q.Detach(SockID(sock.Load()))
	end := time.Now().Add(30 * time.Second)
	for {
		q.Submit(-1, 0, 0)
		consume()
		pending := 0
		for _, s := range seen {
			if !s.done || (s.more && !s.notif) {
				pending++
			}
		}
		if pending == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d entries unfinished", pending, len(seen))
		}
		q.Submit(0, 1, 20*time.Millisecond)
	}
	t.Logf("%d entries under concurrent detach/attach/unregister/register", len(seen))
	q.Close()
	unix.Shutdown(a, unix.SHUT_RDWR)
	<-got
	if _, err := waitIdle(before.Contexts-1, 20*time.Second); err != nil {
		t.Fatal(err)
	}
}
