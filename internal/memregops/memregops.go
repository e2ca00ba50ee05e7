// Package memregops holds memreg's operations that only the module's own packages call: the
// provided-buffer rings' side of a region (zc's ring pools, hwq's raw queues), the kernel
// tables' holds on a region's memory (the fixed-buffer table), and the pool-wide buffer ids.
// They are not memreg's API (memreg's godoc shows a user what a user can call); memreg
// implements them unexported and hands them over through package slot at init.
package memregops

import (
	"github.com/zcnet/zcnet/internal/memregops/slot"
	"github.com/zcnet/zcnet/memreg"
)

var ops = slot.Get[*memreg.Region, *memreg.Pool, memreg.Loan, memreg.Buf]()

// SetRecycler makes r's released buffers go to fn (with the buffer lent to the kernel again)
// instead of the free list. Used for receive regions feeding a provided-buffer ring.
func SetRecycler(r *memreg.Region, fn func(idx int)) { ops.SetRecycler(r, fn) }

// HoldForKernel records that a kernel table (an io_uring fixed-buffer table, the zcshim
// module's region table) refers to r's memory: Close refuses with ErrBusy and the memory stays
// mapped until the matching ReleaseFromKernel. It fails with memreg.ErrClosed after Close. The
// table itself belongs to its owner.
func HoldForKernel(r *memreg.Region) error { return ops.HoldForKernel(r) }

// ReleaseFromKernel undoes one HoldForKernel (the table no longer refers to the memory).
func ReleaseFromKernel(r *memreg.Region) { ops.ReleaseFromKernel(r) }

// Provide lends free buffers of r to the kernel for receiving: up to n buffers are taken from
// the free list and passed to fn with their loans (fn adds them to a provided-buffer ring). It
// returns how many were provided.
func Provide(r *memreg.Region, n int, fn func(l memreg.Loan)) int { return ops.Provide(r, n, fn) }

// ProvideTo is Provide without a callback and without allocating: it lends up to len(loans)
// free buffers to the kernel, leaving at least keep buffers on the free list, and writes their
// loans to loans. It returns how many it lent (0 on a closed region).
func ProvideTo(r *memreg.Region, loans []memreg.Loan, keep int) int {
	return ops.ProvideTo(r, loans, keep)
}

// Received turns a buffer the kernel filled (provided-buffer ring id idx) into a handle the
// application borrows; its Release goes to the recycler set with SetRecycler.
func Received(r *memreg.Region, idx int) (memreg.Buf, error) { return ops.Received(r, idx) }

// ReceivedBatch is Received for several buffers under one lock: out[i] becomes the handle of
// buffer idx[i]. It stops at the first index that is out of range or not in the kernel's hands
// and returns how many it turned into handles, with that error.
func ReceivedBatch(r *memreg.Region, idx []int, out []memreg.Buf) (int, error) {
	return ops.ReceivedBatch(r, idx, out)
}

// Locate maps a pool-wide buffer index (a provided-buffer ring's id: region k's buffer i is
// the pool's buffer first(k)+i) to its region and the index inside it.
func Locate(p *memreg.Pool, idx int) (*memreg.Region, int, bool) { return ops.Locate(p, idx) }

// LendShared is b.Lend that also says whether the loan is one owner of a shared buffer
// (b.Shared just before), under one lock of the region instead of two.
func LendShared(b memreg.Buf) (memreg.Loan, bool, error) { return ops.LendShared(b) }
