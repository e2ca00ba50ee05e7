package netconn

import (
	"os"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/leakcheck"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/internal/zcrx"
	"github.com/zcnet/zcnet/memreg"
)

// TestMain fails the run on what the tests leave behind: descriptors, rings, registered
// regions, buffer rings, zcrx receivers (zc's own TestMain's checks; connections finish
// closing asynchronously: stragglers get a few seconds).
func TestMain(m *testing.M) {
	os.Exit(leakcheck.Main(m, 5*time.Second,
		leakcheck.Check{Name: "rings", Open: uring.OpenRings},
		leakcheck.Check{Name: "regions", Open: memreg.OpenRegions},
		leakcheck.Check{Name: "buffer rings", Open: uring.OpenBufRings},
		leakcheck.Check{Name: "zcrx receivers", Open: zcrx.OpenReceivers},
	))
}
