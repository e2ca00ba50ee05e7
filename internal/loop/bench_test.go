package loop

import "testing"

// BenchmarkPostRoundTrip measures handing work to a queue from another goroutine and waiting
// for it (a wake-up of a sleeping queue included when it sleeps).
func BenchmarkPostRoundTrip(b *testing.B) {
	q := newQueue(b, Config{NoPin: true, SendBufs: 4, RecvBufs: 4})
	for b.Loop() {
		if err := q.Do(func() error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}
