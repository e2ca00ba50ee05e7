package harness

// Variant is one line of the results: a scenario run by one mode at one size and
// connection count.
type Variant struct {
	Scenario Scenario
	Mode     string
	Size     int
	Conns    int
}

// Run is one repetition of one variant.
type Run struct {
	Variant
	Index int // position of the variant in the list given to Interleave
	Rep   int // 0-based repetition
}

// Interleave orders reps repetitions of variants as A B C C B A A B C ...: every variant
// runs once per round, so slow drift of a shared machine spreads over all of them, and odd
// rounds run backwards, so no variant always runs right after the same neighbour (a mode
// that always followed a CPU-heavy one would carry its warm caches or its leftover load).
//
// Variants for which floating is true (the A/A copies) leave that order: in each round
// they are inserted at a position that moves from the start of the round towards its end
// over the rounds, each floating variant offset from the others, so an A/A pair is not
// always measured back to back and its ratio sees the position effects the other
// comparisons of the run are exposed to. floating may be nil.
func Interleave(variants []Variant, reps int, floating func(Variant) bool) []Run {
	var fixed, float []int
	for i, v := range variants {
		if floating != nil && floating(v) {
			float = append(float, i)
		} else {
			fixed = append(fixed, i)
		}
	}
	runs := make([]Run, 0, len(variants)*reps)
	for r := range reps {
		round := make([]int, 0, len(variants))
		for k := range fixed {
			i := fixed[k]
			if r%2 == 1 {
				i = fixed[len(fixed)-1-k]
			}
			round = append(round, i)
		}
		slots := len(fixed) + 1
		for j, i := range float {
			pos := ((2*r+1)*slots/(2*reps) + j*slots/len(float)) % slots
			pos = min(pos, len(round))
			round = append(round[:pos], append([]int{i}, round[pos:]...)...)
		}
		for _, i := range round {
			runs = append(runs, Run{Variant: variants[i], Index: i, Rep: r})
		}
	}
	return runs
}
