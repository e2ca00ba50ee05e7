package stats

import (
	"math"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want Summary
	}{
		{nil, Summary{}},
		{[]float64{7}, Summary{7, 7, 7, 1}},
		{[]float64{3, 1, 2}, Summary{2, 1, 3, 3}},
		{[]float64{4, 1, 3, 2}, Summary{2.5, 1, 4, 4}},
		{[]float64{5, math.NaN(), 1, 9}, Summary{5, 1, 9, 3}},
		{[]float64{math.NaN()}, Summary{}},
	} {
		if got := Summarize(tc.in); got != tc.want {
			t.Errorf("Summarize(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestSummarizeDoesNotReorderInput(t *testing.T) {
	in := []float64{3, 1, 2}
	Summarize(in)
	if in[0] != 3 || in[1] != 1 || in[2] != 2 {
		t.Fatalf("input changed: %v", in)
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 1000; i++ {
		s = append(s, time.Duration(i))
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 500}, {99, 990}, {99.9, 999}, {100, 1000}, {0.01, 1}} {
		if got := Percentile(s, tc.p); got != tc.want {
			t.Errorf("Percentile(1..1000, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Percentile(s[:10], 99.9); got != 10 {
		t.Errorf("p99.9 of 10 samples = %v, want the maximum", got)
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("empty = %v", got)
	}
	if got := Percentile([]time.Duration{1, 2}, 50); got != 1 {
		t.Errorf("p50 of {1,2} = %v, want 1 (nearest rank)", got)
	}
}

func TestMerge(t *testing.T) {
	var a, b Recorder
	for i := 100; i >= 1; i-- {
		if i%2 == 0 {
			a.Add(time.Duration(i) * time.Microsecond)
		} else {
			b.Add(time.Duration(i) * time.Microsecond)
		}
	}
	l := Merge(&a, &b, &Recorder{})
	want := Latencies{N: 100, P50: 50 * time.Microsecond, P99: 99 * time.Microsecond, P999: 100 * time.Microsecond,
		Mean: 50500 * time.Nanosecond, Min: time.Microsecond, Max: 100 * time.Microsecond}
	if l != want {
		t.Fatalf("Merge = %+v, want %+v", l, want)
	}
	if (Merge() != Latencies{}) {
		t.Fatal("Merge of nothing is not zero")
	}
}
