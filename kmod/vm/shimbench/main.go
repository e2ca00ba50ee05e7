// Command shimbench measures, inside the test VM, how zcshim sends compare
// with plain send(2) and io_uring (SEND and SEND_ZC) on loopback: relative
// throughput and syscalls per GB. The VM is emulated (TCG), so only the
// ratios between variants of one run mean anything.
//
// Output: one "MEASURE ..." line per variant and size, then ratio lines.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"
	"unsafe"

	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/kmod/shim"
	"golang.org/x/sys/unix"
)

const slots = 8 // sends in flight for the queued variants

type result struct {
	name     string
	size     int
	bytes    int64
	elapsed  time.Duration
	syscalls int64
	copied   int64 // notifications reporting a copy
	notifs   int64
}

func (r result) mbps() float64 { return float64(r.bytes) / r.elapsed.Seconds() / 1e6 }
func (r result) perGB() float64 {
	return float64(r.syscalls) / (float64(r.bytes) / 1e9)
}

func tcpPair() (int, int, error) {
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, -1, err
	}
	defer unix.Close(ln)
	if err := unix.Bind(ln, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return -1, -1, err
	}
	if err := unix.Listen(ln, 1); err != nil {
		return -1, -1, err
	}
	sa, _ := unix.Getsockname(ln)
	c, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, -1, err
	}
	if err := unix.Connect(c, sa); err != nil {
		return -1, -1, err
	}
	s, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
	return c, s, err
}

// sink reads fd until want bytes arrived.
func sink(fd int, want int64) <-chan error {
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<20)
		var got int64
		for got < want {
			n, err := unix.Read(fd, buf)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n == 0 {
				done <- fmt.Errorf("sink: %d of %d bytes: %v", got, want, err)
				return
			}
			got += int64(n)
		}
		done <- nil
	}()
	return done
}

func run(name string, size int, total int64, body func(fd int, mem []byte) (result, error)) (result, error) {
	a, b, err := tcpPair()
	if err != nil {
		return result{}, err
	}
	defer unix.Close(a)
	defer unix.Close(b)
	mem, err := shim.Mmap(size * slots)
	if err != nil {
		return result{}, err
	}
	defer shim.Munmap(mem)
	for i := range mem {
		mem[i] = byte(i * 7)
	}
	done := sink(b, total)
	start := time.Now()
	r, err := body(a, mem)
	if err != nil {
		return r, err
	}
	if err := <-done; err != nil {
		return r, err
	}
	r.elapsed = time.Since(start)
	r.name, r.size, r.bytes = name, size, total
	return r, nil
}

func sendPlain(size int, total int64) (result, error) {
	return run("send(2)", size, total, func(fd int, mem []byte) (result, error) {
		var r result
		for sent := int64(0); sent < total; {
			n, err := unix.Write(fd, mem[:size])
			r.syscalls++
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return r, err
			}
			sent += int64(n)
		}
		return r, nil
	})
}

func sendShim(size int, total int64) (result, error) {
	return run("zcshim SEND", size, total, func(fd int, mem []byte) (result, error) {
		var r result
		q, err := shim.Open(shim.Config{Entries: 2 * slots})
		if err != nil {
			return r, err
		}
		defer q.Close()
		id, err := q.Attach(fd)
		if err != nil {
			return r, err
		}
		key, err := q.RegisterBytes(mem, shim.RegionReadOnly)
		if err != nil {
			return r, err
		}
		free := make([]int, 0, slots)
		for i := 0; i < slots; i++ {
			free = append(free, i)
		}
		cs := make([]shim.Completion, 4*slots)
		var queued int64
		for queued < total || len(free) < slots {
			for len(free) > 0 && queued < total {
				s := free[len(free)-1]
				free = free[:len(free)-1]
				q.PrepSend(id, key, uint64(s*size), uint32(size), uint64(s))
				queued += int64(size)
			}
			_, err := q.Submit(-1, 1, 30*time.Second)
			r.syscalls++
			if err != nil {
				return r, err
			}
			n := q.Completions(cs)
			for _, c := range cs[:n] {
				if c.Notif() {
					r.notifs++
					if c.Copied() {
						r.copied++
					}
					free = append(free, int(c.UserData))
				} else if c.Res != int32(size) {
					return r, fmt.Errorf("shim send: %v", c)
				}
			}
		}
		return r, nil
	})
}

