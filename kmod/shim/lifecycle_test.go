package shim

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// recorder hashes and keeps everything written to it.
type recorder struct {
	h    hash.Hash
	data []byte
}

func (r *recorder) Write(b []byte) (int, error) {
	r.data = append(r.data, b...)
	return r.h.Write(b)
}

// drain reads fd until EOF or error, hashing what arrives, in a goroutine.
func drain(fd int, h io.Writer) <-chan int64 {
	done := make(chan int64, 1)
	go func() {
		buf := make([]byte, 1<<20)
		var total int64
		for {
			n, err := unix.Read(fd, buf)
			if err == unix.EINTR {
				continue
			}
			if n <= 0 || err != nil {
				break
			}
			if h != nil {
				h.Write(buf[:n])
			}
			total += int64(n)
		}
		done <- total
	}()
	return done
}

// fillSocket queues sends on a socket whose peer does not read until the
// shim reports operations waiting for space.
func fillSocket(t *testing.T, q *Queue, id SockID, k RegionKey, size int) int {
	t.Helper()
	n := 0
	for i := 0; i < 64; i++ {
		if err := q.PrepSend(id, k, 0, uint32(size), uint64(5000+i)); err != nil {
			break
		}
		n++
		if _, err := q.Submit(-1, 0, 0); err != nil {
			t.Fatal(err)
		}
		if st, _ := q.Stats(); st.Ops > 1 {
			return n
		}
	}
	t.Fatalf("no send waited for socket space after %d sends", n)
	return n
}

