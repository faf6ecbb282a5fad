//go:build race

package integration

// raceEnabled says whether the race detector is on.
const raceEnabled = true
