package memreg

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

func TestSharedLifecycle(t *testing.T) {
	r, err := New(Options{BufSize: 64, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, _ := r.Get()
	copy(b.Bytes(), "hello")
	var last atomic.Int32
	x, err := b.Share(func() { last.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	if !b.Shared() || r.StateOf(b.Index()) != Shared || r.Owners(b.Index()) != 2 {
		t.Fatalf("after Share: shared %v state %v owners %d", b.Shared(), r.StateOf(b.Index()), r.Owners(b.Index()))
	}
	y, err := x.Share()
	if err != nil {
		t.Fatal(err)
	}
	l1, err := y.Lend()
	if err != nil {
		t.Fatal(err)
	}
	l2, err := b.Lend() // the base handle's ownership becomes a loan
	if err != nil {
		t.Fatal(err)
	}
	if b.Valid() || b.Release() == nil {
		t.Fatal("base handle still valid after Lend")
	}
	if string(x.Bytes()[:5]) != "hello" || string(l1.Data()[:5]) != "hello" || !l2.Valid() {
		t.Fatal("shared bytes")
	}
	if _, err := l1.Reclaim(); !errors.Is(err, ErrStale) {
		t.Fatalf("Reclaim of a shared loan = %v, want ErrStale", err)
	}
	// l1 is gone now (Reclaim dropped it). (Loans of one shared buffer are alike: a second
	// Return of one of them is caught only once none is left — the engine returns each once.)
	if r.Owners(b.Index()) != 3 {
		t.Fatalf("owners %d, want 3", r.Owners(b.Index()))
	}
	for _, rel := range []func() error{x.Release, y.Release, l2.Return} {
		if last.Load() != 0 || r.Free() != 1 {
			t.Fatalf("buffer back before its last owner (free %d, onLast %d)", r.Free(), last.Load())
		}
		if err := rel(); err != nil {
			t.Fatal(err)
		}
	}
	if last.Load() != 1 || r.Free() != 2 || r.Held() != 0 || r.Owners(b.Index()) != 0 {
		t.Fatalf("after the last owner: onLast %d free %d held %d", last.Load(), r.Free(), r.Held())
	}
	if err := x.Release(); !errors.Is(err, ErrStale) {
		t.Fatalf("double Release = %v, want ErrStale", err)
	}
	if _, err := x.Share(); !errors.Is(err, ErrStale) {
		t.Fatalf("Share after Release = %v", err)
	}
	if _, err := x.Lend(); !errors.Is(err, ErrStale) {
		t.Fatalf("Lend after Release = %v", err)
	}
	if x.Bytes() != nil {
		t.Fatal("Bytes after Release")
	}
	if _, err := b.Share(nil); !errors.Is(err, ErrStale) {
		t.Fatalf("Share of a stale handle = %v", err)
	}
	if err := l2.Return(); !errors.Is(err, ErrStale) {
		t.Fatalf("second Return = %v", err)
	}
}

func TestSharedRecycle(t *testing.T) {
	r, err := New(Options{BufSize: 64, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	r.setRecycler(func(idx int) { got = append(got, idx) })
	r.provide(1, func(Loan) {})
	b, err := r.received(0)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := b.Share(nil)
	b.Release()
	if len(got) != 0 {
		t.Fatal("recycled with an owner left")
	}
	x.Release()
	if len(got) != 1 || r.StateOf(0) != Kernel {
		t.Fatalf("recycled %v state %v", got, r.StateOf(0))
	}
	r.abandon()
	r.Close()
}

// A shared buffer outlives its region's owner (CloseWhenReleased) while the application
// holds it; its loans are forgotten; the last application owner unmaps the region.
func TestSharedCloseWhenReleased(t *testing.T) {
	before := OpenRegions()
	r, err := New(Options{BufSize: 64, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := r.Get()
	copy(b.Bytes(), "kept")
	x, _ := b.Share(nil)
	l, _ := x.Lend()
	b.Release()
	if r.CloseWhenReleased() {
		t.Fatal("unmapped under a Ref")
	}
	if string(x.Bytes()[:4]) != "kept" {
		t.Fatal("bytes gone after close")
	}
	if _, err := x.Lend(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Lend after close = %v", err)
	}
	if err := l.Return(); !errors.Is(err, ErrStale) {
		t.Fatalf("Return of a forgotten loan = %v", err)
	}
	if err := x.Release(); err != nil {
		t.Fatal(err)
	}
	if OpenRegions() != before {
		t.Fatal("region still mapped after the last owner")
	}
	// And a shared buffer whose only owners were loans is freed by the close.
	r2, _ := New(Options{BufSize: 64, Count: 1})
	b2, _ := r2.Get()
	var last atomic.Bool
	y, _ := b2.Share(func() { last.Store(true) })
	y.Lend()
	y.Release()
	b2.Release()
	if !r2.CloseWhenReleased() || !last.Load() || OpenRegions() != before {
		t.Fatal("a shared buffer held by forgotten loans kept its region")
	}
}

func TestSharedConcurrent(t *testing.T) {
	r, err := New(Options{BufSize: 64, Count: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for round := 0; round < 200; round++ {
		b, _ := r.Get()
		var last atomic.Int32
		x, _ := b.Share(func() { last.Add(1) })
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			y, err := x.Share()
			if err != nil {
				t.Fatal(err)
			}
			l, err := x.Lend()
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = y.Bytes()
				y.Release()
				l.Return()
			}()
		}
		x.Release()
		b.Release()
		wg.Wait()
		if last.Load() != 1 || r.Free() != 4 {
			t.Fatalf("round %d: onLast %d free %d", round, last.Load(), r.Free())
		}
	}
}
