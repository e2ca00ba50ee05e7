package zc

import "testing"

// BenchmarkAdaptiveDecision measures the per-send path decision of an adaptive connection
// that has switched to copying sends (the common case on loopback).
func BenchmarkAdaptiveDecision(b *testing.B) {
	e := &Engine{cfg: Config{}}
	e.cfg.defaults()
	c := newConn(e, &equeue{}, -1, "tcp")
	c.zcState.Store(zcOff)
	c.reprobe = 1 << 30
	n := 0
	for b.Loop() {
		if c.useZC(64 << 10) {
			n++
		}
	}
	if n != 0 {
		b.Fatal("probed unexpectedly")
	}
}
