//go:build !race

package integration

// raceEnabled says whether the race detector is on (race_test.go).
const raceEnabled = false
