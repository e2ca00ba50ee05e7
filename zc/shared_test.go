package zc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/zcnet/zcnet/memreg"
)

// fanMsg fills p with message seq: its number, then a pattern that depends on it.
func fanMsg(p []byte, seq uint64) {
	binary.LittleEndian.PutUint64(p, seq)
	for i := 8; i < len(p); i++ {
		p[i] = byte(seq*7 + uint64(i))
	}
}

// checkMsg reports what is wrong with message p (nil: it is message seq, intact).
func checkMsg(p []byte, seq uint64) error {
	if got := binary.LittleEndian.Uint64(p); got != seq {
		return fmt.Errorf("message %d where %d was due", got, seq)
	}
	for i := 8; i < len(p); i++ {
		if p[i] != byte(seq*7+uint64(i)) {
			return fmt.Errorf("message %d: byte %d is %#x", seq, i, p[i])
		}
	}
	return nil
}

// subscribers accepts n connections on e from Go net clients and returns both ends
// (server side in accept order matched by index to the clients by the local port).
func subscribers(t *testing.T, e *Engine, n int, h func() Handler) ([]*Conn, []net.Conn) {
	t.Helper()
	acc := make(chan *Conn, n)
	l, err := e.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		acc <- c
		if h != nil {
			return h()
		}
		return HandlerFuncs{}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	clients := make([]net.Conn, n)
	byPort := map[int]int{}
	for i := range clients {
		nc, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		clients[i] = nc
		byPort[nc.LocalAddr().(*net.TCPAddr).Port] = i
	}
	conns := make([]*Conn, n)
	for range clients {
		c := recvEvent(t, acc, "accept")
		conns[byPort[int(c.raddr.Port())]] = c
	}
	return conns, clients
}

// TestSharedSend: one buffer sent to many connections, every byte checked; the buffer
// returns to its pool once every send is done; misuse gets typed errors.
func TestSharedSend(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testSharedSend(t, b, SendAdaptive) })
	// every send zero-copy: each buffer comes back after the last notification
	t.Run("io_uring-zerocopy", func(t *testing.T) { testSharedSend(t, BackendIOUring, SendZeroCopy) })
}

