package cref

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bench/internal/frame"
)

// client is what one test connection does against the server.
type client func(t *testing.T, c *net.TCPConn, size int) (frames uint64, err error)

// serve runs server k for len(clients) connections on loopback, each driven by its client,
// and returns the server's result and error.
func serve(t *testing.T, k Kind, size, threads int, clients []client) (Result, []uint64, error) {
	t.Helper()
	if _, err := Build(k); err != nil {
		t.Fatalf("build c-%s: %v", k, err) // make test installs gcc and the uapi headers
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addrc := make(chan string, 1)
	type out struct {
		r   Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		r, err := Serve(ctx, k, Config{Addr: "127.0.0.1:0", Conns: len(clients), Size: size, Threads: threads},
			func(a string) { addrc <- a }, nil)
		done <- out{r, err}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case o := <-done:
		t.Fatalf("server ended before it listened: %v", o.err)
	}
	var d net.Dialer
	d.SetMultipathTCP(false)
	conns := make([]*net.TCPConn, len(clients))
	for i := range clients {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.TCPConn)
	}
	got := make([]uint64, len(clients))
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conns[i].Close()
			got[i], errs[i] = cl(t, conns[i], size)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("client %d: %v", i, err)
		}
	}
	o := <-done
	return o.r, got, o.err
}

// pingPong sends n frames one at a time and checks each echo.
func pingPong(n int) client {
	return func(t *testing.T, c *net.TCPConn, size int) (uint64, error) {
		src, _ := frame.NewSource(size, -1)
		v, _ := frame.NewVerifier(size, nil)
		req, resp := make([]byte, size), make([]byte, size)
		src.Fill(req)
		for range n {
			src.Stamp(req)
			if _, err := c.Write(req); err != nil {
				return v.Frames(), err
			}
			if _, err := io.ReadFull(c, resp); err != nil {
				return v.Frames(), err
			}
			if err := v.Feed(resp); err != nil {
				return v.Frames(), err
			}
		}
		return v.Frames(), nil
	}
}

// pipelined writes n frames in odd-sized pieces without waiting (the server sees chunks
// that start and end inside frames, and many in flight), then half-closes and reads every
// echoed byte up to the server's EOF.
func pipelined(n int) client {
	return func(t *testing.T, c *net.TCPConn, size int) (uint64, error) {
		src, _ := frame.NewSource(size, -1)
		all := make([]byte, 0, n*size)
		buf := make([]byte, size)
		src.Fill(buf)
		for range n {
			src.Stamp(buf)
			all = append(all, buf...)
		}
		werr := make(chan error, 1)
		go func() {
			rest := all
			for len(rest) > 0 {
				k := min(len(rest), 1237)
				if _, err := c.Write(rest[:k]); err != nil {
					werr <- err
					return
				}
				rest = rest[k:]
			}
			werr <- c.CloseWrite() // half-close: the server must still echo everything
		}()
		v, _ := frame.NewVerifier(size, nil)
		rb := make([]byte, 64<<10)
		for {
			k, err := c.Read(rb)
			if k > 0 {
				if ferr := v.Feed(rb[:k]); ferr != nil {
					return v.Frames(), ferr
				}
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return v.Frames(), err
			}
		}
		if err := <-werr; err != nil {
			return v.Frames(), err
		}
		if v.Frames() != uint64(n) {
			return v.Frames(), fmt.Errorf("got %d frames back before EOF, sent %d", v.Frames(), n)
		}
		return v.Frames(), v.Close()
	}
}

// reset sends two frames and half of a third, reads the two back, and resets the
// connection (SO_LINGER 0).
func reset(t *testing.T, c *net.TCPConn, size int) (uint64, error) {
	f, err := pingPong(2)(t, c, size)
	if err != nil {
		return f, err
	}
	src, _ := frame.NewSource(size, -1)
	buf := make([]byte, size)
	src.Fill(buf)
	src.Stamp(buf)
	src.Stamp(buf)
	src.Stamp(buf) // frame 2
	if _, err := c.Write(buf[:size/2]); err != nil {
		return f, err
	}
	time.Sleep(10 * time.Millisecond) // let the half frame arrive first (not a timing assertion)
	if err := c.SetLinger(0); err != nil {
		return f, err
	}
	return f, nil // serve closes it: a reset
}

