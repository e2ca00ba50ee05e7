package zc

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/tcpglue"
)

// fanReader reads whole messages of size from nc and checks them: in order, from 0
// (strict), or any increasing subsequence (drops allowed). It returns how many it read.
func fanReader(nc net.Conn, size int, want uint64, strict bool, slow time.Duration) (uint64, error) {
	p := make([]byte, size)
	next, n := uint64(0), uint64(0)
	for next < want {
		if _, err := io.ReadFull(nc, p); err != nil {
			return n, err
		}
		seq := uint64(p[0]) | uint64(p[1])<<8 | uint64(p[2])<<16 | uint64(p[3])<<24
		if strict && seq != next || seq < next {
			return n, fmt.Errorf("message %d after %d", seq, next)
		}
		if err := checkMsg(p, seq); err != nil {
			return n, err
		}
		next = seq + 1
		n++
		if slow > 0 && n%16 == 0 {
			time.Sleep(slow)
		}
	}
	return n, nil
}

// publish runs a goroutine publisher of nmsgs messages of size on f, taking buffers from
// c's queue, waiting for OnReady (ready) on ErrWouldBlock. It returns the error that ended it.
func publish(f *FanOut, c *Conn, ready chan struct{}, nmsgs uint64, size int) error {
	return publishPaced(f, c, ready, nmsgs, size, nil)
}

// publishPaced is publish that calls pace before each message.
func publishPaced(f *FanOut, c *Conn, ready chan struct{}, nmsgs uint64, size int, pace func()) error {
	for i := uint64(0); i < nmsgs; i++ {
		if pace != nil {
			pace()
		}
		b, err := c.BufferWait(0)
		if err != nil {
			return err
		}
		fanMsg(b.Bytes()[:size], i)
		for {
			err = f.Publish(b, size)
			if !errors.Is(err, ErrWouldBlock) {
				break
			}
			select {
			case <-ready:
			case <-time.After(30 * time.Second):
				b.Release()
				return fmt.Errorf("message %d: no OnReady after ErrWouldBlock: %+v", i, f.Stats())
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func TestFanOutOptions(t *testing.T) {
	for _, o := range []FanOutOptions{{}, {Policy: 9, OnReady: func() {}}, {Policy: FanOutDrop, MaxQueued: -1}} {
		if _, err := NewFanOut(o); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewFanOut(%+v) = %v, want ErrInvalid", o, err)
		}
	}
	f, err := NewFanOut(FanOutOptions{Policy: FanOutDrop})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Add(nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Add(nil) = %v", err)
	}
	if err := f.PublishShared(nil); err == nil {
		t.Error("PublishShared(nil) succeeded")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close = %v", err)
	}
}

// TestFanOutPause: more subscribers than the send pool has buffers, some slow; the
// publisher pauses at their bound and OnReady wakes it: every subscriber gets every message.
func TestFanOutPause(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    Backend
		path SendPath
	}{{"io_uring", BackendIOUring, SendAdaptive}, {"plain", BackendPlain, SendAdaptive}, {"io_uring-zerocopy", BackendIOUring, SendZeroCopy}} {
		b := tc.b
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, Config{Backend: b, SendPath: tc.path, ZCThreshold: 128, SendBufSize: 4096, SendBufs: 8, SendPoolMax: 32 * 4096})
			const nsubs, nmsgs, size = 120, 200, 256
			ready := make(chan struct{}, 1)
			f, err := NewFanOut(FanOutOptions{Policy: FanOutPause, MaxQueued: 2 << 10, OnReady: func() {
				select {
				case ready <- struct{}{}:
				default:
				}
			}})
			if err != nil {
				t.Fatal(err)
			}
			conns, clients := subscribers(t, e, nsubs, nil)
			for _, c := range conns {
				if err := f.Add(c); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.Add(conns[0]); !errors.Is(err, ErrInvalid) {
				t.Errorf("second Add = %v, want ErrInvalid", err)
			}
			errs := make(chan error, nsubs)
			for i, nc := range clients {
				slow := time.Duration(0)
				if i%10 == 0 {
					slow = 2 * time.Millisecond
					nc.(*net.TCPConn).SetReadBuffer(4096)
				}
				go func() {
					_, err := fanReader(nc, size, nmsgs, true, slow)
					errs <- err
				}()
			}
			if err := publish(f, conns[0], ready, nmsgs, size); err != nil {
				t.Fatal(err)
			}
			for range clients {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			st := f.Stats()
			t.Logf("%+v", st)
			if st.Deliveries != nsubs*nmsgs || st.Drops != 0 || st.Closes != 0 || st.Subscribers != nsubs {
				t.Errorf("stats %+v", st)
			}
			if st.Pauses == 0 {
				t.Log("the publisher never paused")
			}
			f.Close()
			b, _ := conns[0].BufferWait(0)
			if err := f.Publish(b, 1); !errors.Is(err, ErrClosed) || b.Valid() {
				t.Errorf("Publish after Close = %v (buffer still held: %v)", err, b.Valid())
			}
			waitSendBuffersBack(t, e)
		})
	}
}

// TestFanOutDropClose: a subscriber that never reads: dropped from (FanOutDrop) or closed
// (FanOutClose); the others get every message; memory stays bounded.
func TestFanOutDropClose(t *testing.T) {
	for _, pol := range []FanOutPolicy{FanOutDrop, FanOutClose} {
		t.Run(pol.String(), func(t *testing.T) {
			e := newEngine(t, Config{SendBufSize: 4096, SendBufs: 8, SendPoolMax: 64 * 4096,
				CloseTimeout: 200 * time.Millisecond})
			const nsubs, nmsgs, size = 8, 2000, 1024
			f, err := NewFanOut(FanOutOptions{Policy: pol, MaxQueued: 16 << 10})
			if err != nil {
				t.Fatal(err)
			}
			conns, clients := subscribers(t, e, nsubs, nil)
			// The stuck one: tiny buffers both ends, never read (until the end).
			conns[0].Socket(func(s *tcpglue.Socket) error {
				return s.Control(func(fd int) error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4096) })
			})
			for _, c := range conns {
				f.Add(c)
			}
			errs := make(chan error, nsubs)
			for _, nc := range clients[1:] {
				go func() {
					_, err := fanReader(nc, size, nmsgs, true, 0)
					errs <- err
				}()
			}
			// The publisher keeps pace with the readers, but not with the stuck one.
			pace := func() {
				for _, c := range conns[1:] {
					for c.Queued() > 4<<10 {
						time.Sleep(50 * time.Microsecond)
					}
				}
			}
			if err := publishPaced(f, conns[1], nil, nmsgs, size, pace); err != nil {
				t.Fatal(err)
			}
			for range clients[1:] {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			st := f.Stats()
			t.Logf("%+v", st)
			switch pol {
			case FanOutDrop:
				if st.Drops == 0 || st.Deliveries+st.Drops != nsubs*nmsgs {
					t.Errorf("stats %+v", st)
				}
				// What the stuck one got is whole messages, in order, with gaps.
				p := make([]byte, size)
				n, next := uint64(0), uint64(0)
				for n+st.Drops < nmsgs {
					clients[0].SetReadDeadline(time.Now().Add(10 * time.Second))
					if _, err := io.ReadFull(clients[0], p); err != nil {
						t.Fatalf("stuck subscriber: %d messages read, %d dropped: %v", n, st.Drops, err)
					}
					seq := uint64(p[0]) | uint64(p[1])<<8 | uint64(p[2])<<16 | uint64(p[3])<<24
					if seq < next {
						t.Fatalf("message %d after %d", seq, next)
					}
					if err := checkMsg(p, seq); err != nil {
						t.Fatal(err)
					}
					next = seq + 1
					n++
				}
			case FanOutClose:
				if st.Closes != 1 || st.Subscribers != nsubs-1 {
					t.Errorf("stats %+v", st)
				}
				<-conns[0].Done()
			}
			if q := conns[0].Queued(); q > 16<<10+size {
				t.Errorf("the stuck subscriber has %d bytes queued", q)
			}
			f.Close()
			waitSendBuffersBack(t, e)
		})
	}
}