func testSharedSend(t *testing.T, b Backend, path SendPath) {
	e := newEngine(t, Config{Backend: b, SendPath: path, ZCThreshold: 512, SendBufSize: 4096, SendBufs: 4, SendPoolMax: 16 * 4096})
	const nsubs, nmsgs, size = 12, 300, 1000
	conns, clients := subscribers(t, e, nsubs, nil)
	errs := make(chan error, nsubs)
	for _, nc := range clients {
		go func() {
			p := make([]byte, size)
			for i := uint64(0); i < nmsgs; i++ {
				if _, err := io.ReadFull(nc, p); err != nil {
					errs <- err
					return
				}
				if err := checkMsg(p, i); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for i := uint64(0); i < nmsgs; i++ {
		buf, err := conns[0].BufferWait(0) // the pool holds 16: the sends must give them back
		if err != nil {
			t.Fatal(err)
		}
		fanMsg(buf.Bytes()[:size], i)
		sh, err := NewShared(buf, size)
		if err != nil {
			t.Fatal(err)
		}
		if buf.Valid() {
			t.Fatal("NewShared left the buffer handle valid")
		}
		for _, c := range conns {
			if err := sh.Send(c); err != nil {
				t.Fatal(err)
			}
		}
		if err := sh.Release(); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if err := sh.Release(); !errors.Is(err, memreg.ErrStale) {
				t.Errorf("second Release = %v, want ErrStale", err)
			}
			if err := sh.Send(conns[0]); !errors.Is(err, memreg.ErrStale) {
				t.Errorf("Send after Release = %v, want ErrStale", err)
			}
			if sh.Bytes() != nil {
				t.Error("Bytes after Release")
			}
		}
	}
	for range clients {
		if err := <-recvEvent(t, wrapErr(errs), "subscriber"); err != nil {
			t.Fatal(err)
		}
	}
	st := e.Stats()
	if st.Send.SharedSends != nsubs*nmsgs || st.Send.BytesShared != nsubs*nmsgs*size {
		t.Errorf("SharedSends %d BytesShared %d, want %d, %d", st.Send.SharedSends, st.Send.BytesShared, nsubs*nmsgs, nsubs*nmsgs*size)
	}
	if path == SendZeroCopy && st.Send.ZCOps == 0 {
		t.Error("no zero-copy send made")
	}
	waitSendBuffersBack(t, e)

	// Bad input.
	buf, _ := conns[0].Buffer()
	if _, err := NewShared(buf, 0); !errors.Is(err, ErrEmpty) || buf.Valid() {
		t.Errorf("NewShared(0) = %v (buffer kept: %v)", err, buf.Valid())
	}
	buf, _ = conns[0].Buffer()
	if _, err := NewShared(buf, 1<<20); !errors.Is(err, ErrTooLarge) {
		t.Errorf("NewShared(too large) = %v", err)
	}
	if _, err := NewShared(buf, 1); !errors.Is(err, memreg.ErrStale) {
		t.Errorf("NewShared(stale) = %v", err)
	}
	r, _ := memreg.New(memreg.Options{BufSize: 64, Count: 1})
	fb, _ := r.Get()
	if _, err := NewShared(fb, 1); !errors.Is(err, ErrForeignBuffer) {
		t.Errorf("NewShared(foreign) = %v", err)
	}
	r.Close()
	other := newEngine(t, Config{Backend: b})
	buf, _ = conns[0].Buffer()
	sh, _ := NewShared(buf, 10)
	oc, _ := subscribers(t, other, 1, nil)
	if err := sh.Send(oc[0]); !errors.Is(err, ErrForeignBuffer) {
		t.Errorf("Send on another engine's connection = %v", err)
	}
	conns[1].Close()
	<-conns[1].Done()
	if err := sh.Send(conns[1]); !errors.Is(err, ErrClosed) {
		t.Errorf("Send on a closed connection = %v", err)
	}
	sh.Release()
	waitSendBuffersBack(t, e)
}

func wrapErr(ch chan error) chan chan error {
	out := make(chan chan error, 1)
	go func() {
		err := <-ch
		c := make(chan error, 1)
		c <- err
		out <- c
	}()
	return out
}

// TestDataRetain: received Data forwarded to two connections with Retain + SendData,
// without a copy and without a send buffer; every byte checked; double Release and
// Retain after Release are typed errors.
func TestDataRetain(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testDataRetain(t, b) })
}

