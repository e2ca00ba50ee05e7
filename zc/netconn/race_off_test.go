//go:build !race

package netconn

const raceOn = false
