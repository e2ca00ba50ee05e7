// Package stats holds the small statistics zcbench reports: medians with their
// spread over repetitions, and latency percentiles.
package stats

import (
	"math"
	"slices"
	"time"
)

// Summary is a figure measured over several repetitions.
type Summary struct {
	Median, Min, Max float64
	N                int
}

// Summarize returns the median, minimum and maximum of xs (NaN values ignored). The
// median of an even count is the mean of the two middle values. An empty input
// gives a zero Summary with N == 0.
func Summarize(xs []float64) Summary {
	s := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return Summary{}
	}
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Summary{Median: med, Min: s[0], Max: s[n-1], N: n}
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest value such that at least p percent of the
// samples are at or below it. It returns 0 for an empty slice.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p*float64(n)/100 - 1e-9)) // tolerate 99.9*1000/100 = 999.0000001
	rank = max(1, min(rank, n))
	return sorted[rank-1]
}

// Recorder collects latency samples of one goroutine.
type Recorder struct {
	samples []time.Duration
}

// Add records one sample.
func (r *Recorder) Add(d time.Duration) { r.samples = append(r.samples, d) }

// Len is the number of samples.
func (r *Recorder) Len() int { return len(r.samples) }

// Latencies are percentiles of a set of samples.
type Latencies struct {
	N              int
	P50, P99, P999 time.Duration
	Mean, Min, Max time.Duration
}

// Merge sorts the samples of all recorders together and returns their percentiles.
func Merge(rs ...*Recorder) Latencies {
	var all []time.Duration
	for _, r := range rs {
		all = append(all, r.samples...)
	}
	if len(all) == 0 {
		return Latencies{}
	}
	slices.Sort(all)
	var sum time.Duration
	for _, d := range all {
		sum += d
	}
	return Latencies{
		N:    len(all),
		P50:  Percentile(all, 50),
		P99:  Percentile(all, 99),
		P999: Percentile(all, 99.9),
		Mean: sum / time.Duration(len(all)),
		Min:  all[0],
		Max:  all[len(all)-1],
	}
}
