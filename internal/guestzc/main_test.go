package guestzc

import (
	"os"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/leakcheck"
	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/memreg"
)

// TestMain fails the run when a test leaves a descriptor, a ring, a region or a NIC pair
// (its namespace) behind.
func TestMain(m *testing.M) {
	code := leakcheck.Main(m, 5*time.Second,
		leakcheck.Check{Name: "rings", Open: uring.OpenRings},
		leakcheck.Check{Name: "regions", Open: memreg.OpenRegions},
		leakcheck.Check{Name: "buffer rings", Open: uring.OpenBufRings},
		leakcheck.Check{Name: "NIC pairs (network namespaces)", Open: testutil.OpenNICPairs},
	)
	os.Exit(code)
}
