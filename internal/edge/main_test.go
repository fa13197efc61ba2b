package edge

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/edgeguard/edgeguard/internal/leakcheck"
)

// TestMain fails the package when a goroutine outlives the tests: every
// edge the tests start is stopped, so whatever New or Run started must be
// gone too.
//
// The tests that call t.Parallel (the canary pushes and the shared ACME
// account) spend their time waiting: on a canary's judgement, Prometheus's
// scrapes, a certificate's renewal. They run all at once unless
// -test.parallel says otherwise: at the default (GOMAXPROCS, two on a small
// machine) they would wait two by two.
func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		if err := flag.Set("test.parallel", "8"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
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
