package iperf

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	doc := `{"start":{},"intervals":[],"end":{"sum_sent":{"bytes":2000,"bits_per_second":17.0},
		"sum_received":{"bytes":1500000000,"bits_per_second":12000000000.5}}}`
	r, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if r.Bytes != 1500000000 || r.BitsPerSecond != 12000000000.5 {
		t.Fatalf("got %+v, want the receiver's totals", r)
	}
	for _, bad := range []string{`{"error":"unable to connect to server"}`, `{"end":{}}`, `not json`} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%s) accepted", bad)
		}
	}
}

// iperf3 reads -t with atoi: 0 would run forever.
func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int{0: 1, 300 * time.Millisecond: 1, 1600 * time.Millisecond: 2, 5 * time.Second: 5} {
		if got := Seconds(d); got != want {
			t.Errorf("Seconds(%v) = %d, want %d", d, got, want)
		}
	}
}
