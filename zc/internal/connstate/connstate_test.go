package connstate

import (
	"sync"
	"testing"
)

// at returns a State in life l with socket k, reached through the transitions only.
func at(t *testing.T, l Life, k Socket) *State {
	t.Helper()
	s := &State{}
	path := map[Life][]func() bool{
		New:      nil,
		Open:     {s.Open},
		Closing:  {s.Open, s.BeginClose},
		Finished: {s.Open, s.BeginClose, s.Finish},
	}[l]
	for _, f := range path {
		if !f() {
			t.Fatalf("reaching %v: a transition refused", l)
		}
	}
	switch k {
	case WriteShut:
		s.ShutWrite()
	case SockClosed:
		s.CloseSock()
	}
	if s.Life() != l || s.Socket() != k {
		t.Fatalf("reached %v/%v, want %v/%v", s.Life(), s.Socket(), l, k)
	}
	return s
}

// TestLifeTransitions: every transition from every state, against the table of the package
// doc: a move happens only along an arrow, anything else reports false and changes nothing.
func TestLifeTransitions(t *testing.T) {
	type op struct {
		name string
		do   func(*State) bool
		to   map[Life]Life // from → to; a from not listed refuses
	}
	ops := []op{
		{"Open", (*State).Open, map[Life]Life{New: Open}},
		{"BeginClose", (*State).BeginClose, map[Life]Life{New: Closing, Open: Closing}},
		{"Finish", (*State).Finish, map[Life]Life{New: Finished, Open: Finished, Closing: Finished}},
	}
	for _, o := range ops {
		for from := New; from <= Finished; from++ {
			s := at(t, from, SockOpen)
			want, ok := o.to[from]
			if !ok {
				want = from
			}
			if got := o.do(s); got != ok || s.Life() != want {
				t.Errorf("%v from %v: moved %v to %v, want %v to %v", o.name, from, got, s.Life(), ok, want)
			}
			if s.Socket() != SockOpen {
				t.Errorf("%v from %v changed the socket to %v", o.name, from, s.Socket())
			}
			if s.Opened() != (s.Life() >= Open) || s.InClose() != (s.Life() >= Closing) || s.Ended() != (s.Life() == Finished) {
				t.Errorf("%v from %v: questions disagree with %v", o.name, from, s.Life())
			}
		}
	}
}

func TestSocketTransitions(t *testing.T) {
	type op struct {
		name string
		do   func(*State) bool
		to   map[Socket]Socket
	}
	ops := []op{
		{"ShutWrite", (*State).ShutWrite, map[Socket]Socket{SockOpen: WriteShut}},
		{"CloseSock", (*State).CloseSock, map[Socket]Socket{SockOpen: SockClosed, WriteShut: SockClosed}},
	}
	for _, o := range ops {
		for from := SockOpen; from <= SockClosed; from++ {
			for l := New; l <= Finished; l++ {
				s := at(t, l, from)
				want, ok := o.to[from]
				if !ok {
					want = from
				}
				if got := o.do(s); got != ok || s.Socket() != want {
					t.Errorf("%v from %v: moved %v to %v, want %v to %v", o.name, from, got, s.Socket(), ok, want)
				}
				if s.Life() != l {
					t.Errorf("%v changed the life from %v to %v", o.name, l, s.Life())
				}
				if s.SockClosed() != (s.Socket() == SockClosed) {
					t.Errorf("SockClosed disagrees with %v", s.Socket())
				}
			}
		}
	}
}

// TestLifeReadAnywhere: a goroutine asking while the owner moves the state sees it only go
// forward (run under -race: Life is safe to read from any goroutine).
func TestLifeReadAnywhere(t *testing.T) {
	for range 200 {
		s := &State{}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := New
			for last != Finished {
				l := s.Life()
				if l < last {
					t.Errorf("life went back from %v to %v", last, l)
					return
				}
				last = l
			}
		}()
		s.Open()
		s.BeginClose()
		s.Finish()
		wg.Wait()
	}
}

func TestStrings(t *testing.T) {
	for l, w := range map[Life]string{New: "new", Open: "open", Closing: "closing", Finished: "finished", 9: "connstate.Life(?)"} {
		if l.String() != w {
			t.Errorf("Life(%d) = %q, want %q", l, l.String(), w)
		}
	}
	for k, w := range map[Socket]string{SockOpen: "open", WriteShut: "write-shut", SockClosed: "closed", 9: "connstate.Socket(?)"} {
		if k.String() != w {
			t.Errorf("Socket(%d) = %q, want %q", k, k.String(), w)
		}
	}
}
