package edge

import (
	"flag"
	"strconv"
	"testing"
)

// Most of this package's tests run one at a time. Those that mostly wait
// (on a slow origin, a drain, a grace or a timeout of their own: a tenth
// of a core or less), start their own servers and touch no state of the
// package call waiting: they run side by side, after the others, up to
// parallelTests at once (TestMain sets -test.parallel to it unless given).
// The canary pushes and the shared ACME account, which wait too but each
// run Consul agents, Prometheus or Pebble of their own, call heavyWaiting
// instead: at most two of them at once, whatever -test.parallel says
// (five at once failed one run of 90 under the busy recipe, a canary
// region's edges not healthy in Consul's catalog within 20 s).
const parallelTests = 8

var heavyAtOnce = make(chan struct{}, 2)

// waiting marks a test that mostly waits: it runs beside the others that do.
func waiting(t *testing.T) { t.Parallel() }

// heavyWaiting is waiting for a test with servers of weight (Consul,
// Prometheus, Pebble): it starts once fewer than two such tests run.
func heavyWaiting(t *testing.T) {
	t.Parallel()
	heavyAtOnce <- struct{}{}
	t.Cleanup(func() { <-heavyAtOnce })
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
