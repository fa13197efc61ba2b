package mixedversion

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPreviousRelease(t *testing.T) {
	const sha = "ab1d9e99291ad0350b2c66ceb9e68aa82c470893"
	for _, tc := range []struct {
		name, changelog string
		want            release
		err             string
	}{
		{name: "unreleased first, the phrase wrapped", changelog: "# Changelog\n\n## Unreleased\n\n- cut from commit 1111111111111111111111111111111111111111 (not a release)\n\n## 0.2.0 — 2027-01-01\n\nThe release, cut from\ncommit " + sha + " (tag `v0.2.0`).\n\n## 0.1.0\n\ncut from commit 2222222222222222222222222222222222222222\n",
			want: release{Version: "0.2.0", Commit: sha}},
		{name: "the newest release only", changelog: "## 0.3.1\n\nNothing cut.\n\n## 0.3.0\n\ncut from commit " + sha + "\n",
			err: "section 0.3.1 does not say"},
		{name: "no release", changelog: "# Changelog\n\n## Unreleased\n\n- a change\n", err: "no release section"},
		{name: "a heading that is no version", changelog: "## 1.0\n\ncut from commit " + sha + "\n", err: "no release section"},
		{name: "short sha", changelog: "## 1.0.0\n\ncut from commit ab1d9e9.\n", err: `names commit "ab1d9e9", want its 40 hex digits`},
		{name: "sha too long", changelog: "## 1.0.0\n\ncut from commit " + sha + "ff\n", err: "want its 40 hex digits"},
		{name: "empty", changelog: "", err: "no release section"},
		{name: "binary garbage", changelog: "\x00\xff## \x00\n## 9.9.9\xff\n", err: "no release section"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := previousRelease([]byte(tc.changelog))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestFindReleaseNeedsTheCommit: a CHANGELOG naming a commit the
// repository does not hold is an error that says so, not a skip.
func TestFindReleaseNeedsTheCommit(t *testing.T) {
	root, err := repoRoot()
	require.NoError(t, err)
	r, err := findRelease(root)
	require.NoError(t, err, "this repository's own CHANGELOG.md names a commit it holds")
	require.Regexp(t, `^\d+\.\d+\.\d+$`, r.Version)

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "CHANGELOG.md"),
		[]byte("## 0.0.1\n\ncut from commit 0123456789abcdef0123456789abcdef01234567\n"), 0o600))
	// A repository without that commit.
	out, err := exec.Command("git", "init", "-q", dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, err = findRelease(dir)
	require.ErrorContains(t, err, "commit 0123456789abcdef0123456789abcdef01234567 is not in this repository")
}
