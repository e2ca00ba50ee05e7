package memreg

import (
	"errors"
	"sync"
	"testing"
)

func TestPoolGrowsToCap(t *testing.T) {
	var grown []int
	p, err := NewPool(PoolOptions{BufSize: 4096, Initial: 2, MaxBytes: 4096 * 7,
		OnGrow: func(r *Region, first int) error { grown = append(grown, first); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.CloseWhenReleased()
	var held []Buf
	for {
		b, err := p.Get()
		if errors.Is(err, ErrExhausted) {
			n, gerr := p.Grow()
			if errors.Is(gerr, ErrPoolCap) {
				break
			}
			if gerr != nil || n == 0 {
				t.Fatalf("grow: %d %v", n, gerr)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, b)
	}
	if len(held) != 7 || p.Buffers() != 7 || p.Bytes() != 7*4096 {
		t.Fatalf("got %d buffers held, pool %d buffers %d bytes; want 7", len(held), p.Buffers(), p.Bytes())
	}
	// Doubling within the cap: 2, then 2 (=4), then 3 (cap).
	if want := []int{0, 2, 4}; len(grown) != 3 || grown[0] != 0 || grown[1] != 2 || grown[2] != 4 {
		t.Fatalf("regions started at %v, want %v", grown, want)
	}
	seen := map[int]bool{}
	for _, b := range held {
		idx := p.firstIndex(b.Region()) + b.Index()
		if seen[idx] {
			t.Fatalf("index %d twice", idx)
		}
		seen[idx] = true
		r, i, ok := p.locate(idx)
		if !ok || r != b.Region() || i != b.Index() {
			t.Fatalf("Locate(%d) = %p %d %v", idx, r, i, ok)
		}
		if !p.Owns(b.Region()) {
			t.Fatal("Owns")
		}
	}
	if _, _, ok := p.locate(7); ok {
		t.Fatal("Locate past the end")
	}
	for _, b := range held {
		if err := b.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if p.Free() != 7 {
		t.Fatalf("free %d", p.Free())
	}
}

func TestPoolBadSizes(t *testing.T) {
	for _, o := range []PoolOptions{
		{BufSize: 0, Initial: 1, MaxBytes: 1 << 20},
		{BufSize: 4096, Initial: 0, MaxBytes: 1 << 20},
		{BufSize: 4096, Initial: 4, MaxBytes: 4096},
		{BufSize: -1, Initial: 4, MaxBytes: 4096},
	} {
		_, err := NewPool(o)
		var se *SizeError
		if !errors.As(err, &se) {
			t.Errorf("%+v: %v, want *SizeError", o, err)
		}
	}
	boom := errors.New("boom")
	if _, err := NewPool(PoolOptions{BufSize: 4096, Initial: 1, MaxBytes: 1 << 20,
		OnGrow: func(*Region, int) error { return boom }}); !errors.Is(err, boom) {
		t.Fatalf("OnGrow error: %v", err)
	}
}

// A region closed while the application holds buffers stays mapped until the last release.
func TestCloseWhenReleasedDefersUnmap(t *testing.T) {
	before := OpenRegions()
	p, err := NewPool(PoolOptions{BufSize: 4096, Initial: 4, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := p.Get()
	b, _ := p.Get()
	c, _ := p.Get()
	loan, err := c.Lend()
	if err != nil {
		t.Fatal(err)
	}
	p.CloseWhenReleased()
	if _, err := p.Get(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after close: %v", err)
	}
	// Held buffers still work, concurrently.
	var wg sync.WaitGroup
	for _, x := range []Buf{a, b} {
		wg.Add(1)
		go func(x Buf) {
			defer wg.Done()
			mem := x.Bytes()
			if mem == nil {
				t.Error("held buffer unmapped")
				return
			}
			for i := range mem {
				mem[i] = 0xaa // would fault if unmapped
			}
		}(x)
	}
	wg.Wait()
	if _, err := a.Lend(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Lend after close: %v", err)
	}
	if loan.Return() == nil {
		t.Fatal("a loan forgotten by the close still returned")
	}
	if OpenRegions() != before+1 {
		t.Fatalf("region unmapped while held: %d open", OpenRegions()-before)
	}
	a.Release()
	if OpenRegions() != before+1 {
		t.Fatal("unmapped with one buffer still held")
	}
	b.Release()
	if OpenRegions() != before {
		t.Fatalf("not unmapped after the last release: %d open", OpenRegions()-before)
	}
	if b.Bytes() != nil || a.Release() == nil {
		t.Fatal("stale handles after unmap")
	}
}
