package edge

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/edgeguard/edgeguard/internal/leakcheck"
)

// TestMain runs the waiting tests parallelTests at once (parallel_test.go)
// and fails the package when a goroutine outlives the tests: every
// edge the tests start is stopped, so whatever New or Run started must be
// gone too.
func TestMain(m *testing.M) {
	flag.Parse()
	setParallel()
	code := m.Run()
	if code == 0 {
		// certmagic keeps one rate limiter per ACME CA and account for the
		// process's life (a package-level map), by design.
		if err := leakcheck.Find(goleak.IgnoreAnyFunction("github.com/caddyserver/certmagic.(*RingBufferRateLimiter).loop")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}
