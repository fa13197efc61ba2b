//go:build golden

package mixedversion

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWriteRedisStates is the generator of pkg/limiter's stored Redis
// states (TestRedisStatesOfReleases). It exists only under the golden
// build tag, so no ordinary test run skips it:
//
//	go test -tags golden ./internal/mixedversion -run TestWriteRedisStates
//
// It extracts the previous release's tree, puts this tree's
// pkg/limiter/golden_state_test.go into it and runs that test there, so the
// states are written by the release's own store and scripts, into
// pkg/limiter/testdata/redis-states/v<version>.
func TestWriteRedisStates(t *testing.T) {
	root, err := repoRoot()
	require.NoError(t, err)
	r, err := findRelease(root)
	require.NoError(t, err)
	src := t.TempDir()
	require.NoError(t, extractTree(root, r.Commit, src))
	test, err := os.ReadFile(filepath.Join(root, "pkg", "limiter", "golden_state_test.go"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(src, "pkg", "limiter", "golden_state_test.go"), test, 0o644))
	out := filepath.Join(root, "pkg", "limiter", "testdata", "redis-states", "v"+r.Version)
	goBin, err := exec.LookPath("go")
	require.NoError(t, err)
	cmd := exec.Command(goBin, "test", "-count=1", "-run", "^TestRedisStatesOfReleases$", "./pkg/limiter", "-update-golden", "-golden-out", out)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOWORK=off", "GOFLAGS=-mod=readonly")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	t.Logf("release %s (%s): states written to %s\n%s", r.Version, r.Commit, out, b)
}
