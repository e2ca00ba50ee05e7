package shim

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

// TestPeerClosed: RECV sees EOF as res 0; a SEND to a reset connection
// fails with EPIPE/ECONNRESET and still posts its notification.
func TestPeerClosed(t *testing.T) {
	q := open(t, Config{Entries: 16})
	a, b := tcpPair(t)
	id, _ := q.Attach(a)
	mem := mmap(t, 1<<20)
	k, _ := q.RegisterBytes(mem, 0)
	q.PrepRecv(id, k, 0, 100, 1)
	q.Submit(-1, 0, 0)
	unix.Shutdown(b, unix.SHUT_WR)
	if c := reap(t, q, 1, 5*time.Second)[0]; c.Res != 0 || c.UserData != 1 {
		t.Fatalf("recv at EOF: %v, want res 0", c)
	}
	// Reset the connection: close b with unread data pending.
	unix.Write(a, []byte("unread"))
	time.Sleep(50 * time.Millisecond)
	unix.SetsockoptLinger(b, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	unix.Close(b)
	time.Sleep(50 * time.Millisecond)
	var sawErr bool
	for i := 0; i < 4 && !sawErr; i++ {
		q.PrepSend(id, k, 0, 1<<20, uint64(10+i))
		cs := reap(t, q, 2, 10*time.Second)
		var done, notif bool
		for _, c := range cs {
			if c.Notif() {
				notif = true
				continue
			}
			done = true
			if c.Res < 0 {
				if !errors.Is(c.Err(), unix.EPIPE) && !errors.Is(c.Err(), unix.ECONNRESET) {
					t.Fatalf("send to a reset peer: %v", c)
				}
				sawErr = true
			}
		}
		if !done || !notif {
			t.Fatalf("send %d: completion %v notification %v", i, done, notif)
		}
	}
	if !sawErr {
		t.Fatal("sends to a reset connection kept succeeding")
	}
}

// TestParallelQueues runs four queues on four goroutines (OS threads) at
// once, each streaming 8 MiB through its own socket with checksums, to
// shake out races between contexts, the workqueue and softirq callbacks.
func TestParallelQueues(t *testing.T) {
	open(t, Config{Entries: 1}).Close() // probe
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		a, b := tcpPair(t)
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			errs <- streamOne(a, b, 8<<20, uint64(w))
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func streamOne(a, b, total int, seed uint64) error {
	q, err := Open(Config{Entries: 16})
	if err != nil {
		return err
	}
	defer q.Close()
	id, err := q.Attach(a)
	if err != nil {
		return err
	}
	const chunk, slots = 128 << 10, 4
	mem, err := Mmap(chunk * slots)
	if err != nil {
		return err
	}
	defer Munmap(mem)
	k, err := q.RegisterBytes(mem, 0)
	if err != nil {
		return err
	}
	rh := sha256.New()
	got := drain(b, rh)
	sh := sha256.New()
	free := []int{0, 1, 2, 3}
	cs := make([]Completion, 16)
	sent := 0
	for sent < total || len(free) < slots {
		for len(free) > 0 && sent < total {
			s := free[len(free)-1]
			free = free[:len(free)-1]
			buf := mem[s*chunk : (s+1)*chunk]
			fill(buf, seed<<32|uint64(sent))
			sh.Write(buf)
			q.PrepSend(id, k, uint64(s*chunk), chunk, uint64(s))
			sent += chunk
		}
		if _, err := q.Submit(-1, 1, 20*time.Second); err != nil {
			return err
		}
		for _, c := range cs[:q.Completions(cs)] {
			if c.Notif() {
				free = append(free, int(c.UserData))
			} else if c.Res != chunk {
				return fmt.Errorf("send: %v", c)
			}
		}
	}
	unix.Shutdown(a, unix.SHUT_WR)
	if n := <-got; n != int64(total) {
		return fmt.Errorf("got %d of %d bytes", n, total)
	}
	if string(rh.Sum(nil)) != string(sh.Sum(nil)) {
		return fmt.Errorf("stream %d: checksum mismatch", seed)
	}
	return nil
}

// TestIPv6: an IPv6 TCP socket works like an IPv4 one.
func TestIPv6(t *testing.T) {
	testutil.RequireIPv6Loopback(t)
	q := open(t, Config{Entries: 8})
	ln, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ln)
	if err := unix.Bind(ln, &unix.SockaddrInet6{Addr: [16]byte{15: 1}}); err != nil {
		t.Fatal(err)
	}
	unix.Listen(ln, 1)
	sa, _ := unix.Getsockname(ln)
	c, _ := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	defer unix.Close(c)
	if err := unix.Connect(c, sa); err != nil {
		t.Fatal(err)
	}
	s, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(s)
	id, err := q.Attach(c)
	if err != nil {
		t.Fatalf("attach IPv6: %v", err)
	}
	mem := mmap(t, 256<<10)
	fill(mem, 6)
	k, _ := q.RegisterBytes(mem, RegionReadOnly)
	rh := &recorder{h: sha256.New()}
	got := drain(s, rh)
	q.PrepSend(id, k, 0, 256<<10, 1)
	cs := reap(t, q, 2, 10*time.Second)
	if cs[0].Res != 256<<10 || !cs[1].Notif() {
		t.Fatalf("IPv6 send: %v", cs)
	}
	unix.Shutdown(c, unix.SHUT_WR)
	<-got
	if string(rh.data) != string(mem) {
		t.Fatal("IPv6: data differs")
	}
}
