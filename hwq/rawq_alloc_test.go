package hwq

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/memreg"
)

// TestRawNoAllocs: in steady state the receive and transmit paths allocate nothing:
// TryReceive on an empty and on a non-empty queue, Receive with frames waiting, and Get +
// Send + Flush of a frame. (They allocated 3 times per empty poll, Send 4 and Flush 2:
// RawConn.Control closures, the reap slice, Provide's slice.)
func TestRawNoAllocs(t *testing.T) {
	e := newRawEnv(t, 1)
	q := e.openRaw(t, 0, newRegion(t, 2048), &RawQueueOptions{RingSize: 1024})
	id, err := q.Steering().AddRule(bpf.RawRule{DstPort: 6600})
	if err != nil {
		t.Fatal(err)
	}
	frames := make([]Frame, 4)
	if a := testing.AllocsPerRun(2000, func() {
		if n, err := q.TryReceive(frames); n != 0 || err != nil {
			t.Fatalf("TryReceive on an empty queue: %d, %v", n, err)
		}
	}); a != 0 {
		t.Errorf("TryReceive on an empty queue: %v allocations per call", a)
	}

	// 900 frames wait on the RX ring; each run below takes 4 (TryReceive) or up to 4
	// (Receive) and releases them.
	const sent = 900
	pk := newPacketSock(t, e.Cli, e.CliIf)
	f := frameSpec{dstMAC: e.srvMAC, srcMAC: e.cliMAC, src: e.CliAddr, dst: e.SrvAddr, sport: 1, dport: 6600, payload: make([]byte, 22)}.build()
	for range sent {
		pk.send(t, f)
	}
	for {
		st, err := q.Steering().RuleStats(id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Packets == sent {
			break
		}
		if n, _ := q.TryReceive(nil); n != 0 {
			t.Fatal("TryReceive of nothing took frames")
		}
	}
	take := func(recv func([]Frame) (int, error)) func() {
		return func() {
			n, err := recv(frames)
			if n == 0 || err != nil {
				t.Fatalf("receive with frames waiting: %d, %v", n, err)
			}
			for _, fr := range frames[:n] {
				fr.Buf.Release()
			}
		}
	}
	if a := testing.AllocsPerRun(60, take(q.TryReceive)); a != 0 {
		t.Errorf("TryReceive with frames waiting: %v allocations per call", a)
	}
	if a := testing.AllocsPerRun(60, take(q.Receive)); a != 0 {
		t.Errorf("Receive with frames waiting: %v allocations per call", a)
	}
	if a := testing.AllocsPerRun(60, func() {
		n, err := q.TryReceive(frames)
		if n == 0 || err != nil {
			t.Fatalf("TryReceive with frames waiting: %d, %v", n, err)
		}
		if err := q.Release(frames[:n]); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("TryReceive + Release: %v allocations per call", a)
	}
	if err := q.Release(frames[:1]); !errors.Is(err, memreg.ErrStale) {
		t.Fatalf("Release of a frame released before: %v, want memreg.ErrStale", err)
	}

	out := make([]Frame, 1)
	if a := testing.AllocsPerRun(500, func() {
		b, err := q.Get()
		if err != nil {
			t.Fatal(err)
		}
		copy(b.Bytes(), f)
		out[0] = Frame{Buf: b, Len: len(f)}
		if n, err := q.Send(out); n != 1 || err != nil {
			t.Fatalf("Send: %d, %v", n, err)
		}
		if _, err := q.Flush(); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("Get + Send + Flush: %v allocations per frame", a)
	}
	st, err := q.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.TxCompleted == 0 {
		t.Fatalf("nothing sent: %+v", st)
	}
}

// TestRawRxCoalesce: a queue with RxCoalesce receives what is sent (the batch taken after
// the pause), Close still ends a waiting Receive, and a coalescing period out of range is
// refused. Nothing here is timed.
func TestRawRxCoalesce(t *testing.T) {
	e := newRawEnv(t, 1)
	q := e.openRaw(t, 0, newRegion(t, 256), &RawQueueOptions{RxCoalesce: 2 * time.Millisecond})
	if _, err := q.Steering().AddRule(bpf.RawRule{DstPort: 6700}); err != nil {
		t.Fatal(err)
	}
	pk := newPacketSock(t, e.Cli, e.CliIf)
	f := frameSpec{dstMAC: e.srvMAC, srcMAC: e.cliMAC, src: e.CliAddr, dst: e.SrvAddr, sport: 1, dport: 6700, payload: make([]byte, 22)}.build()
	go func() {
		for range 20 {
			pk.send(t, f)
		}
	}()
	frames := make([]Frame, 32)
	q.SetReadDeadline(time.Now().Add(10 * time.Second)) // a safety net
	for got := 0; got < 20; {
		n, err := q.Receive(frames)
		if err != nil {
			t.Fatalf("after %d frames: %v", got, err)
		}
		for _, fr := range frames[:n] {
			fr.Buf.Release()
		}
		got += n
	}
	q.SetReadDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() { _, err := q.Receive(frames); errc <- err }()
	q.Close()
	if err := <-errc; !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Receive ended by Close: %v", err)
	}
	_, err := OpenRawQueue(e.SrvIf, 0, newRegion(t, 64), &RawQueueOptions{NetNS: e.Srv.Fd(), RxCoalesce: -1})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("RxCoalesce -1: %v, want ErrInvalid", err)
	}
}