func sendUring(size int, total int64, zc bool) (result, error) {
	name := "io_uring SEND"
	if zc {
		name = "io_uring SEND_ZC"
	}
	return run(name, size, total, func(fd int, mem []byte) (result, error) {
		var r result
		ring, err := uring.New(4*slots, nil)
		if err != nil {
			return r, err
		}
		defer ring.Close()
		free := make([]int, 0, slots)
		for i := 0; i < slots; i++ {
			free = append(free, i)
		}
		cs := make([]uring.CQE, 4*slots)
		var queued int64
		for queued < total || len(free) < slots {
			for len(free) > 0 && queued < total {
				s := free[len(free)-1]
				free = free[:len(free)-1]
				sqe := ring.GetSQE()
				addr := uintptr(unsafe.Pointer(&mem[s*size]))
				if zc {
					sqe.PrepSendZC(int32(fd), addr, uint32(size), 0, uring.SendZCReportUsage)
				} else {
					sqe.PrepSend(int32(fd), addr, uint32(size), unix.MSG_WAITALL)
				}
				sqe.UserData = uint64(s)
				queued += int64(size)
			}
			if _, err := ring.SubmitAndWait(1); err != nil && !errors.Is(err, unix.EINTR) {
				return r, err
			}
			n := ring.PeekBatch(cs)
			for _, c := range cs[:n] {
				switch {
				case c.Notif():
					r.notifs++
					if c.ZCCopied() {
						r.copied++
					}
					free = append(free, int(c.UserData))
				case c.Res != int32(size):
					return r, fmt.Errorf("%s: res %d", name, c.Res)
				case !c.More():
					free = append(free, int(c.UserData)) // copying send: done
				}
			}
		}
		r.syscalls = int64(ring.Stats().Enters)
		return r, nil
	})
}

func main() {
	totalMB := flag.Int("mb", 64, "MiB per variant and repetition")
	reps := flag.Int("reps", 3, "repetitions, interleaved; the median is reported")
	flag.Parse()
	total := int64(*totalMB) << 20
	failed := false
	for _, size := range []int{64 << 10, 256 << 10} {
		variants := []func() (result, error){
			func() (result, error) { return sendPlain(size, total) },
			func() (result, error) { return sendShim(size, total) },
			func() (result, error) { return sendUring(size, total, false) },
			func() (result, error) { return sendUring(size, total, true) },
		}
		runs := make([][]result, len(variants))
		for rep := 0; rep < *reps; rep++ {
			for i, v := range variants {
				r, err := v()
				if err != nil {
					fmt.Printf("MEASURE ERROR size=%d %s: %v\n", size, r.name, err)
					failed = true
					continue
				}
				runs[i] = append(runs[i], r)
			}
		}
		var base result
		for _, rs := range runs {
			if len(rs) == 0 {
				continue
			}
			sort.Slice(rs, func(a, b int) bool { return rs[a].mbps() < rs[b].mbps() })
			r := rs[len(rs)/2]
			if base.name == "" {
				base = r
			}
			fmt.Printf("MEASURE size=%dKiB %-17s %8.1f MB/s  %7.0f syscalls/GB  x%.2f vs send(2) throughput  x%.2f syscalls  copied notifs %d/%d\n",
				size>>10, r.name, r.mbps(), r.perGB(), r.mbps()/base.mbps(), r.perGB()/base.perGB(), r.copied, r.notifs)
		}
	}
	if failed {
		os.Exit(1)
	}
}
