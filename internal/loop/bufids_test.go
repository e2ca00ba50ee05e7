package loop

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// PostBuffer's ids below SizeBufferIDs go through the id stack, the others through the
// inbox: either way every accepted return reaches the hook exactly once on the loop, also
// when the queue closes while goroutines return buffers, and none is accepted after.
func TestPostBufferIDs(t *testing.T) {
	const ids, goroutines = 256, 4
	for round := 0; round < 40; round++ {
		var seen [ids + 64]atomic.Int32 // ids ≥ `ids` take the task path
		var onLoopMiss atomic.Int32
		var qp atomic.Pointer[Queue]
		q := startQueue(t, driverKind(round%2), func(q *Queue, d Driver) error {
			q.SizeBufferIDs(ids)
			q.SetBufferHook(func(arg int32) {
				if lq := qp.Load(); lq != nil && !lq.OnLoop() {
					onLoopMiss.Add(1)
				}
				seen[arg].Add(1)
			})
			return nil
		})
		qp.Store(q)
		var accepted atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Each goroutine owns the ids ≡ g (mod goroutines) and returns each once.
				for id := g; id < len(seen); id += goroutines {
					if q.PostBuffer(int32(id)) == nil {
						accepted.Add(1)
					} else {
						seen[id].Add(1000) // refused: must never reach the hook too
					}
				}
			}()
		}
		time.Sleep(time.Duration(round%5) * 50 * time.Microsecond)
		if round%3 != 0 {
			q.Close()
		}
		wg.Wait()
		q.Close()
		var ran int64
		for id := range seen {
			switch v := seen[id].Load(); v {
			case 1:
				ran++
			case 1000:
			default:
				t.Fatalf("round %d: id %d reached the hook %d times (1000: refused as well)", round, id, v)
			}
		}
		if ran != accepted.Load() {
			t.Fatalf("round %d: %d returns accepted, %d ran", round, accepted.Load(), ran)
		}
		if round%3 == 0 && ran != int64(len(seen)) {
			t.Fatalf("round %d: closed after the returns, yet %d of %d ran", round, ran, len(seen))
		}
		if n := onLoopMiss.Load(); n > 0 {
			t.Fatalf("round %d: the hook ran off the loop %d times", round, n)
		}
		if err := q.PostBuffer(1); err == nil {
			t.Fatalf("round %d: PostBuffer after Close accepted", round)
		}
	}
}

// The id stack: pushes from many goroutines, takes on one, nothing lost or repeated.
func TestIDStack(t *testing.T) {
	var s idStack
	const n = 4096
	s.init(n)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := g; id < n; id += 8 {
				if !s.push(int32(id)) {
					t.Error("push refused before seal")
				}
			}
		}()
	}
	got := make([]int, n)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
		}
		s.each(s.take(), func(id int32) { got[id]++ })
	}
	s.each(s.seal(), func(id int32) { got[id]++ })
	for id, c := range got {
		if c != 1 {
			t.Fatalf("id %d taken %d times", id, c)
		}
	}
	if s.push(3) {
		t.Fatal("push after seal accepted")
	}
	if !s.fits(n-1) || s.fits(n) || s.fits(-1) {
		t.Fatal("fits is wrong at the edges")
	}
}
