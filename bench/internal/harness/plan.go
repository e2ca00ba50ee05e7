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
func Interleave(variants []Variant, reps int) []Run {
	runs := make([]Run, 0, len(variants)*reps)
	for r := range reps {
		for k := range variants {
			i := k
			if r%2 == 1 {
				i = len(variants) - 1 - k
			}
			runs = append(runs, Run{Variant: variants[i], Index: i, Rep: r})
		}
	}
	return runs
}
