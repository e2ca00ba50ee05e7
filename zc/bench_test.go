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
	// zcCopiedRun copied verdicts in a row, none uncopied, while on switch back to copying.
	for i := 1; i < zcCopiedRun; i++ {
		if p2.notified(true) || !p2.on() {
			t.Fatalf("switched off after %d copied verdicts, before a run of %d", i, zcCopiedRun)
		}
	}
	if !p2.notified(true) || p2.on() {
		t.Fatalf("did not switch off after %d copies in a row", zcCopiedRun)
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

// TestZCPolicyIgnoresLinkedCopied: on a real NIC io_uring reports a SEND_ZC linked to an
// earlier send's notification as copied although nothing was (io_link_skb), so a zero-copy
// connection sees copied verdicts mixed with uncopied ones. No mix may take it off
// zero-copy, however many copied verdicts it holds or how they cluster; a connection whose
// every verdict says copied (loopback, veth) still switches.
func TestZCPolicyIgnoresLinkedCopied(t *testing.T) {
	cfg := Config{ZCThreshold: 1000, ZCReprobe: 4}
	if err := cfg.normalize(); err != nil {
		t.Fatal(err)
	}
	on := func() *zcPolicy {
		p := &zcPolicy{}
		p.init(&cfg)
		p.use(5000)
		if p.notified(false) || !p.on() {
			t.Fatal("an uncopied probe did not turn zero-copy on")
		}
		return p
	}
	// Mixed sequences: 'c' copied, 'z' not copied. The measured ones: up to 45% copied,
	// in runs as long as a chain of linked sends (here up to zcCopiedRun-1).
	run := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = 'c'
		}
		return string(b)
	}
	mixed := map[string]string{
		"alternating":       "czczczczczczczczczczczczczczczczczczczcz",
		"pairs":             "cczcczcczcczcczcczcczcczcczcczcczcczcczz",
		"mostly copied":     run(zcCopiedRun-1) + "z" + run(zcCopiedRun-1) + "z" + run(zcCopiedRun-1) + "z",
		"copied then mixed": run(zcCopiedRun-1) + "zczcczcccz",
	}
	// A pseudo-random mix, 45% copied, runs capped below zcCopiedRun.
	var rnd []byte
	x, streak := uint32(29), 0
	for range 4096 {
		x = x*1664525 + 1013904223
		if x>>24 < 115 && streak < zcCopiedRun-1 {
			rnd = append(rnd, 'c')
			streak++
		} else {
			rnd = append(rnd, 'z')
			streak = 0
		}
	}
	mixed["random 45%"] = string(rnd)
	for name, seq := range mixed {
		p := on()
		for i, v := range seq {
			if p.notified(v == 'c') || !p.on() {
				t.Fatalf("%s: switched to copying at verdict %d of a mix %q", name, i, seq[:i+1])
			}
		}
		if p.switches.Load() != 0 {
			t.Fatalf("%s: %d switches", name, p.switches.Load())
		}
	}
	// Every verdict copied: the kernel copies (loopback): off after one run.
	p := on()
	switched := -1
	for i := range 4 * zcCopiedRun {
		if p.notified(true) {
			switched = i
			break
		}
	}
	if switched != zcCopiedRun-1 || p.on() || p.switches.Load() != 1 {
		t.Fatalf("all copied: switched at verdict %d (want %d), on %v, %d switches", switched, zcCopiedRun-1, p.on(), p.switches.Load())
	}
	// A copied probe (the first try, or a reprobe after copying) still switches at once.
	p4 := &zcPolicy{}
	p4.init(&cfg)
	p4.use(5000)
	if !p4.notified(true) || p4.on() {
		t.Fatal("a copied probe did not switch to copying")
	}
}
