//go:build race

package cli

// raceEnabled: the race detector's shadow memory multiplies the resident
// set, so RSS bounds do not apply (the Go heap is still measured).
const raceEnabled = true