// TestFanOutChurn: subscribers join, leave, half-close, reset and close while a publisher
// publishes, and the publisher closes the FanOut mid-stream: nobody stalls, the pool comes
// back, every byte a subscriber gets is whole messages in order.
func TestFanOutChurn(t *testing.T) {
	e := newEngine(t, Config{SendBufSize: 4096, SendBufs: 8, SendPoolMax: 32 * 4096, CloseTimeout: 200 * time.Millisecond})
	const size = 512
	ready := make(chan struct{}, 1)
	f, _ := NewFanOut(FanOutOptions{MaxQueued: 8 << 10, OnReady: func() {
		select {
		case ready <- struct{}{}:
		default:
		}
	}})
	var eofs atomic.Int32
	conns, clients := subscribers(t, e, 40, func() Handler {
		return HandlerFuncs{EOF: func(c *Conn, err error) { eofs.Add(1) }, Writable: func(c *Conn) {}}
	})
	f.Add(conns[0])
	pubDone := make(chan error, 1)
	go func() { pubDone <- publish(f, conns[0], ready, 1<<30, size) }()
	var wg sync.WaitGroup
	bad := make(chan error, len(clients))
	for i := 1; i < len(conns); i++ {
		c, nc := conns[i], clients[i]
		if err := f.Add(c); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, size)
			// Join mid-stream: the first whole message tells where we are (messages are
			// queued whole, so a subscriber's stream starts at a message boundary).
			if _, err := io.ReadFull(nc, p); err != nil {
				bad <- err
				return
			}
			seq := uint64(p[0]) | uint64(p[1])<<8 | uint64(p[2])<<16 | uint64(p[3])<<24
			if err := checkMsg(p, seq); err != nil {
				bad <- err
				return
			}
			for k := 0; k < 50+i*5; k++ {
				if _, err := io.ReadFull(nc, p); err != nil {
					bad <- err
					return
				}
				seq++
				if err := checkMsg(p, seq); err != nil {
					bad <- err
					return
				}
			}
			switch i % 4 {
			case 0:
				f.Remove(c) // leaves; the connection stays
			case 1:
				nc.(*net.TCPConn).CloseWrite() // the peer half-closes: still a subscriber
			case 2:
				nc.(*net.TCPConn).SetLinger(0)
				nc.Close() // reset
				return
			case 3:
				c.Close()
			}
			go io.Copy(io.Discard, nc) // reads on until the end
		}()
	}
	wg.Wait()
	close(bad)
	for err := range bad {
		t.Fatal(err)
	}
	// The publisher goes on with whoever is left, then the FanOut closes mid-stream.
	time.Sleep(20 * time.Millisecond)
	f.Close()
	select {
	case err := <-pubDone:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("publisher ended with %v, want ErrClosed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("publisher stalled: %+v", f.Stats())
	}
	if err := f.Add(conns[0]); !errors.Is(err, ErrClosed) {
		t.Errorf("Add after Close = %v", err)
	}
	t.Logf("%+v, %d subscribers saw EOF", f.Stats(), eofs.Load())
	if f.Stats().Subscribers != 0 {
		t.Errorf("%d subscribers after Close", f.Stats().Subscribers)
	}
	// Handlers are their own again.
	for _, c := range conns {
		if c.ended() {
			continue
		}
		got := make(chan Handler, 1)
		if c.q.Post(func() { got <- c.h }) == nil {
			if _, ok := (<-got).(*fanSub); ok {
				t.Fatal("a subscriber's handler is still the FanOut's after Close")
			}
		}
	}
	for _, nc := range clients {
		nc.Close()
	}
	waitSendBuffersBack(t, e)
}

