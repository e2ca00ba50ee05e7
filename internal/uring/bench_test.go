package uring

import "testing"

// BenchmarkNopSubmitComplete measures the cost of one operation through the ring: prepare,
// submit, reap. With batch > 1 many SQEs share one io_uring_enter.
func BenchmarkNopSubmitComplete(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run(map[int]string{1: "batch=1", 32: "batch=32"}[batch], func(b *testing.B) {
			r := newRing(b, 64, nil)
			cqes := make([]CQE, 64)
			ops := 0
			for b.Loop() {
				for i := 0; i < batch; i++ {
					r.GetSQE().PrepNop()
				}
				if _, err := r.SubmitAndWait(uint32(batch)); err != nil {
					b.Fatal(err)
				}
				for got := 0; got < batch; {
					got += r.PeekBatch(cqes)
				}
				ops += batch
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(ops), "ns/op-each")
		})
	}
}
