package zc

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/leakcheck"
	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/internal/zcrx"
	"github.com/zcnet/zcnet/memreg"
)

func TestMain(m *testing.M) {
	if os.Getenv(seccompChildEnv) != "" {
		os.Exit(seccompChild())
	}
	if os.Getenv(memlockChildEnv) != "" {
		os.Exit(memlockChild())
	}
	if os.Getenv(memlockCloseChildEnv) != "" {
		os.Exit(memlockCloseChild())
	}
	if os.Getenv(steerChildEnv) != "" {
		os.Exit(steerChild())
	}
	netns.RemoveStale(steerNSPrefix)
	// Connections finish closing asynchronously: give stragglers a few seconds.
	code := leakcheck.Main(m, 5*time.Second,
		leakcheck.Check{Name: "rings", Open: uring.OpenRings},
		leakcheck.Check{Name: "regions", Open: memreg.OpenRegions},
		leakcheck.Check{Name: "buffer rings", Open: uring.OpenBufRings},
		leakcheck.Check{Name: "zcrx receivers", Open: zcrx.OpenReceivers},
	)
	if ns := netns.Own(steerNSPrefix); len(ns) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: network namespaces left behind: %v\n", ns)
		code = 1
	}
	os.Exit(code)
}
