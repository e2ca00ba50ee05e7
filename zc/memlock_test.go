package zc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/memregops"
	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/memreg"
)

const memlockChildEnv = "ZC_MEMLOCK_CHILD"

// TestMemlockNonRoot runs a child as an unprivileged user (nobody: no CAP_IPC_LOCK) under
// the default 8 MiB RLIMIT_MEMLOCK, with the default Config: the send pools cannot all grow
// to their caps, which New must report, and 8 writers × 32 MiB to slow readers must still
// deliver every byte (growth refused by the limit is a cap: senders wait, they do not fail).
func TestMemlockNonRoot(t *testing.T) {
	out, err := testutil.RunAsNobody(t, memlockChildEnv+"=1")
	if err != nil || !strings.Contains(out, "MEMLOCK-CHILD-OK") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("child:\n%s", strings.TrimSpace(out))
}

// memlockChild is the unprivileged side of TestMemlockNonRoot.
func memlockChild() int {
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: 8 << 20, Max: 8 << 20}); err != nil {
		fmt.Println("setrlimit:", err)
		return 1
	}
	if _, ok := memregops.MemlockLimit(); !ok {
		fmt.Println("the child still has CAP_IPC_LOCK or no limit")
		return 1
	}
	var limits []error
	var lmu sync.Mutex
	e, err := New(Config{Queues: 2, NoFallback: true, OnLimit: func(err error) {
		lmu.Lock()
		limits = append(limits, err)
		lmu.Unlock()
	}})
	if err != nil {
		fmt.Println("New:", err)
		return 1
	}
	defer e.Close()
	lmu.Lock()
	var le *LimitError
	var me *memreg.MemlockError
	if len(limits) == 0 || !errors.As(limits[0], &le) || le.Queue != -1 || !errors.As(limits[0], &me) || !e.Stats().Memory.MemlockShort {
		fmt.Printf("New did not report the short limit: %v, stats %v\n", limits, e.Stats().Memory.MemlockShort)
		lmu.Unlock()
		return 1
	}
	fmt.Println("at New:", limits[0])
	lmu.Unlock()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("listen:", err)
		return 1
	}
	defer ln.Close()
	const writers, size = 8, 32 << 20
	pattern := make([]byte, 64<<10)
	for i := range pattern {
		pattern[i] = byte(i)
	}
	// Slow readers: each reads its stream in 64 KiB pieces with a pause, checking every byte.
	results := make(chan error, writers)
	go func() {
		for i := 0; i < writers; i++ {
			c, err := ln.Accept()
			if err != nil {
				results <- err
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				n := 0
				for {
					k, err := c.Read(buf)
					off := n % len(pattern)
					for p := buf[:k]; len(p) > 0; {
						m := min(len(p), len(pattern)-off)
						if !bytes.Equal(p[:m], pattern[off:off+m]) {
							results <- fmt.Errorf("stream corrupt near byte %d", n)
							return
						}
						p, off, n = p[m:], 0, n+m
					}
					time.Sleep(200 * time.Microsecond)
					if err == io.EOF {
						if n != size {
							err = fmt.Errorf("stream ended at %d of %d bytes", n, size)
						} else {
							err = nil
						}
						results <- err
						return
					}
					if err != nil {
						results <- fmt.Errorf("read after %d bytes: %w", n, err)
						return
					}
				}
			}()
		}
	}()
	// Half of the writers block in Write on their own goroutines, half stream from the loop
	// (Buffer/Send, OnWritable).
	werrs := make(chan error, writers)
	for i := 0; i < writers; i++ {
		if i%2 == 0 {
			c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), HandlerFuncs{})
			if err != nil {
				fmt.Println("dial:", err)
				return 1
			}
			go func() {
				for left := size; left > 0; {
					k := min(left, len(pattern))
					if _, err := c.Write(pattern[:k]); err != nil {
						werrs <- fmt.Errorf("Write: %w", err)
						return
					}
					left -= k
				}
				werrs <- c.Close()
			}()
			continue
		}
		s := &loopStreamer{left: size, pattern: pattern, done: werrs}
		c, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), s)
		if err != nil {
			fmt.Println("dial:", err)
			return 1
		}
		c.Post(func() { s.pump(c) })
	}
	for i := 0; i < writers; i++ {
		if err := <-werrs; err != nil {
			fmt.Println("writer:", err)
			return 1
		}
	}
	for i := 0; i < writers; i++ {
		select {
		case err := <-results:
			if err != nil {
				fmt.Println("reader:", err)
				return 1
			}
		case <-time.After(3 * time.Minute):
			fmt.Printf("%d streams unfinished: %+v\n", writers-i, e.Stats())
			return 1
		}
	}
	st := e.Stats()
	fmt.Printf("%d × %d MiB delivered; send pools %d bytes, memlock caps %d, pool waits %d\n",
		writers, size>>20, st.Memory.SendPoolBytes, st.Memory.MemlockCaps, st.Send.PoolWaits)
	if st.Memory.MemlockCaps == 0 {
		fmt.Println("no growth was refused: the test did not reach the limit")
		return 1
	}
	fmt.Println("MEMLOCK-CHILD-OK")
	return 0
}

// loopStreamer sends the pattern from the loop, as ExampleWritable does.
type loopStreamer struct {
	HandlerFuncs
	left, off int
	pattern   []byte
	done      chan error
	ended     bool
}

func (s *loopStreamer) OnWritable(c *Conn) { s.pump(c) }

func (s *loopStreamer) pump(c *Conn) {
	for s.left > 0 && c.Queued() < c.e.cfg.MaxQueuedBytes {
		b, err := c.Buffer()
		if errors.Is(err, memreg.ErrExhausted) {
			return // OnWritable comes when a buffer is free for us
		}
		if err != nil {
			s.end(err)
			return
		}
		n := 0
		for p := b.Bytes()[:min(len(b.Bytes()), s.left)]; len(p) > 0; {
			k := copy(p, s.pattern[s.off:])
			p, n, s.off = p[k:], n+k, (s.off+k)%len(s.pattern)
		}
		if err := c.Send(b, n); err != nil {
			s.end(err)
			return
		}
		s.left -= n
	}
	if s.left == 0 {
		s.end(c.Close())
	}
}

func (s *loopStreamer) end(err error) {
	if !s.ended {
		s.ended = true
		s.done <- err
	}
}
