//go:build !race

package zc

const raceEnabled = false
