package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// H2specVersion is the h2spec release scripts/install-h2spec.sh builds and
// caches.
const H2specVersion = "v2.2.1"

// H2spec finds h2spec, the HTTP/2 conformance checker: $EDGEGUARD_H2SPEC,
// else h2spec in PATH, else the binary scripts/install-h2spec.sh caches.
// When none is there the test fails if $EDGEGUARD_H2SPEC or $CI says it
// should be (make test sets the first), and is skipped otherwise.
func H2spec(t testing.TB) string {
	t.Helper()
	want := os.Getenv("EDGEGUARD_H2SPEC")
	if want != "" {
		p, err := exec.LookPath(want)
		if err != nil {
			t.Fatalf("testenv: EDGEGUARD_H2SPEC=%s is not an executable (run scripts/install-h2spec.sh): %v", want, err)
		}
		return p
	}
	if p, err := exec.LookPath("h2spec"); err == nil {
		return p
	}
	cache := os.Getenv("EDGEGUARD_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatalf("testenv: locating the cache: %v", err)
		}
		cache = filepath.Join(home, ".cache", "edgeguard")
	}
	cached := filepath.Join(cache, "h2spec-"+H2specVersion, "h2spec")
	if p, err := exec.LookPath(cached); err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("testenv: h2spec not found (no EDGEGUARD_H2SPEC, none in PATH, no %s): run scripts/install-h2spec.sh (make tools)", cached)
	}
	t.Skipf("testenv: h2spec not found (no %s): run scripts/install-h2spec.sh (make tools) or set EDGEGUARD_H2SPEC", cached)
	return ""
}
