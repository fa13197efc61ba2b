package origin

import (
	"fmt"
	"os"
	"testing"

	"github.com/edgeguard/edgeguard/internal/leakcheck"
)

// TestMain fails the package when a goroutine outlives the tests.
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
