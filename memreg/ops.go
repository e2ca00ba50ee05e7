package memreg

import "github.com/zcnet/zcnet/internal/memregops/slot"

// The module's own packages reach the operations below through internal/memregops (they are
// not memreg's API: see that package).
func init() {
	slot.Set(&slot.Table[*Region, *Pool, Loan, Buf]{
		SetRecycler:       (*Region).setRecycler,
		HoldForKernel:     (*Region).holdForKernel,
		ReleaseFromKernel: (*Region).releaseFromKernel,
		Provide:           (*Region).provide,
		ProvideTo:         (*Region).provideTo,
		Received:          (*Region).received,
		ReceivedBatch:     (*Region).receivedBatch,
		Locate:            (*Pool).locate,
		LendShared:        Buf.lendShared,
	})
}