// TestBulk sends 48 MiB through the shim with up to 8 sends in flight and
// checks the receiver's SHA-256 and the completion/notification counts.
func TestBulk(t *testing.T) {
	q := open(t, Config{Entries: 16})
	a, b := tcpPair(t)
	id, err := q.Attach(a)
	if err != nil {
		t.Fatal(err)
	}
	const chunk, slots, total = 256 << 10, 8, 48 << 20
	mem := mmap(t, chunk*slots)
	k, err := q.RegisterBytes(mem, RegionReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	rh := &recorder{h: sha256.New()}
	got := drain(b, rh)
	sh := sha256.New()
	free := make([]int, 0, slots)
	for i := 0; i < slots; i++ {
		free = append(free, i)
	}
	var sent, completions, notifs, copied int
	cs := make([]Completion, 32)
	seq := uint64(0)
	for sent < total || len(free) < slots {
		for len(free) > 0 && sent < total {
			slot := free[len(free)-1]
			free = free[:len(free)-1]
			buf := mem[slot*chunk : (slot+1)*chunk]
			fill(buf, seq)
			sh.Write(buf)
			seq++
			if err := q.PrepSend(id, k, uint64(slot*chunk), chunk, uint64(slot)); err != nil {
				t.Fatal(err)
			}
			sent += chunk
		}
		if _, err := q.Submit(-1, 1, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		n := q.Completions(cs)
		for _, c := range cs[:n] {
			switch {
			case c.Notif():
				notifs++
				if c.Copied() {
					copied++
				}
				free = append(free, int(c.UserData)) // the slot may be rewritten now
			case c.Res != chunk || !c.More():
				t.Fatalf("send completion %v", c)
			default:
				completions++
			}
		}
	}
	unix.Shutdown(a, unix.SHUT_WR)
	select {
	case n := <-got:
		if n != total {
			t.Fatalf("receiver got %d bytes, want %d", n, total)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("receiver stuck")
	}
	if string(rh.h.Sum(nil)) != string(sh.Sum(nil)) {
		exp := make([]byte, chunk)
		for i := 0; i < total/chunk; i++ {
			fill(exp, uint64(i))
			if g := rh.data[i*chunk : (i+1)*chunk]; string(g) != string(exp) {
				first := 0
				for first < chunk && g[first] == exp[first] {
					first++
				}
				later := -1
				for j := i + 1; j < i+64 && j < total/chunk; j++ {
					fill(exp, uint64(j))
					if string(g[first:first+64]) == string(exp[first:first+64]) {
						later = j
						break
					}
				}
				t.Fatalf("SHA-256 differs: chunk %d differs from byte %d on; those bytes belong to chunk %d (-1: none)", i, first, later)
			}
		}
		t.Fatal("SHA-256 of received data differs from what was sent")
	}
	if completions != total/chunk || notifs != total/chunk {
		t.Fatalf("%d completions, %d notifications, want %d each", completions, notifs, total/chunk)
	}
	t.Logf("48 MiB in %d sends, sha256 ok, %d/%d notifications reported copied (loopback delivery copies)", completions, copied, notifs)
}

// TestDetachCancels: queued operations complete with ECANCELED on Detach;
// a partly sent SEND reports its bytes and still gets its notification.
func TestDetachCancels(t *testing.T) {
	q := open(t, Config{Entries: 64})
	a, b := tcpPair(t)
	ida, _ := q.Attach(a)
	idb, _ := q.Attach(b)
	mem := mmap(t, 1<<20)
	k, _ := q.RegisterBytes(mem, 0)
	q.PrepRecv(idb, k, 0, 100, 1)
	q.Submit(-1, 0, 0)
	if q.Ready() != 0 {
		t.Fatal("recv completed with no data")
	}
	if err := q.Detach(idb); err != nil {
		t.Fatal(err)
	}
	c := reap(t, q, 1, 5*time.Second)[0]
	if c.UserData != 1 || !errors.Is(c.Err(), unix.ECANCELED) {
		t.Fatalf("recv after detach: %v, want ECANCELED", c)
	}
	n := fillSocket(t, q, ida, k, 1<<20)
	if err := q.Detach(ida); err != nil {
		t.Fatal(err)
	}
	// Notifications come once the peer has taken the data queued so far.
	got := drain(b, nil)
	defer func() { unix.Shutdown(a, unix.SHUT_WR); <-got }()
	// Every send completes (bytes or ECANCELED); then all notifications.
	var canceled, more, notif int
	for _, c := range reap(t, q, 2*n, 20*time.Second) {
		switch {
		case c.Notif():
			notif++
		case errors.Is(c.Err(), unix.ECANCELED):
			canceled++
			more++
		case c.More() && c.Res > 0:
			more++
		default:
			t.Fatalf("unexpected %v", c)
		}
	}
	if canceled == 0 || more != n || notif != n {
		t.Fatalf("%d sends: %d completions (%d cancelled), %d notifications", n, more, canceled, notif)
	}
}

// TestUnregisterWhileSending: unregistering a region with a send in flight
// succeeds at once; the pages stay pinned until the notification.
func TestUnregisterWhileSending(t *testing.T) {
	q := open(t, Config{Entries: 64})
	a, b := tcpPair(t)
	id, _ := q.Attach(a)
	mem := mmap(t, 1<<20)
	fill(mem, 7)
	k, _ := q.RegisterBytes(mem, RegionReadOnly)
	n := fillSocket(t, q, id, k, 1<<20)
	if err := q.Unregister(k); err != nil {
		t.Fatal(err)
	}
	st, _ := q.Stats()
	if st.Regions == 0 || st.PinnedPages == 0 {
		t.Fatalf("region freed while sends use it: %+v", st)
	}
	got := drain(b, nil)
	cs := reap(t, q, 2*n, 30*time.Second)
	for _, c := range cs {
		if !c.Notif() && c.Res != 1<<20 {
			t.Fatalf("send %v", c)
		}
	}
	unix.Shutdown(a, unix.SHUT_WR)
	if total := <-got; total != int64(n)<<20 {
		t.Fatalf("peer got %d bytes, want %d", total, n<<20)
	}
}

// TestCloseWithSendsInFlight closes the queue while sends wait for socket
// space and the stack holds pages; nothing leaks once the peer goes away.
func TestCloseWithSendsInFlight(t *testing.T) {
	before, _ := ReadStats()
	q := open(t, Config{Entries: 64})
	a, b := tcpPair(t)
	id, _ := q.Attach(a)
	mem := mmap(t, 1<<20)
	k, _ := q.RegisterBytes(mem, 0)
	fillSocket(t, q, id, k, 1<<20)
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	st, _ := ReadStats()
	t.Logf("after close, before the peer reads: %+v", st)
	// The peer reads everything and both ends close: the stack lets go.
	got := drain(b, nil)
	unix.Shutdown(a, unix.SHUT_WR)
	<-got
	if st, err := waitIdle(before.Contexts-1, 20*time.Second); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("idle again: %+v", st)
	}
}

// TestKillWithSendsInFlight: a child process queues sends on a socket whose
// peer (us) does not read, then is SIGKILLed. The module must release the
// context, regions and notifications once the peer drains, with no leak.
func TestKillWithSendsInFlight(t *testing.T) {
	open(t, Config{Entries: 1}).Close() // probe
	before, _ := ReadStats()
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ln)
	unix.Bind(ln, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
	unix.Listen(ln, 1)
	sa, _ := unix.Getsockname(ln)
	port := sa.(*unix.SockaddrInet4).Port

	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), "ZCSHIM_HELPER=sender", fmt.Sprintf("ZCSHIM_PORT=%d", port))
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	peer, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(peer)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "READY") {
		t.Fatalf("child: %q %v", line, err)
	}
	st, _ := ReadStats()
	t.Logf("child %d: %s; module: %+v", cmd.Process.Pid, strings.TrimSpace(line), st)
	if st.Ops == 0 || st.Notifs == 0 {
		t.Fatalf("child has nothing in flight: %+v", st)
	}
	waitInEnter(t, cmd.Process.Pid, 0, (<-chan int)(nil)) // the child waits in ENTER
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed = true
	cmd.Wait()
	got := drain(peer, nil)
	select {
	case n := <-got:
		t.Logf("peer drained %d bytes after the kill", n)
	case <-time.After(60 * time.Second):
		t.Fatal("peer never saw EOF")
	}
	if st, err := waitIdle(before.Contexts-1, 20*time.Second); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("idle again: %+v", st)
	}
}