func testDataRetain(t *testing.T, b Backend) {
	e := newEngine(t, Config{Backend: b, Queues: 2, Debug: DebugOptions{Buffers: true, HeldData: time.Hour}})
	outs, outClients := subscribers(t, e, 2, nil)
	misuse := make(chan error, 4)
	var once sync.Once
	srcs, srcClients := subscribers(t, e, 1, func() Handler {
		return HandlerFuncs{Data: func(c *Conn, d Data) {
			r, err := d.Retain()
			if err != nil {
				misuse <- err
				d.Release()
				return
			}
			once.Do(func() {
				// misuse on a third reference
				x, _ := r.Retain()
				if err := x.Release(); err != nil {
					misuse <- err
				}
				if err := x.Release(); !errors.Is(err, memreg.ErrStale) {
					misuse <- fmt.Errorf("double Release of a reference = %v", err)
				}
				if _, err := x.Retain(); !errors.Is(err, memreg.ErrStale) {
					misuse <- fmt.Errorf("Retain after Release = %v", err)
				}
			})
			if err := outs[0].SendData(d); err != nil {
				misuse <- err
			}
			if err := outs[1].SendData(r); err != nil {
				misuse <- err
			}
		}}
	})
	_ = srcs
	const total = 4 << 20
	go func() {
		p := make([]byte, 64<<10)
		for off := 0; off < total; off += len(p) {
			for i := range p {
				p[i] = byte((off + i) / 3)
			}
			if _, err := srcClients[0].Write(p); err != nil {
				return
			}
		}
	}()
	done := make(chan error, 2)
	for _, nc := range outClients {
		go func() {
			p := make([]byte, 32<<10)
			got := 0
			for got < total {
				n, err := nc.Read(p)
				for i := 0; i < n; i++ {
					if p[i] != byte((got+i)/3) {
						done <- fmt.Errorf("byte %d is %#x", got+i, p[i])
						return
					}
				}
				got += n
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range outClients {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case err := <-misuse:
			t.Fatal(err)
		case <-time.After(30 * time.Second):
			t.Fatal("timed out")
		}
	}
	select {
	case err := <-misuse:
		t.Fatal(err)
	default:
	}
	st := e.Stats()
	if st.Debug.Misuses != 0 {
		t.Errorf("Debug reported %d misuses", st.Debug.Misuses)
	}
	if st.Send.BytesShared != 2*total || st.Send.BytesDataCopied != 0 {
		t.Errorf("BytesShared %d (want %d), BytesDataCopied %d (want 0)", st.Send.BytesShared, 2*total, st.Send.BytesDataCopied)
	}
	if st.Memory.SendPoolBytes != uint64(e.Config().SendBufs*e.Config().SendBufSize*e.Config().Queues) || st.Memory.PoolGrows != 0 && b == BackendIOUring {
		t.Logf("send pools: %d bytes, %d grows", st.Memory.SendPoolBytes, st.Memory.PoolGrows)
	}
}

// TestRetainCredit: a connection whose Data are retained stops receiving at MaxRecvHeld
// and resumes when the last reference goes, released from another goroutine.
func TestRetainCredit(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testRetainCredit(t, b) })
}

func testRetainCredit(t *testing.T, b Backend) {
	const bs, held = 4096, 64 << 10
	e := newEngine(t, Config{Backend: b, Queues: 1, RecvBufSize: bs, MaxRecvHeld: held})
	var mu sync.Mutex
	var refs []Data
	got := 0
	bad := make(chan error, 1)
	conns, clients := subscribers(t, e, 1, func() Handler {
		return HandlerFuncs{Data: func(c *Conn, d Data) {
			r, err := d.Retain()
			if err != nil {
				bad <- err
				return
			}
			d.Release() // the reference keeps the buffer and the credit
			mu.Lock()
			p := r.Bytes()
			for i := range p {
				if p[i] != byte((got+i)%253) {
					select {
					case bad <- fmt.Errorf("byte %d is %#x", got+i, p[i]):
					default:
					}
					break
				}
			}
			got += len(p)
			refs = append(refs, r)
			mu.Unlock()
		}}
	})
	c := conns[0]
	const total = 1 << 20
	go func() {
		p := make([]byte, total)
		for i := range p {
			p[i] = byte(i % 253)
		}
		clients[0].Write(p)
	}()
	// It must stop at the credit: held data reach MaxRecvHeld and stay there.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := c.Stats()
		if st.RecvPaused && st.RecvHeld >= held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never paused: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	mu.Lock()
	stuck := got
	mu.Unlock()
	if stuck >= total || stuck > held+bs*8 {
		t.Fatalf("received %d bytes while holding; MaxRecvHeld %d", stuck, held)
	}
	// Release from other goroutines until everything arrived.
	for {
		mu.Lock()
		rs := refs
		refs = nil
		n := got
		mu.Unlock()
		var wg sync.WaitGroup
		for _, r := range rs {
			wg.Add(1)
			go func() { defer wg.Done(); r.Release() }()
		}
		wg.Wait()
		if n >= total {
			break
		}
		select {
		case err := <-bad:
			t.Fatal(err)
		default:
		}
		if time.Now().After(deadline.Add(20 * time.Second)) {
			t.Fatalf("stalled at %d of %d bytes: %+v", n, total, c.Stats())
		}
		time.Sleep(2 * time.Millisecond)
	}
	waitFor(t, func() bool { return c.Stats().RecvHeld == 0 }, "credit back")
}

