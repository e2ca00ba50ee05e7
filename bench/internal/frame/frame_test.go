package frame

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// stream returns n frames of size bytes as one byte slice, as a Source makes them.
func stream(t testing.TB, size, n int, corrupt int64) []byte {
	t.Helper()
	src, err := NewSource(size, corrupt)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, size)
	src.Fill(buf)
	var out []byte
	for i := 0; i < n; i++ {
		if seq := src.Stamp(buf); seq != uint64(i) {
			t.Fatalf("Stamp = %d, want %d", seq, i)
		}
		out = append(out, buf...)
		src.Sent()
	}
	if src.Frames() != uint64(n) {
		t.Fatalf("Frames = %d", src.Frames())
	}
	return out
}

// feed gives b to v in random chunks.
func feed(v *Verifier, b []byte, r *rand.Rand) error {
	for len(b) > 0 {
		n := min(len(b), 1+r.IntN(3*len(b)/2+1))
		if r.IntN(4) == 0 {
			n = min(len(b), 1+r.IntN(3))
		}
		if err := v.Feed(b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{MinSize, 33, 64, 1000, 4096, 65536} {
		b := stream(t, size, 20, -1)
		called := 0
		v, err := NewVerifier(size, func() { called++ })
		if err != nil {
			t.Fatal(err)
		}
		if err := feed(v, b, r); err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if err := v.Close(); err != nil {
			t.Fatalf("size %d: Close: %v", size, err)
		}
		if v.Frames() != 20 || v.Bytes() != uint64(20*size) || called != 1 {
			t.Fatalf("size %d: frames %d bytes %d onData calls %d", size, v.Frames(), v.Bytes(), called)
		}
	}
}

func TestBadSize(t *testing.T) {
	if _, err := NewSource(MinSize-1, -1); err == nil {
		t.Error("NewSource accepted a frame smaller than MinSize")
	}
	if _, err := NewVerifier(MinSize-1, nil); err == nil {
		t.Error("NewVerifier accepted a frame smaller than MinSize")
	}
}

// Every single flipped bit anywhere in the stream is caught.
func TestEveryFlipCaught(t *testing.T) {
	const size, n = 64, 3
	b := stream(t, size, n, -1)
	for i := range b {
		for bit := 0; bit < 8; bit += 3 {
			c := append([]byte(nil), b...)
			c[i] ^= 1 << bit
			v, _ := NewVerifier(size, nil)
			err := v.Feed(c)
			if err == nil {
				err = v.Close()
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("flip of byte %d bit %d not caught (err %v)", i, bit, err)
			}
		}
	}
}

func TestLostDuplicatedReordered(t *testing.T) {
	const size = 128
	b := stream(t, size, 4, -1)
	f := func(i int) []byte { return b[i*size : (i+1)*size] }
	cases := map[string][][]byte{
		"lost":       {f(0), f(2)},
		"duplicated": {f(0), f(0)},
		"reordered":  {f(1), f(0)},
		"shifted":    {b[1 : size+1]},
	}
	for name, parts := range cases {
		v, _ := NewVerifier(size, nil)
		var err error
		for _, p := range parts {
			if err = v.Feed(p); err != nil {
				break
			}
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", name, err)
		}
		if err := v.Feed(f(0)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: verifier accepted data after failing", name)
		}
	}
}

func TestTruncated(t *testing.T) {
	const size = 100
	b := stream(t, size, 2, -1)
	v, _ := NewVerifier(size, nil)
	if err := v.Feed(b[:size+10]); err != nil {
		t.Fatal(err)
	}
	if err := v.Close(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Close after a partial frame = %v, want ErrCorrupt", err)
	}
}

func TestInjectedCorruption(t *testing.T) {
	const size = 256
	b := stream(t, size, 5, 3)
	v, _ := NewVerifier(size, nil)
	err := v.Feed(b)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("err = %v, want ErrCorrupt", err)
	}
	if v.Frames() != 3 {
		t.Fatalf("verified %d frames before the bad one, want 3", v.Frames())
	}
}

func FuzzVerifier(f *testing.F) {
	f.Add(stream(f, 40, 2, -1), 40)
	f.Add([]byte("zcB1"), 32)
	f.Fuzz(func(t *testing.T, b []byte, size int) {
		size = MinSize + abs(size)%4096
		v, err := NewVerifier(size, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = v.Feed(b)
		if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error not ErrCorrupt: %v", err)
		}
		if err == nil && v.Bytes() != uint64(len(b)/size*size) {
			t.Fatalf("accepted %d bytes of %d with frames of %d", v.Bytes(), len(b), size)
		}
	})
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func BenchmarkVerify64K(b *testing.B) {
	s := stream(b, 65536, 16, -1)
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		v, _ := NewVerifier(65536, nil)
		if err := v.Feed(s); err != nil {
			b.Fatal(err)
		}
	}
}

// Check accepts every frame a Source makes, in any order, and rejects any single
// flipped byte, a short frame and a frame of another size.
func TestCheck(t *testing.T) {
	for _, size := range []int{MinSize, 64, 1000} {
		b := stream(t, size, 5, -1)
		for i := 4; i >= 0; i-- { // reverse order: Check keeps no state
			seq, err := Check(b[i*size:(i+1)*size], size)
			if err != nil || seq != uint64(i) {
				t.Fatalf("size %d frame %d: seq %d, %v", size, i, seq, err)
			}
		}
		f := append([]byte(nil), b[:size]...)
		for pos := range f {
			f[pos] ^= 0x20
			if _, err := Check(f, size); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("size %d: byte %d flipped: err = %v", size, pos, err)
			}
			f[pos] ^= 0x20
		}
		if _, err := Check(f[:size-1], size); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("short frame: %v", err)
		}
	}
	if _, err := Check(stream(t, 64, 1, -1), 65); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("frame of another size: %v", err)
	}
	for _, size := range []int{MinSize, 64, 1000} {
		if _, err := Check(stream(t, size, 1, 0), size); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("size %d: the injected corruption was accepted: %v", size, err)
		}
	}
}

// The injected corruption is one payload byte under a correct checksum field: what a
// receiver that checked only the header and trailer would miss. The frames after it are
// whole again (the damaged byte is restored in a reused buffer).
func TestInjectedCorruptionIsPayload(t *testing.T) {
	const size = 256
	good, bad := stream(t, size, 3, -1), stream(t, size, 3, 1)
	var diff []int
	for i := range good {
		if good[i] != bad[i] {
			diff = append(diff, i)
		}
	}
	if len(diff) != 1 || diff[0] < size+hdrLen || diff[0] >= 2*size-trlLen {
		t.Fatalf("corrupted stream differs at %v, want one payload byte of frame 1", diff)
	}
	if _, err := Check(bad[size:2*size], size); err == nil || !strings.Contains(err.Error(), "payload CRC-32C") {
		t.Fatalf("Check of the damaged frame: %v, want a payload CRC-32C mismatch", err)
	}
	if _, err := Check(bad[2*size:], size); err != nil {
		t.Fatalf("the frame after the damaged one: %v", err)
	}
}