// helperSender is the child of TestKillWithSendsInFlight.
func helperSender() {
	var port int
	fmt.Sscan(os.Getenv("ZCSHIM_PORT"), &port)
	fail := func(err error) { fmt.Fprintln(os.Stderr, "helper:", err); os.Exit(3) }
	q, err := Open(Config{Entries: 64})
	if err != nil {
		fail(err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		fail(err)
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: port}); err != nil {
		fail(err)
	}
	id, err := q.Attach(fd)
	if err != nil {
		fail(err)
	}
	unix.Close(fd) // the shim holds its own reference
	mem, err := Mmap(1 << 20)
	if err != nil {
		fail(err)
	}
	k, err := q.RegisterBytes(mem, 0)
	if err != nil {
		fail(err)
	}
	n := 0
	for ; n < 32; n++ {
		q.PrepSend(id, k, 0, 1<<20, uint64(n))
	}
	if _, err := q.Submit(-1, 0, 0); err != nil {
		fail(err)
	}
	st, _ := q.Stats()
	fmt.Printf("READY %d sends, %d ops waiting\n", n, st.Ops)
	// Die inside the kernel: wait for more completions than can ever come.
	_, cq := q.Entries()
	q.Submit(0, int(cq), 0)
	time.Sleep(time.Hour)
}

// TestNotifNotCopied: pages that the stack dropped without ever copying
// them (queued behind a full window, then purged by a reset) give
// notifications without COPIED — the flag is not a constant of loopback.
func TestNotifNotCopied(t *testing.T) {
	q := open(t, Config{Entries: 64})
	a, b := tcpPairRaw(t)
	defer unix.Close(a)
	id, _ := q.Attach(a)
	mem := mmap(t, 1<<20)
	k, _ := q.RegisterBytes(mem, 0)
	n := fillSocket(t, q, id, k, 1<<20)
	// The peer resets the connection (closing with unread data): the
	// sender's write queue is purged.
	unix.Close(b)
	var plain, copied, notifs int
	for _, c := range reap(t, q, 2*n, 20*time.Second) {
		if !c.Notif() {
			continue
		}
		notifs++
		if c.Copied() {
			copied++
		} else {
			plain++
		}
	}
	t.Logf("%d notifications: %d copied, %d not copied", notifs, copied, plain)
	if plain == 0 {
		t.Fatal("every notification says COPIED, even for data that was never delivered")
	}
}
