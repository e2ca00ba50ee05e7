package memregops

import (
	"errors"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/memreg"
)

func newPool(t testing.TB, count int) (*memreg.Pool, *memreg.Region) {
	p, err := memreg.NewPool(memreg.PoolOptions{BufSize: 1024, Initial: count, MaxBytes: 1024 * count})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.CloseWhenReleased() })
	return p, p.Regions()[0]
}

// TestThroughTheTable drives every operation through the table memreg filled: a receive
// region's buffers provided, received, released to the recycler and provided again; a batch;
// pool-wide ids located; a kernel table's hold refusing Close until it is released.
func TestThroughTheTable(t *testing.T) {
	p, r := newPool(t, 8)
	var recycled []int
	SetRecycler(r, func(idx int) { recycled = append(recycled, idx) })
	var loans []memreg.Loan
	if n := Provide(r, 3, func(l memreg.Loan) { loans = append(loans, l) }); n != 3 || len(loans) != 3 || r.Lent() != 3 {
		t.Fatalf("Provide(3): %d, %d loans, %d lent", n, len(loans), r.Lent())
	}
	b, err := Received(r, loans[0].Index())
	if err != nil || !b.Valid() {
		t.Fatalf("Received: %v", err)
	}
	if _, err := Received(r, loans[0].Index()); !errors.Is(err, memreg.ErrStale) {
		t.Fatalf("second Received of one buffer: %v", err)
	}
	if err := b.Release(); err != nil || len(recycled) != 1 || recycled[0] != loans[0].Index() {
		t.Fatalf("Release to the recycler: %v, recycled %v", err, recycled)
	}
	more := make([]memreg.Loan, 8)
	if n := ProvideTo(r, more, 2); n != 3 || r.Free() != 2 {
		t.Fatalf("ProvideTo keeping 2: %d, free %d", n, r.Free())
	}
	out := make([]memreg.Buf, 2)
	if n, err := ReceivedBatch(r, []int{more[0].Index(), more[1].Index()}, out); n != 2 || err != nil {
		t.Fatalf("ReceivedBatch: %d, %v", n, err)
	}
	if reg, idx, ok := Locate(p, 5); !ok || reg != r || idx != 5 {
		t.Fatalf("Locate(5) = %p %d %v", reg, idx, ok)
	}
	if _, _, ok := Locate(p, 8); ok {
		t.Fatal("Locate past the end")
	}

	// A kernel table's hold: Close refuses until the table lets go.
	h, err := memreg.New(memreg.Options{BufSize: 4096, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := HoldForKernel(h); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); !errors.Is(err, memreg.ErrBusy) {
		t.Fatalf("Close while held for the kernel: %v", err)
	}
	if h.Memory() == nil {
		t.Fatal("unmapped under a kernel table")
	}
	ReleaseFromKernel(h)
	if err := h.Close(); err != nil {
		t.Fatalf("Close after the kernel table let go: %v", err)
	}
	if err := HoldForKernel(h); !errors.Is(err, memreg.ErrClosed) {
		t.Fatalf("HoldForKernel after Close: %v", err)
	}
}

// TestNotInMemregDoc: memreg's godoc names none of the module-only operations (the issue's
// list, and the batch calls only the module's raw queues use to provide and receive).
func TestNotInMemregDoc(t *testing.T) {
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join("..", "..", "memreg", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, f := range paths {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, af)
	}
	pkg, err := doc.NewFromFiles(fset, files, "github.com/zcnet/zcnet/memreg")
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	for _, f := range pkg.Funcs {
		shown[f.Name] = true
	}
	for _, typ := range pkg.Types {
		for _, f := range append(typ.Funcs, typ.Methods...) {
			shown[f.Name] = true
		}
	}
	if !shown["Get"] || !shown["Release"] {
		t.Fatalf("the scan sees no Get or Release: %v", shown)
	}
	for _, n := range []string{"SetRecycler", "HoldForKernel", "ReleaseFromKernel", "Locate", "Provide",
		"ProvideTo", "Received", "ReceivedBatch", "Abandon", "FirstIndex"} {
		if shown[n] {
			t.Errorf("memreg's godoc shows %s, which only the module calls (internal/memregops)", n)
		}
	}
}

// BenchmarkReceiveRelease is the ring pool's hot path: a provided buffer received and
// released to its recycler, which lends it to the kernel again.
func BenchmarkReceiveRelease(b *testing.B) {
	_, r := newPool(b, 64)
	SetRecycler(r, func(int) {})
	Provide(r, r.Count(), func(memreg.Loan) {})
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		buf, err := Received(r, i&63)
		if err != nil {
			b.Fatal(err)
		}
		buf.Release()
	}
}

// TestMemlock reads the limit as the process sees it: both calls agree, and a limit that
// does not apply (none, or CAP_IPC_LOCK) is not reported as one.
func TestMemlock(t *testing.T) {
	soft, err := MemlockSoft()
	if err != nil {
		t.Fatal(err)
	}
	limit, ok := MemlockLimit()
	if ok && limit != soft {
		t.Fatalf("MemlockLimit %d, soft limit %d", limit, soft)
	}
	if soft == unix.RLIM_INFINITY && ok {
		t.Fatal("no limit reported as one")
	}
}