// corrupt sends frame 0 with one payload byte flipped under the intact checksum.
func corrupt(t *testing.T, c *net.TCPConn, size int) (uint64, error) {
	src, _ := frame.NewSource(size, 0)
	buf := make([]byte, size)
	src.Fill(buf)
	src.Stamp(buf)
	if _, err := c.Write(buf); err != nil {
		return 0, err
	}
	_, _ = io.ReadAll(c) // the server exits: EOF or a reset
	return 0, nil
}

var kinds = []Kind{Uring, Epoll}

// kernelAtLeast reports whether the running kernel is major.minor or newer.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("kernel release %q: %v", unix.ByteSliceToString(u.Release[:]), err)
	}
	return ma > major || ma == major && mi >= minor
}

func TestEcho(t *testing.T) {
	for _, k := range kinds {
		for _, size := range []int{64, 1024, 100 << 10} {
			for _, threads := range []int{1, 2} {
				t.Run(fmt.Sprintf("%s/%d/threads%d", k, size, threads), func(t *testing.T) {
					n := 200
					if size > 4096 {
						n = 20
					}
					clients := []client{pingPong(n), pingPong(n), pipelined(n), pipelined(n), pingPong(1)}
					r, got, err := serve(t, k, size, threads, clients)
					if err != nil {
						t.Fatal(err)
					}
					want := uint64(4*n + 1)
					sum := uint64(0)
					for _, g := range got {
						sum += g
					}
					if sum != want || r.Frames != want || r.Bytes != want*uint64(size) {
						t.Errorf("clients verified %d frames, server %d (%d bytes), want %d", sum, r.Frames, r.Bytes, want)
					}
					if r.Resets != 0 || r.Threads != threads {
						t.Errorf("resets %d threads %d, want 0 and %d", r.Resets, r.Threads, threads)
					}
					if r.Wall <= 0 || r.User+r.Sys < 0 || r.Setup == "" {
						t.Errorf("window %v, CPU %v+%v, setup %q", r.Wall, r.User, r.Sys, r.Setup)
					}
					t.Logf("c-%s: %s, %d frames, CPU %v", k, r.Setup, r.Frames, r.User+r.Sys)
					// Every feature c-uring asks for is in Linux 6.1 (DEFER_TASKRUN is the
					// newest): on such a kernel a fallback is a failure, not a choice.
					if want := "SINGLE_ISSUER|DEFER_TASKRUN,registered-ring,fixed-files"; k == Uring && kernelAtLeast(t, 6, 1) && r.Setup != want {
						t.Errorf("c-uring set up as %q on this kernel, want %q", r.Setup, want)
					}
				})
			}
		}
	}
}

// A reset connection is counted and the others are served to their end.
func TestReset(t *testing.T) {
	for _, k := range kinds {
		t.Run(string(k), func(t *testing.T) {
			r, _, err := serve(t, k, 64, 1, []client{pingPong(50), reset, pipelined(50)})
			if err != nil {
				t.Fatal(err)
			}
			if r.Resets != 1 {
				t.Errorf("resets %d, want 1", r.Resets)
			}
			if r.Frames != 102 {
				t.Errorf("server verified %d frames, want 102 (50 + 2 + 50)", r.Frames)
			}
		})
	}
}

// A wrong byte fails the server with frame.ErrCorrupt.
func TestCorrupt(t *testing.T) {
	for _, k := range kinds {
		t.Run(string(k), func(t *testing.T) {
			_, _, err := serve(t, k, 64, 1, []client{corrupt})
			if !errors.Is(err, frame.ErrCorrupt) || !strings.Contains(err.Error(), "payload CRC-32C") {
				t.Fatalf("err = %v, want ErrCorrupt naming the payload CRC-32C", err)
			}
		})
	}
}

