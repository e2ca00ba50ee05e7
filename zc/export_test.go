package zc

import "testing"

// Seams for zc's external tests (package zc_test), which may import the packages built on
// zc (zc/netconn) where zc's own tests may not.

// NeedShim skips (or fails, in the vmtest guests) a test that needs the zcshim module.
var NeedShim = needShim

// ZcrxExpected reports whether device-less zcrx must work here (it fails the test on a
// kernel new enough that refuses it).
var ZcrxExpected = zcrxExpected

// ShimCfg is the shim tests' engine config; SmallCfg a small one of backend b.
var ShimCfg, SmallCfg = shimCfg, smallCfg

// EachBackend runs fn as a subtest on each backend of zc's own tests (eachBackend).
var EachBackend = eachBackend

// WaitHang is waitHang for the external tests.
func WaitHang[T any](t *testing.T, ch <-chan T, what string, dump func() string) T {
	t.Helper()
	return waitHang(t, ch, what, dump)
}
