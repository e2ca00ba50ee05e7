package memreg

import (
	"errors"
	"testing"
)

// TestBatch: ProvideTo keeps its reserve, ReceivedBatch and ReleaseBatch do what Received
// and Release do for each buffer (handles, counts, stale handles refused, other regions'
// buffers released through their own region), and a closed region unmaps when the batch
// releases its last buffer.
func TestBatch(t *testing.T) {
	r := newRegion(t, Options{BufSize: 1024, Count: 8})
	loans := make([]Loan, 8)
	if n := r.provideTo(loans, 3); n != 5 || r.Free() != 3 || r.Lent() != 5 {
		t.Fatalf("ProvideTo keeping 3: lent %d, free %d", n, r.Free())
	}
	idx := []int{loans[0].Index(), loans[1].Index(), loans[2].Index()}
	bufs := make([]Buf, 3)
	if n, err := r.receivedBatch(idx, bufs); n != 3 || err != nil {
		t.Fatalf("ReceivedBatch: %d, %v", n, err)
	}
	if r.Held() != 3 || r.Lent() != 2 {
		t.Fatalf("held %d, lent %d", r.Held(), r.Lent())
	}
	for _, b := range bufs {
		if !b.Valid() || b.Bytes() == nil {
			t.Fatal("a batch handle is not valid")
		}
	}
	got := make([]Buf, 2)
	if n, err := r.receivedBatch([]int{loans[3].Index(), idx[0]}, got); n != 1 || !errors.Is(err, ErrStale) {
		t.Fatalf("ReceivedBatch of a held buffer after a good one: %d, %v", n, err)
	}
	if n, err := r.receivedBatch([]int{99}, make([]Buf, 1)); n != 0 || !errors.Is(err, ErrStale) {
		t.Fatalf("ReceivedBatch(99): %d, %v", n, err)
	}
	other := newRegion(t, Options{BufSize: 1024, Count: 2})
	ob, err := other.Get()
	if err != nil {
		t.Fatal(err)
	}
	stale := bufs[1]
	if err := r.ReleaseBatch([]Buf{bufs[0], bufs[1], ob, stale, {}}); !errors.Is(err, ErrStale) {
		t.Fatalf("ReleaseBatch with a stale handle: %v", err)
	}
	if r.Held() != 2 || other.Held() != 0 || bufs[0].Valid() { // of the 4 held (the 3 and loans[3]), 2 released
		t.Fatalf("after ReleaseBatch: held %d here, %d in the other region", r.Held(), other.Held())
	}
	// Closed with buffers held: the batch that releases the last ones unmaps it.
	r.CloseWhenReleased()
	if r.Memory() == nil {
		t.Fatal("unmapped while buffers are held")
	}
	if err := r.ReleaseBatch([]Buf{bufs[2], got[0]}); err != nil {
		t.Fatal(err)
	}
	if r.Held() != 0 || r.Memory() != nil {
		t.Fatalf("after the last release: held %d, mapped %v", r.Held(), r.Memory() != nil)
	}
}

// TestLendReturnBatch: LendBatch and ReturnBatch do what Lend and Return do for each buffer,
// stop (lend) or go on (return) at what they cannot take, and a closed region refuses to
// lend.
func TestLendReturnBatch(t *testing.T) {
	r := newRegion(t, Options{BufSize: 1024, Count: 8})
	bufs := make([]Buf, 4)
	for i := range bufs {
		var err error
		if bufs[i], err = r.Get(); err != nil {
			t.Fatal(err)
		}
	}
	other := newRegion(t, Options{BufSize: 1024, Count: 2})
	ob, err := other.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Release()
	loans := make([]Loan, 4)
	if n, err := r.LendBatch([]Buf{bufs[0], bufs[1], ob, bufs[2]}, loans); n != 2 || !errors.Is(err, ErrStale) {
		t.Fatalf("LendBatch with another region's buffer third: %d, %v", n, err)
	}
	if r.Lent() != 2 || r.Held() != 2 || bufs[0].Valid() {
		t.Fatalf("lent %d, held %d", r.Lent(), r.Held())
	}
	if n, err := r.LendBatch([]Buf{bufs[0]}, loans[2:]); n != 0 || !errors.Is(err, ErrStale) {
		t.Fatalf("LendBatch of a lent handle: %d, %v", n, err)
	}
	if err := r.ReturnBatch([]Loan{loans[0], loans[0], loans[1]}); !errors.Is(err, ErrStale) {
		t.Fatalf("ReturnBatch with a loan twice: %v", err)
	}
	if r.Lent() != 0 || r.Free() != 6 {
		t.Fatalf("after ReturnBatch: lent %d, free %d", r.Lent(), r.Free())
	}
	r.CloseWhenReleased()
	if n, err := r.LendBatch(bufs[2:], loans); n != 0 || !errors.Is(err, ErrClosed) {
		t.Fatalf("LendBatch on a closed region: %d, %v", n, err)
	}
	if err := r.ReleaseBatch(bufs[2:]); err != nil {
		t.Fatal(err)
	}
}
