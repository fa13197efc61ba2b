package mixedversion

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// release is the release a fleet is upgraded from.
type release struct {
	Version string // X.Y.Z, as its CHANGELOG.md heading says
	Commit  string // the 40 hex digits of the commit it was cut from
}

var (
	releaseHeading = regexp.MustCompile(`^## (\d+\.\d+\.\d+)(\s|$)`)
	cutFrom        = regexp.MustCompile(`cut from commit ([0-9a-f]+)`)
	fullSHA        = regexp.MustCompile(`^[0-9a-f]{40}$`)
)

// previousRelease reads the newest release section of a CHANGELOG (the
// first "## X.Y.Z" heading; "## Unreleased" is the current tree) and the
// commit its text says it was cut from.
func previousRelease(changelog []byte) (release, error) {
	var r release
	var section strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(changelog))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			if r.Version != "" {
				break // the next section
			}
			if m := releaseHeading.FindStringSubmatch(line); m != nil {
				r.Version = m[1]
			}
			continue
		}
		if r.Version != "" {
			section.WriteString(line)
			section.WriteByte(' ') // a phrase may wrap
		}
	}
	if err := sc.Err(); err != nil {
		return r, err
	}
	if r.Version == "" {
		return r, errors.New(`no release section ("## X.Y.Z") in CHANGELOG.md`)
	}
	m := cutFrom.FindStringSubmatch(section.String())
	if m == nil {
		return r, fmt.Errorf(`CHANGELOG.md: section %s does not say "cut from commit <sha>"`, r.Version)
	}
	if !fullSHA.MatchString(m[1]) {
		return r, fmt.Errorf("CHANGELOG.md: section %s names commit %q, want its 40 hex digits", r.Version, m[1])
	}
	r.Commit = m[1]
	return r, nil
}

// repoRoot is the top of the git work tree the tests run in.
func repoRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("the mixed-version tests build the previous release from this repository's history, and this is no git work tree (run them in a clone): %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// findRelease reads root's CHANGELOG.md and checks that its release
// commit is in root's history.
func findRelease(root string) (release, error) {
	data, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return release{}, err
	}
	r, err := previousRelease(data)
	if err != nil {
		return r, err
	}
	cmd := exec.Command("git", "cat-file", "-e", r.Commit+"^{commit}")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return r, fmt.Errorf("release %s: commit %s is not in this repository (a shallow clone? git fetch --unshallow): %w %s", r.Version, r.Commit, err, bytes.TrimSpace(out))
	}
	return r, nil
}

// extractTree writes commit's tree into dir (git archive), as a clone of
// the release would hold it.
func extractTree(root, commit, dir string) error {
	tarball := dir + ".tar"
	defer os.Remove(tarball)
	for _, c := range []*exec.Cmd{
		exec.Command("git", "-C", root, "archive", "--format=tar", "-o", tarball, commit),
		exec.Command("tar", "-xf", tarball, "-C", dir),
	} {
		if out, err := c.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w\n%s", strings.Join(c.Args, " "), err, out)
		}
	}
	return nil
}

// releaseEdge returns the release's cmd/edge, built from its commit on the
// first call and kept under the user's cache directory by commit, so later
// runs start at once. built is how long the build took (0: cached).
func releaseEdge(root string, r release) (bin string, built time.Duration, err error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", 0, fmt.Errorf("no cache directory for the release's build: %w", err)
	}
	dir := filepath.Join(cache, "edgeguard", "release-"+r.Commit)
	bin = filepath.Join(dir, "edge")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o100 != 0 {
		return bin, 0, nil
	}
	start := time.Now()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", 0, err
	}
	// Built aside and renamed into place: a run stopped halfway, or two at
	// once, never leave half a binary under the name.
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", 0, err
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return "", 0, err
	}
	if err := extractTree(root, r.Commit, src); err != nil {
		return "", 0, fmt.Errorf("extracting release %s (%s): %w", r.Version, r.Commit, err)
	}
	// The same toolchain even where the release's go.mod would ask for
	// another, and its own go.mod and go.sum, as its clone builds.
	if err := testenv.GoBuild(src, "./cmd/edge", filepath.Join(tmp, "edge"), "GOTOOLCHAIN=local", "GOWORK=off", "GOFLAGS=-mod=readonly"); err != nil {
		return "", 0, fmt.Errorf("building release %s (%s): %w", r.Version, r.Commit, err)
	}
	if err := os.Rename(filepath.Join(tmp, "edge"), bin); err != nil {
		return "", 0, err
	}
	return bin, time.Since(start), nil
}
