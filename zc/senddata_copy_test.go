package zc

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zcnet/zcnet/memreg"
)

// TestSendDataCopyAllOrNothing: SendData of mapped Data (copied into send buffers) to a
// slow destination with a tiny send pool: a refusal queues nothing and leaves the Data with
// the caller, who sends it again from OnWritable; every byte arrives, in order, once.
func TestSendDataCopyAllOrNothing(t *testing.T) {
	e := newEngine(t, Config{Queues: 1, RecvPath: RecvMapped, SendPath: SendCopy,
		SendBufSize: 4096, SendBufs: 2, SendPoolMax: 24 * 4096, MaxQueuedBytes: 16 << 10})
	var mu sync.Mutex
	var pending []Data
	refusals, tooLarge := 0, 0
	bad := make(chan error, 4)
	var srcp atomic.Pointer[Conn]
	// flush sends what is pending, in order (on the queue goroutine).
	flush := func(dst *Conn) {
		mu.Lock()
		defer mu.Unlock()
		for len(pending) > 0 {
			d := pending[0]
			err := dst.SendData(d)
			switch {
			case err == nil:
				pending = pending[1:]
				continue
			case errors.Is(err, memreg.ErrExhausted):
				refusals++
				if d.Bytes() == nil {
					bad <- errors.New("a refused Data was released")
				}
				return // OnWritable follows
			case errors.Is(err, ErrTooLarge):
				// more than the pool holds: copy it with Write, in the order of the stream
				tooLarge++
				pending = pending[1:]
				if _, err := dst.Write(d.Bytes()); err != nil {
					bad <- fmt.Errorf("write: %w", err)
				}
				d.Release()
				continue
			default:
				bad <- err
				return
			}
		}
		if src := srcp.Load(); src != nil {
			src.SetReceivePaused(false)
		}
	}
	dsts, dstClients := subscribers(t, e, 1, func() Handler {
		return HandlerFuncs{Writable: func(c *Conn) { flush(c) }}
	})
	dst := dsts[0]
	srcs, srcClients := subscribers(t, e, 1, func() Handler {
		return HandlerFuncs{Data: func(c *Conn, d Data) {
			mu.Lock()
			pending = append(pending, d)
			c.SetReceivePaused(true) // until flushed
			mu.Unlock()
			flush(dst)
		}}
	})
	srcp.Store(srcs[0])
	const total = 2 << 20
	go func() {
		p := make([]byte, total)
		for i := range p {
			p[i] = byte(i / 5)
		}
		srcClients[0].Write(p)
	}()
	got := 0
	p := make([]byte, 8192)
	for got < total {
		dstClients[0].SetReadDeadline(time.Now().Add(20 * time.Second))
		n, err := dstClients[0].Read(p)
		for i := 0; i < n; i++ {
			if p[i] != byte((got+i)/5) {
				t.Fatalf("byte %d is %#x, want %#x", got+i, p[i], byte((got+i)/5))
			}
		}
		got += n
		if err != nil && err != io.EOF {
			t.Fatalf("after %d bytes: %v\n%s", got, err, engineDump(e))
		}
		if got%(256<<10) < n {
			time.Sleep(time.Millisecond) // a slow reader: the pool runs dry
		}
		select {
		case err := <-bad:
			t.Fatal(err)
		default:
		}
	}
	st := e.Stats()
	mu.Lock()
	t.Logf("refusals %d, too large %d; copied %d bytes, mapped %d, mapped-copied %d, fallbacks %d",
		refusals, tooLarge, st.Send.BytesDataCopied, st.Recv.BytesMapped, st.Recv.BytesMappedCopied, st.Recv.MappedFallbacks)
	mu.Unlock()
	if st.Recv.MappedFallbacks != 0 || st.Send.BytesDataCopied == 0 {
		t.Errorf("the mapped path was not taken: %+v", st)
	}
	if refusals == 0 {
		t.Log("the send pool never refused")
	}
}
