package edgeguard

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestK6CacheKey: the key build-k6.sh caches the k6 binary under changes
// with every file the build compiles (the extension's own, the edge
// module's packages it imports through the replace directive, both
// modules' go.mod and go.sum) and with nothing else. It runs on a copy of
// the repository, so the edits stay out of the tree under test.
func TestK6CacheKey(t *testing.T) {
	root := copyRepo(t)
	key := func(t *testing.T) string {
		t.Helper()
		cmd := exec.Command("bash", filepath.Join(root, "loadtest", "build-k6.sh"), "--key")
		cmd.Env = append(os.Environ(), "EDGEGUARD_CACHE="+t.TempDir())
		out, err := cmd.Output()
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		require.NoError(t, err, "%s", stderr)
		k := strings.TrimSpace(string(out))
		require.Regexp(t, `^k6-v[0-9.]+-[0-9a-f]{16}$`, k)
		return k
	}
	// edit appends to the files (restored when the subtest ends).
	edit := func(t *testing.T, files ...string) {
		t.Helper()
		for _, f := range files {
			path := filepath.Join(root, f)
			orig, err := os.ReadFile(path)
			require.NoError(t, err)
			extra := "\n// changed\n"
			if strings.HasSuffix(f, "go.sum") {
				extra = "\n" // go.sum has no comments; a blank line is skipped
			}
			require.NoError(t, os.WriteFile(path, append(append([]byte(nil), orig...), extra...), 0o644))
			t.Cleanup(func() { require.NoError(t, os.WriteFile(path, orig, 0o644)) })
		}
	}
	base := key(t)

	for _, tc := range []struct{ name, file string }{
		{"a package of the extension's module", "loadtest/internal/ratelimit/ratelimit.go"},
		{"a package of the edge's module imported through the replace directive", "pkg/limit/limit.go"},
	} {
		t.Run("changed by "+tc.name, func(t *testing.T) {
			edit(t, tc.file)
			require.NotEqual(t, base, key(t), "a change to %s must build a new k6", tc.file)
		})
	}
	t.Run("unchanged by what the build does not compile", func(t *testing.T) {
		edit(t, "pkg/limit/limit_test.go", "cmd/edge/main.go", "loadtest/module_test.go", "loadtest/scenarios/multi-region.js")
		require.Equal(t, base, key(t))
	})
}

// copyRepo copies the repository's files (not its .git, not load test
// results) into a temporary directory and returns its root.
func copyRepo(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs("..")
	require.NoError(t, err)
	dst := t.TempDir()
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel == ".git" || rel == filepath.Join("loadtest", "results") {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if rel == ".git" || !d.Type().IsRegular() { // a worktree's .git is a file
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, info.Mode().Perm())
	})
	require.NoError(t, err)
	return dst
}
