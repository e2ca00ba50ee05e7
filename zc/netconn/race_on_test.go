//go:build race

package netconn

// raceOn: the race detector's instrumentation may allocate, so allocation counts are not
// asserted under it.
const raceOn = true