// Cancelling the context ends the server (by its PID) and Serve says so.
func TestCancel(t *testing.T) {
	for _, k := range kinds {
		t.Run(string(k), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			_, err := Serve(ctx, k, Config{Addr: "127.0.0.1:0", Conns: 1, Size: 64}, func(string) { cancel() }, nil)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
		})
	}
}

func TestPayloadCRC(t *testing.T) {
	for _, size := range []int{32, 64, 1024} {
		src, _ := frame.NewSource(size, -1)
		buf := make([]byte, size)
		src.Fill(buf)
		src.Stamp(buf)
		if got, want := PayloadCRC(size), uint32(buf[size-8])|uint32(buf[size-7])<<8|uint32(buf[size-6])<<16|uint32(buf[size-5])<<24; got != want {
			t.Errorf("size %d: PayloadCRC %08x, the frame says %08x", size, got, want)
		}
	}
}

func TestParseResult(t *testing.T) {
	r, err := parseResult("frames=3 bytes=192 wall_ns=1500 user_us=7 sys_us=9 resets=1 threads=2 setup=SINGLE_ISSUER|DEFER_TASKRUN")
	if err != nil {
		t.Fatal(err)
	}
	want := Result{Frames: 3, Bytes: 192, Wall: 1500, User: 7 * time.Microsecond, Sys: 9 * time.Microsecond,
		Resets: 1, Threads: 2, Setup: "SINGLE_ISSUER|DEFER_TASKRUN"}
	if r != want {
		t.Errorf("got %+v, want %+v", r, want)
	}
	if _, err := parseResult("frames=x"); err == nil {
		t.Error("a bad field parsed")
	}
}

// $ZCBENCH_CREF_BIN points Build at prebuilt servers (the bench kit), and says when one
// is missing.
func TestPrebuilt(t *testing.T) {
	bin, err := Build(Epoll)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "c-epoll"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(BinDirEnv, dir)
	buildMu.Lock()
	saved := built
	built = map[Kind]string{}
	buildMu.Unlock()
	t.Cleanup(func() {
		buildMu.Lock()
		built = saved
		buildMu.Unlock()
	})
	if p, err := Build(Epoll); err != nil || p != filepath.Join(dir, "c-epoll") {
		t.Errorf("Build(epoll) = %q, %v; want the prebuilt one", p, err)
	}
	if _, err := Build(Uring); err == nil || !strings.Contains(err.Error(), "has no executable c-uring") {
		t.Errorf("Build(uring) without a prebuilt one: %v", err)
	}
	r, _, err := serve(t, Epoll, 64, 1, []client{pingPong(10)})
	if err != nil || r.Frames != 10 {
		t.Errorf("prebuilt server: %d frames, %v", r.Frames, err)
	}
}

// resetWhileSending writes frames without reading the echoes, so the server's sends back up
// behind a full socket, then resets the connection: the server's sends and its armed recv
// fail, and it must still end.
func resetWhileSending(t *testing.T, c *net.TCPConn, size int) (uint64, error) {
	src, _ := frame.NewSource(size, -1)
	buf := make([]byte, size)
	src.Fill(buf)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 64 {
			src.Stamp(buf)
			if _, err := c.Write(buf); err != nil {
				return // the reset below ends the writes
			}
		}
	}()
	time.Sleep(50 * time.Millisecond) // some sends back up first (not a timing assertion)
	if err := c.SetLinger(0); err != nil {
		return 0, err
	}
	c.Close()
	<-done
	return 0, nil
}

func TestResetWhileSending(t *testing.T) {
	for _, k := range kinds {
		t.Run(string(k), func(t *testing.T) {
			r, _, err := serve(t, k, 64<<10, 1, []client{resetWhileSending, pingPong(20)})
			if err != nil {
				t.Fatal(err)
			}
			if r.Resets != 1 || r.Frames < 20 {
				t.Errorf("resets %d, frames %d: want 1 reset and the other client's 20 frames at least", r.Resets, r.Frames)
			}
		})
	}
}
