package zc

import "testing"

// BenchmarkAdaptiveDecision measures the per-send path decision of an adaptive connection
// that has switched to copying sends (the common case on loopback).
func BenchmarkAdaptiveDecision(b *testing.B) {
	cfg := Config{}
	if err := cfg.normalize(); err != nil {
		b.Fatal(err)
	}
	var p zcPolicy
	p.init(&cfg)
	p.set(zcOff)
	p.reprobe = 1 << 30
	n := 0
	for b.Loop() {
		if p.use(64 << 10) {
			n++
		}
	}
	if n != 0 {
		b.Fatal("probed unexpectedly")
	}
}

// The adaptive policy: probe once, switch to copying when the kernel copied, probe again
// after ZCReprobe sends with a doubling interval; stay on zero-copy when it really happens.
func TestZCPolicy(t *testing.T) {
	cfg := Config{ZCThreshold: 1000, ZCReprobe: 4}
	if err := cfg.normalize(); err != nil {
		t.Fatal(err)
	}
	var p zcPolicy
	p.init(&cfg)
	if p.use(999) {
		t.Fatal("below the threshold went zero-copy")
	}
	if !p.wouldUse(1000) || !p.use(1000) {
		t.Fatal("first large send did not probe")
	}
	if p.use(1000) {
		t.Fatal("second send went zero-copy while the probe is out")
	}
	if !p.notified(true) || p.on() {
		t.Fatal("a copied probe did not switch to copying")
	}
	probes := 0
	for i := 0; i < 4+8; i++ {
		if p.use(1000) {
			probes++
			p.notified(true) // copied again: interval doubles
		}
	}
	if probes != 2 {
		t.Fatalf("%d probes in 12 sends with reprobe 4 then 8, want 2", probes)
	}
	// A probe that is not copied turns zero-copy on for good.
	p2 := zcPolicy{}
	p2.init(&cfg)
	p2.use(5000)
	if p2.notified(false) || !p2.on() || !p2.use(5000) || !p2.use(5000) {
		t.Fatal("an uncopied probe did not keep zero-copy on")
	}
	// Two copied verdicts in a row while on switch back to copying.
	p2.notified(true)
	if !p2.notified(true) || p2.on() {
		t.Fatal("did not switch off after two copies")
	}
	// A failed probe (no verdict) probes again.
	p3 := zcPolicy{}
	p3.init(&cfg)
	p3.use(5000)
	p3.abandoned()
	if !p3.use(5000) {
		t.Fatal("no new probe after an abandoned one")
	}
	// Forced paths.
	for _, tc := range []struct {
		path SendPath
		want bool
	}{{SendCopy, false}, {SendZeroCopy, true}} {
		c := cfg
		c.SendPath = tc.path
		var q zcPolicy
		q.init(&c)
		if q.use(1) != tc.want || q.use(1<<20) != tc.want || q.on() != tc.want {
			t.Fatalf("%v: wrong decision", tc.path)
		}
	}
}
