package loop

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/zcnet/zcnet/internal/leakcheck"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
)

func TestMain(m *testing.M) {
	os.Exit(leakcheck.Main(m, 0,
		leakcheck.Check{Name: "rings", Open: uring.OpenRings},
		leakcheck.Check{Name: "regions", Open: memreg.OpenRegions},
		leakcheck.Check{Name: "buffer rings", Open: uring.OpenBufRings},
	))
}

func newQueue(t testing.TB, cfg Config) *Queue {
	t.Helper()
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

func TestPostDoWake(t *testing.T) {
	q := newQueue(t, Config{NoPin: true, SendBufs: 4, RecvBufs: 4})
	// Posts from many goroutines run in per-producer order, and sleeping queues wake up.
	var mu sync.Mutex
	seen := map[int][]int{}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				i := i
				if err := q.Post(func() { mu.Lock(); seen[g] = append(seen[g], i); mu.Unlock() }); err != nil {
					t.Error(err)
				}
				if i%100 == 0 {
					time.Sleep(time.Millisecond) // let the queue fall asleep
				}
			}
		}(g)
	}
	wg.Wait()
	if err := q.Do(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	for g := 0; g < 4; g++ {
		if len(seen[g]) != 500 {
			t.Fatalf("producer %d: %d of 500 tasks ran", g, len(seen[g]))
		}
		for i, v := range seen[g] {
			if v != i {
				t.Fatalf("producer %d: task %d ran as %d-th", g, v, i)
			}
		}
	}
	if q.Stats().Wakeups == 0 {
		t.Error("queue never needed a wakeup: the sleep path was not exercised")
	}
	want := errors.New("x")
	if err := q.Do(func() error { return want }); err != want {
		t.Fatalf("Do = %v", err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close = %v", err)
	}
	if err := q.Post(func() {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Post after Close = %v", err)
	}
	if err := q.Do(func() error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close = %v", err)
	}
}

type recvOwner struct {
	id    uint32
	fd    int
	got   bytes.Buffer
	hold  []memreg.Buf
	done  chan struct{}
	want  int
	arms  int
	holdN int
	err   error
}

func (o *recvOwner) arm(q *Queue) {
	o.arms++
	sqe := q.GetSQE()
	sqe.PrepRecvMultishot(int32(o.fd), q.BufGroup(), 0, q.Bundles())
	sqe.UserData = UserData(o.id, 1)
}

func (o *recvOwner) OnCQE(q *Queue, c uring.CQE) {
	if o.want == 1<<62 {
		return // finished; the cancelled recv's last CQE
	}
	switch {
	case c.Res == -int32(unix.ENOBUFS):
		q.NoteBufRingEmpty()
		for _, b := range o.hold {
			b.Release()
		}
		o.hold = nil
	case c.Res < 0:
		o.err = unix.Errno(-c.Res)
		o.want = 1 << 62
		close(o.done)
		return
	default:
		q.Received(c, func(b memreg.Buf, n int) {
			o.got.Write(b.Bytes()[:n])
			if len(o.hold) < o.holdN {
				o.hold = append(o.hold, b)
			} else {
				b.Release()
			}
		})
	}
	if o.got.Len() >= o.want {
		for _, b := range o.hold {
			b.Release()
		}
		o.hold = nil
		q.GetSQE().PrepCancel(UserData(o.id, 1), 0)
		close(o.done)
		o.want = 1 << 62
		return
	}
	if !c.More() {
		if c.Res == -int32(unix.ENOBUFS) {
			q.WaitBuffers(o)
			return
		}
		o.arm(q)
	}
}

func (o *recvOwner) Flush(q *Queue) {
	o.arm(q)
}

func TestReceiveThroughBufferRing(t *testing.T) {
	for _, bundles := range []bool{false, true} {
		t.Run(fmt.Sprintf("bundles=%v", bundles), func(t *testing.T) {
			q := newQueue(t, Config{NoPin: true, SendBufs: 4, RecvBufs: 8, RecvBufSize: 4096, NoBundles: !bundles})
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fds[0])
			defer unix.Close(fds[1])
			const size = 2 << 20
			o := &recvOwner{fd: fds[1], done: make(chan struct{}), want: size, holdN: 6}
			if err := q.Do(func() error { o.id = q.AddOwner(o); o.arm(q); return nil }); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, size)
			for i := range want {
				want[i] = byte(i*31 + i>>9)
			}
			go func() {
				for off := 0; off < size; {
					n, err := unix.Write(fds[0], want[off:min(size, off+50000)])
					if err != nil {
						return
					}
					off += n
				}
			}()
			select {
			case <-o.done:
			case <-time.After(5 * time.Second):
				q.Post(func() {
					t.Logf("got %d arms %d hold %d stats %+v free %d lent %d", o.got.Len(), o.arms, len(o.hold), q.Stats(), q.recv.Free(), q.recv.Lent())
				})
				time.Sleep(100 * time.Millisecond)
				t.Fatal("timed out")
			}
			q.Do(func() error { return nil })
			if !bytes.Equal(o.got.Bytes(), want) {
				t.Fatal("received data differs")
			}
			st := q.Stats()
			if st.BundleMismatch != 0 || st.StrayCQEs != 0 {
				t.Fatalf("stats %+v", st)
			}
			// Without bundles an empty ring ends the multishot recv with ENOBUFS; with bundles the
			// kernel ends it without F_MORE once a bundle took the last buffers. Either way the
			// recv must have been re-armed.
			if st.BufRingEmpty == 0 && o.arms <= 1 {
				t.Error("buffer ring never ran dry: re-arm path not exercised")
			}
			t.Logf("%d re-arms, stats %+v", o.arms, st)
		})
	}
}