// TestFanOutPublishData: a publisher connection's received Data go to every subscriber,
// shared; the publisher's receive credit bounds what slow subscribers hold.
func TestFanOutPublishData(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		e := newEngine(t, Config{Backend: b, Queues: 2, RecvBufSize: 4096, MaxRecvHeld: 64 << 10})
		const nsubs, nmsgs, size = 30, 3000, 64
		var pubp atomic.Pointer[Conn]
		var held []Data
		var mu sync.Mutex
		var f *FanOut
		resume := func() { // on pub's queue goroutine
			mu.Lock()
			defer mu.Unlock()
			for len(held) > 0 {
				if err := f.PublishData(held[0]); errors.Is(err, ErrWouldBlock) {
					return
				}
				held = held[1:]
			}
			pubp.Load().SetReceivePaused(false)
		}
		f, _ = NewFanOut(FanOutOptions{MaxQueued: 4 << 10, OnReady: func() { pubp.Load().Post(resume) }})
		conns, clients := subscribers(t, e, nsubs, nil)
		for _, c := range conns {
			f.Add(c)
		}
		pubs, pubClients := subscribers(t, e, 1, func() Handler {
			return HandlerFuncs{Data: func(c *Conn, d Data) {
				mu.Lock()
				defer mu.Unlock()
				if len(held) == 0 {
					err := f.PublishData(d)
					if !errors.Is(err, ErrWouldBlock) {
						return
					}
				}
				held = append(held, d)
				c.SetReceivePaused(true)
			}}
		})
		pub := pubs[0]
		pubp.Store(pub)
		go func() {
			p := make([]byte, size*nmsgs)
			for i := uint64(0); i < nmsgs; i++ {
				fanMsg(p[i*size:(i+1)*size], i)
			}
			pubClients[0].Write(p)
		}()
		errs := make(chan error, nsubs)
		for i, nc := range clients {
			slow := time.Duration(0)
			if i%7 == 0 {
				slow = time.Millisecond
			}
			go func() {
				_, err := fanReader(nc, size, nmsgs, true, slow)
				errs <- err
			}()
		}
		for range clients {
			select {
			case err := <-errs:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(60 * time.Second):
				t.Fatalf("stalled: %+v %+v", f.Stats(), pub.Stats())
			}
		}
		st, es := f.Stats(), e.Stats()
		t.Logf("%+v; engine shared %d bytes, copied %d", st, es.Send.BytesShared, es.Send.BytesDataCopied)
		if st.BytesShared != nsubs*nmsgs*size || es.Send.BytesDataCopied != 0 {
			t.Errorf("shared %d bytes (want %d), copied %d", st.BytesShared, nsubs*nmsgs*size, es.Send.BytesDataCopied)
		}
		f.Close()
		waitFor(t, func() bool { return pub.Stats().RecvHeld == 0 }, "the publisher's credit back")
	})
}
