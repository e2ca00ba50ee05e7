// Package slot is where memreg leaves its module-only operations for package memregops: memreg
// imports slot (so slot cannot name memreg's types: the table is generic) and fills it in its
// init; memregops, which imports memreg, takes the table out typed. Nothing else uses slot.
package slot

// Table holds memreg's module-only operations on regions (R), pools (P), loans (L) and
// buffers (B): the methods' unexported implementations as method expressions, so a call
// through the table allocates nothing.
type Table[R, P, L, B any] struct {
	SetRecycler       func(r R, fn func(idx int))
	HoldForKernel     func(r R) error
	ReleaseFromKernel func(r R)
	Provide           func(r R, n int, fn func(l L)) int
	ProvideTo         func(r R, loans []L, keep int) int
	Received          func(r R, idx int) (B, error)
	ReceivedBatch     func(r R, idx []int, out []B) (int, error)
	Locate            func(p P, idx int) (R, int, bool)
	LendShared        func(b B) (L, bool, error)
}

var table any

// Set is called once, by memreg's init.
func Set[R, P, L, B any](t *Table[R, P, L, B]) { table = t }

// Get returns the table memreg set; it panics if memreg set none or one of other types (a
// mistake of the module, caught by memregops' tests at init).
func Get[R, P, L, B any]() *Table[R, P, L, B] { return table.(*Table[R, P, L, B]) }
