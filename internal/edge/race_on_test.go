//go:build race

package edge

// raceDetector: the race detector's instrumentation allocates, so
// allocation counts are only asserted without it.
const raceDetector = true
