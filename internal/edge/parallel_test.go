package edge

import (
	"flag"
	"strconv"
	"testing"
)

// Most of this package's tests run one at a time. Those that mostly wait
// (on a slow origin, a drain, a grace or a timeout of their own: a third
// of a core or less, most a tenth), start their own servers and touch no state of the
// package call waiting: they run side by side after the others, at most
// waitingAtOnce of them at once. The canary pushes and the shared ACME
// account, which wait too but each run Consul agents, Prometheus or Pebble
// of their own, call heavyWaiting instead: at most two of them at once
// (five at once failed one run of 90 under the busy recipe, a canary
// region's edges not healthy in Consul's catalog within 20 s). Eight
// waiting tests at once, under the busy recipe with a second test run
// beside it, failed 2 rounds of 30: a shutdown's half-second margin, since
// widened, and TestH2ZeroWindowStreamsEnd, which fails alone under that
// load too and runs alone again.
//
// A test waiting for its turn holds one of go test's parallel places, so
// TestMain sets -test.parallel to parallelTests, room for every heavy
// test and the waiting ones (unless the command line gives it).
const (
	waitingAtOnce = 3
	parallelTests = 8
)

var (
	waitingNow = make(chan struct{}, waitingAtOnce)
	heavyNow   = make(chan struct{}, 2)
)

// waiting marks a test that mostly waits: it runs beside the others that do.
func waiting(t *testing.T) { t.Parallel(); take(t, waitingNow) }

// heavyWaiting is waiting for a test with servers of weight (Consul,
// Prometheus, Pebble).
func heavyWaiting(t *testing.T) { t.Parallel(); take(t, heavyNow) }

// take waits for a place in places and gives it back when t ends.
func take(t *testing.T, places chan struct{}) {
	places <- struct{}{}
	t.Cleanup(func() { <-places })
}

// setParallel sets -test.parallel to parallelTests unless the command
// line gave it.
func setParallel() {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", strconv.Itoa(parallelTests))
	}
}