func waitFor(t *testing.T, f func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestSharedAfterClose: references (retained Data, a Shared) released from another
// goroutine after Engine.Close: the bytes stay readable until then, and the memory goes
// away with the last.
func TestSharedAfterClose(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		before := memreg.OpenRegions()
		e, err := New(Config{Backend: b, Queues: 1})
		if err != nil {
			t.Fatal(err)
		}
		kept := make(chan Data, 64)
		conns, clients := subscribers(t, e, 1, func() Handler {
			return HandlerFuncs{Data: func(c *Conn, d Data) {
				r, err := d.Retain()
				if err == nil {
					select {
					case kept <- r:
					default:
						r.Release()
					}
				}
				c.SendData(d) // echo the base
			}}
		})
		clients[0].Write([]byte("retained bytes"))
		io.ReadFull(clients[0], make([]byte, 14))
		buf, _ := conns[0].Buffer()
		copy(buf.Bytes(), "shared bytes")
		sh, err := NewShared(buf, 12)
		if err != nil {
			t.Fatal(err)
		}
		sh.Send(conns[0])
		io.ReadFull(clients[0], make([]byte, 12))
		r := <-kept
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		done := make(chan string)
		go func() {
			s := string(r.Bytes()) + "|" + string(sh.Bytes())
			r.Release()
			sh.Release()
			done <- s
		}()
		if s := <-done; s != "retained bytes|shared bytes" {
			t.Fatalf("after Close: %q", s)
		}
		close(kept)
		for d := range kept {
			d.Release()
		}
		waitFor(t, func() bool { return memreg.OpenRegions() == before }, "regions unmapped")
	})
}

// TestRetainMapped: mapped Data (RecvMapped) retained: the window reads on only once every
// reference is released, released here from another goroutine; every byte arrives.
func TestRetainMapped(t *testing.T) {
	e := newEngine(t, Config{Queues: 1, RecvPath: RecvMapped})
	refs := make(chan Data, 1024)
	done := make(chan struct{})
	var mu sync.Mutex
	got := 0
	bad := make(chan error, 1)
	_, clients := subscribers(t, e, 1, func() Handler {
		return HandlerFuncs{Data: func(c *Conn, d Data) {
			r, err := d.Retain()
			if err != nil {
				bad <- err
				return
			}
			s, err := d.Slice(0, d.Len())
			if err != nil {
				bad <- err
				return
			}
			d.Release()
			s.Release()
			if err := s.Release(); !errors.Is(err, memreg.ErrStale) {
				bad <- fmt.Errorf("double Release of a mapped slice = %v", err)
			}
			mu.Lock()
			p := r.Bytes()
			for i := range p {
				if p[i] != byte((got+i)%251) {
					bad <- fmt.Errorf("byte %d", got+i)
					break
				}
			}
			got += len(p)
			mu.Unlock()
			select {
			case refs <- r:
			case <-done:
				r.Release()
			}
		}}
	})
	go func() {
		for {
			select {
			case r := <-refs:
				r.Release()
			case <-done:
				return
			}
		}
	}()
	defer close(done) // the handler may still run after the test: it never sends on a closed channel
	const total = 4 << 20
	go func() {
		p := make([]byte, total)
		for i := range p {
			p[i] = byte(i % 251)
		}
		clients[0].Write(p)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := got
		mu.Unlock()
		if n >= total {
			break
		}
		select {
		case err := <-bad:
			t.Fatal(err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("stalled at %d of %d", n, total)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if st := e.Stats(); st.Recv.MappedFallbacks != 0 {
		t.Errorf("the mapped path was not taken: %+v", st)
	}
}
