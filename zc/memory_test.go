package zc

import (
	"bufio"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Memory that fits the machine: an engine pins little before connections arrive,
// and an idle connection costs little heap.

// TestMemoryAtStart: a 16-queue engine holds at most 16 MiB of registered (pinned) send
// memory before the first connection; the receive pools are reported too.
func TestMemoryAtStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"16-queues", Config{Queues: 16, NoPin: true}},
		{"default", Config{NoPin: true}},
		{"16-queues-plain", Config{Queues: 16, NoPin: true, Backend: BackendPlain}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			st := e.Stats()
			t.Logf("%d queues (%s): send pools %d KiB (cap %d MiB), receive pools %d KiB (cap %d MiB), %d KiB in all",
				st.Queues, st.Backend, st.Memory.SendPoolBytes>>10, st.Memory.SendPoolMax>>20, st.Memory.RecvPoolBytes>>10, st.Memory.RecvPoolMax>>20,
				(st.Memory.SendPoolBytes+st.Memory.RecvPoolBytes)>>10)
			if st.Memory.SendPoolBytes == 0 || st.Memory.RecvPoolBytes == 0 {
				t.Fatalf("pool sizes not reported: %+v", st)
			}
			if st.Memory.SendPoolBytes > 16<<20 {
				t.Errorf("%d queues pin %d MiB of send buffers before any connection (at most 16 MiB)", st.Queues, st.Memory.SendPoolBytes>>20)
			}
			if st.Memory.SendPoolBytes+st.Memory.RecvPoolBytes > 32<<20 {
				t.Errorf("%d queues map %d MiB of buffers before any connection", st.Queues, (st.Memory.SendPoolBytes+st.Memory.RecvPoolBytes)>>20)
			}
		})
	}
}

func heapAlloc() uint64 {
	var ms runtime.MemStats
	for i := 0; i < 3; i++ {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func vmRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TestIdleConnMemory: 2,000 idle accepted connections; the Go heap the server engine holds
// for them, per connection (the clients are raw descriptors: no heap). The target is
// 1 KiB per idle connection (RSS, which the bench's idle scenario measures); more than 1 KiB
// of heap fails. ZC_IDLE_CONNS scales it.
func TestIdleConnMemory(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testIdleConnMemory(t, b, envInt(t, "ZC_IDLE_CONNS", 2000)) })
}

func testIdleConnMemory(t *testing.T, b Backend, n int) {
	var lim unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	if lim.Cur < uint64(2*n+200) {
		t.Skipf("RLIMIT_NOFILE %d: too low for %d connections (needs %d)", lim.Cur, n, 2*n+200)
	}
	e := newEngine(t, Config{Backend: b, Queues: 2, NoPin: true})
	accepted := make(chan struct{}, n)
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		accepted <- struct{}{}
		return HandlerFuncs{}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sa := &unix.SockaddrInet4{Port: l.Addr().(*net.TCPAddr).Port, Addr: [4]byte{127, 0, 0, 1}}
	fds := make([]int, 0, n)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	// A warm-up connection, so one-time allocations (maps growing, pools) are not counted.
	warm, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	fds = append(fds, warm)
	if err := unix.Connect(warm, sa); err != nil {
		t.Fatal(err)
	}
	<-accepted
	heap0, rss0 := heapAlloc(), vmRSS()
	for i := 0; i < n; i++ {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if err != nil {
			t.Fatalf("socket %d: %v", i, err)
		}
		fds = append(fds, fd)
		if err := unix.Connect(fd, sa); err != nil {
			t.Fatalf("connect %d: %v", i, err)
		}
	}
	deadline := time.After(60 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case <-accepted:
		case <-deadline:
			t.Fatalf("accepted %d of %d\n%s", i, n, engineDump(e))
		}
	}
	// Let the queues settle (receives armed), then measure.
	for e.Stats().Conns < n+1 {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	heap1, rss1 := heapAlloc(), vmRSS()
	per := (int64(heap1) - int64(heap0)) / int64(n)
	t.Logf("%s: %d idle connections: Go heap +%d KiB (%d B per connection), VmRSS +%d KiB (%d B per connection, kernel socket memory not included)",
		b, n, (int64(heap1)-int64(heap0))>>10, per, (rss1-rss0)>>10, (rss1-rss0)/int64(n))
	if per > 1024 {
		t.Errorf("%d B of Go heap per idle connection (at most 1 KiB)", per)
	}
}
