//go:build race

package integration

// raceEnabled says whether the race detector is on: its sync.Pool drops a
// share of what is put back, so pooled objects are made anew now and then.
const raceEnabled = true
