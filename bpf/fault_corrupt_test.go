package bpf

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/zcnet/zcnet/internal/testutil"
)

// TestFaultCorrupt: Corrupt flips bits of the last payload byte of the matching TCP
// segments on a (private) loopback, where TCP does not check its checksum, so the receiver
// reads the changed byte — and only that one; segments without payload are not counted;
// off again, bytes pass intact. Bad fractions, a closed or nil Fault are refused.
func TestFaultCorrupt(t *testing.T) {
	testutil.RequireFeature(t, testutil.KernelAtLeast("6.6"), "tcx links", "6.6")
	var f *Fault
	cli, srv, port := testutil.FaultPair(t, func(lo int) (err error) {
		f, err = NewFault(lo, false)
		return err
	})
	defer cli.Close()
	defer srv.Close()

	msg := []byte("a hundred bytes or so of payload, sent as one segment on loopback; its last byte is flipped")
	if err := f.Corrupt(1, port); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(srv, got); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(msg)
	want[len(want)-1] ^= 0x5a
	if !bytes.Equal(got, want) {
		t.Fatalf("read %q, want %q (only the last byte flipped)", got, want)
	}
	if n, err := f.Corrupted(); err != nil || n != 1 {
		t.Errorf("Corrupted = %d, %v; want 1 (the acknowledgements carry no payload)", n, err)
	}
	if err := f.Corrupt(0, port); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(srv, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("with corruption off: %v, %q", err, got)
	}
	if n, err := f.Corrupted(); err != nil || n != 1 {
		t.Errorf("Corrupted after turning it off = %d, %v; want still 1", n, err)
	}

	for _, frac := range []float64{-0.1, 1.5} {
		if err := f.Corrupt(frac, port); !errors.Is(err, ErrInvalid) {
			t.Errorf("Corrupt(%v): %v, want ErrInvalid", frac, err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Corrupt(1, port); !errors.Is(err, ErrClosed) {
		t.Errorf("Corrupt after Close: %v, want ErrClosed", err)
	}
	if _, err := f.Corrupted(); !errors.Is(err, ErrClosed) {
		t.Errorf("Corrupted after Close: %v, want ErrClosed", err)
	}
	var nf *Fault
	if err := nf.Corrupt(1, port); !errors.Is(err, ErrClosed) {
		t.Errorf("nil Fault: %v, want ErrClosed", err)
	}
}
