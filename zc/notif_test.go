package zc

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zcnet/zcnet/tcpglue"
)

// Zero-copy notification accounting stays exact: many connections stream with
// SendZeroCopy while their peers reset mid-stream (SO_LINGER 0) and the test closes others
// mid-stream. Engine.Stats().NotifsPending, polled throughout, never goes negative; once
// everything closed it is 0, NotifsUnexpected is 0, and every send buffer is back.

func TestZeroCopyNotifAccounting(t *testing.T) {
	testZeroCopyNotifAccounting(t, Config{Backend: BackendIOUring, SendPath: SendZeroCopy, Queues: 2, NoPin: true,
		SendBufs: 16, SendBufSize: 64 << 10, CloseTimeout: 2 * time.Second}, 32)
}

func testZeroCopyNotifAccounting(t *testing.T, cfg Config, conns int) {
	e := newEngine(t, cfg)
	// Plain peers: read a while, then reset, close normally, or read to the end.
	ln, err := tcpglue.Listen("tcp", "127.0.0.1:0", tcpglue.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lap, err := ln.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	var peers sync.WaitGroup
	var resets atomic.Int64
	go func() {
		for i := 0; ; i++ {
			s, _, err := ln.Accept()
			if err != nil {
				return
			}
			peers.Add(1)
			go func() {
				defer peers.Done()
				defer s.Close()
				rng := rand.New(rand.NewPCG(uint64(i), 3))
				limit := 64<<10 + rng.IntN(4<<20)
				reset := i%3 == 0
				buf := make([]byte, 64<<10)
				for got := 0; !reset || got < limit; {
					n, err := s.Read(buf)
					if n <= 0 || err != nil {
						return
					}
					got += n
				}
				s.SetLinger(0)
				resets.Add(1)
			}()
		}
	}()
	// Poll the pending count the whole time.
	stop := make(chan struct{})
	var minPending, maxPending atomic.Int64
	var polls atomic.Int64
	var pollWG sync.WaitGroup
	pollWG.Add(1)
	go func() {
		defer pollWG.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			p := e.Stats().Send.NotifsPending
			if p < minPending.Load() {
				minPending.Store(p)
			}
			if p > maxPending.Load() {
				maxPending.Store(p)
			}
			polls.Add(1)
			time.Sleep(200 * time.Microsecond)
		}
	}()
	var senders sync.WaitGroup
	var cs []*Conn
	for i := 0; i < conns; i++ {
		c, err := e.Dial(context.Background(), "tcp", lap.String(), HandlerFuncs{})
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
		senders.Add(1)
		go func() {
			defer senders.Done()
			closeAfter := -1
			if i%3 == 1 {
				closeAfter = 8 + i // closed by us mid-stream
			}
			for k := 0; k < 256; k++ {
				if k == closeAfter {
					c.Close()
					return
				}
				b, err := c.BufferWait(5 * time.Second)
				if err != nil {
					return // closed by a reset
				}
				if err := c.Send(b, len(b.Bytes())); err != nil {
					return
				}
			}
			c.Close()
		}()
	}
	senders.Wait()
	for i, c := range cs {
		select {
		case <-c.Done():
		case <-time.After(3 * cfg.CloseTimeout):
			t.Fatalf("connection %d not done\n%s", i, engineDump(e))
		}
		if n := c.Stats().NotifsPending; n != 0 {
			t.Errorf("connection %d done with %d notifications pending", i, n)
		}
	}
	close(stop)
	pollWG.Wait()
	st := e.Stats()
	t.Logf("%d polls, NotifsPending between %d and %d; %d peers reset; zero-copy ops %d, bytes zc %d / copied %d",
		polls.Load(), minPending.Load(), maxPending.Load(), resets.Load(), st.Send.ZCOps, st.Send.BytesZC, st.Send.BytesZCCopied)
	if minPending.Load() < 0 {
		t.Errorf("NotifsPending went down to %d", minPending.Load())
	}
	if st.Send.NotifsPending != 0 || st.Send.NotifsUnexpected != 0 {
		t.Errorf("after every connection closed: NotifsPending %d, NotifsUnexpected %d", st.Send.NotifsPending, st.Send.NotifsUnexpected)
	}
	if st.Send.ZCOps == 0 {
		t.Error("no zero-copy send was made")
	}
	if resets.Load() == 0 {
		t.Error("no peer reset mid-stream")
	}
	waitSendBuffersBack(t, e)
	ln.Close()
	peers.Wait()
}
