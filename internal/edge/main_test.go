package edge

import (
	"fmt"
	"os"
	"testing"

	"github.com/edgeguard/edgeguard/internal/leakcheck"
)

// TestMain fails the package when a goroutine outlives the tests: every
// edge the tests start is stopped, so whatever New or Run started must be
// gone too.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := leakcheck.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}
