package connstate

import (
	"sync"
	"sync/atomic"
	"testing"
)

// recvAt returns a Receive with reader r and n wrappers, reached through the transitions.
func recvAt(t *testing.T, r Reader, n int) *Receive {
	t.Helper()
	s := &Receive{}
	for range n {
		if !s.Wrap() {
			t.Fatalf("reaching %v/%d: Wrap refused", r, n)
		}
	}
	path := map[Reader][]Reader{ReadHandler: nil, ReadSelf: {ReadSelf}, ReadFace: {ReadFace}, ReadRelay: {ReadRelay}}[r]
	if r == ReadRelay && n > 0 {
		// Relay takes only an unwrapped connection: wrap afterwards is refused too, so
		// this state cannot be reached.
		return nil
	}
	for _, to := range path {
		if !s.Take(to) {
			t.Fatalf("reaching %v/%d: Take(%v) refused", r, n, to)
		}
	}
	if s.Reader() != r || s.Wrappers() != n {
		t.Fatalf("reached %v/%d, want %v/%d", s.Reader(), s.Wrappers(), r, n)
	}
	return s
}

// TestReceiveTransitions: every transition from every reachable state against the package
// doc's diagram: a move only along an arrow; anything else reports false and changes nothing.
func TestReceiveTransitions(t *testing.T) {
	type state struct {
		r Reader
		n int
	}
	type op struct {
		name string
		do   func(*Receive) bool
		// to: the state reached from s, and whether the move is allowed
		to func(s state) (state, bool)
	}
	take := func(to Reader) func(s state) (state, bool) {
		return func(s state) (state, bool) {
			switch {
			case to == ReadSelf && s.r == ReadHandler,
				to == ReadFace && (s.r == ReadHandler || s.r == ReadSelf),
				to == ReadRelay && s.r == ReadHandler && s.n == 0:
				return state{to, s.n}, true
			}
			return s, false
		}
	}
	ops := []op{
		{"Take(Handler)", func(s *Receive) bool { return s.Take(ReadHandler) }, func(s state) (state, bool) { return s, false }},
		{"Take(Self)", func(s *Receive) bool { return s.Take(ReadSelf) }, take(ReadSelf)},
		{"Take(Face)", func(s *Receive) bool { return s.Take(ReadFace) }, take(ReadFace)},
		{"Take(Relay)", func(s *Receive) bool { return s.Take(ReadRelay) }, take(ReadRelay)},
		{"Take(9)", func(s *Receive) bool { return s.Take(9) }, func(s state) (state, bool) { return s, false }},
		{"Untake(Relay)", func(s *Receive) bool { return s.Untake(ReadRelay) }, func(s state) (state, bool) {
			if s.r == ReadRelay {
				return state{ReadHandler, s.n}, true
			}
			return s, false
		}},
		{"Untake(Self)", func(s *Receive) bool { return s.Untake(ReadSelf) }, func(s state) (state, bool) { return s, false }},
		{"Untake(Face)", func(s *Receive) bool { return s.Untake(ReadFace) }, func(s state) (state, bool) { return s, false }},
		{"Wrap", (*Receive).Wrap, func(s state) (state, bool) {
			if s.r == ReadRelay {
				return s, false
			}
			return state{s.r, s.n + 1}, true
		}},
		{"Unwrap", (*Receive).Unwrap, func(s state) (state, bool) {
			if s.n == 0 {
				return s, false
			}
			return state{s.r, s.n - 1}, true
		}},
	}
	for _, o := range ops {
		for r := ReadHandler; r <= ReadRelay; r++ {
			for n := range 3 {
				s := recvAt(t, r, n)
				if s == nil {
					continue
				}
				want, ok := o.to(state{r, n})
				if got := o.do(s); got != ok || s.Reader() != want.r || s.Wrappers() != want.n {
					t.Errorf("%v from %v/%d: moved %v to %v/%d, want %v to %v/%d", o.name, r, n, got, s.Reader(), s.Wrappers(), ok, want.r, want.n)
				}
			}
		}
	}
}

// TestReceiveOneWinner: claims racing from many goroutines: exactly one Take(Relay) wins,
// and no Wrap succeeds once it did (run under -race).
func TestReceiveOneWinner(t *testing.T) {
	for range 200 {
		s := &Receive{}
		var wins, wraps atomic.Int32
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i%2 == 0 {
					if s.Take(ReadRelay) {
						wins.Add(1)
					}
				} else if s.Wrap() {
					wraps.Add(1)
				}
			}()
		}
		wg.Wait()
		switch {
		case wins.Load() > 1:
			t.Fatalf("%d relays took one connection", wins.Load())
		case wins.Load() == 1 && (wraps.Load() != 0 || s.Wrappers() != 0):
			t.Fatalf("a relay and %d wrappers", wraps.Load())
		case wins.Load() == 0 && int(wraps.Load()) != s.Wrappers():
			t.Fatalf("%d wraps counted %d", wraps.Load(), s.Wrappers())
		}
	}
}

func TestReaderStrings(t *testing.T) {
	for r, w := range map[Reader]string{ReadHandler: "handler", ReadSelf: "self", ReadFace: "face", ReadRelay: "relay", 9: "connstate.Reader(?)"} {
		if r.String() != w {
			t.Errorf("Reader(%d) = %q, want %q", r, r.String(), w)
		}
	}
}
