package edge

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The edge's packages keep the shape they were split into: each concern a
// package of its own under internal/edge, and this package the one place
// that wires them.
const (
	edgeImport = "github.com/edgeguard/edgeguard/internal/edge"
	// maxSiblings is how many of its siblings a package under
	// internal/edge may import: more, and it is wiring of its own.
	maxSiblings = 2
	// maxFields is the most fields a struct type may have.
	maxFields = 25
	// maxWiring is the most lines of code (not blank, not comment) the
	// wiring's files may hold. It was 473 at the split, 383 once the
	// moves were done, and is 257 since the parts meet the Consul link,
	// the lifecycle and the admin server through their own types; it may
	// only come down.
	maxWiring = 257
)

// edgePackages are the packages under internal/edge (the end-to-end
// tests, a package of tests alone, aside) as go build sees them, by name.
func edgePackages(t *testing.T) map[string]*build.Package {
	t.Helper()
	dirs, err := os.ReadDir(".")
	require.NoError(t, err)
	pkgs := map[string]*build.Package{}
	for _, d := range dirs {
		if !d.IsDir() || d.Name() == "testdata" || d.Name() == "e2e" {
			continue
		}
		p, err := build.ImportDir(d.Name(), 0)
		require.NoError(t, err, d.Name())
		pkgs[d.Name()] = p
	}
	require.NotEmpty(t, pkgs)
	return pkgs
}

// siblingsOf are the packages under internal/edge that p imports (its
// non-test files).
func siblingsOf(p *build.Package) []string {
	var s []string
	for _, imp := range p.Imports {
		if rest, ok := strings.CutPrefix(imp, edgeImport+"/"); ok {
			s = append(s, rest)
		}
	}
	sort.Strings(s)
	return s
}

// TestPackagesImportFewSiblings: no package under internal/edge imports
// more than two of its siblings, and none imports the wiring.
func TestPackagesImportFewSiblings(t *testing.T) {
	for name, p := range edgePackages(t) {
		require.NotContains(t, p.Imports, edgeImport, "%s imports the wiring", name)
		s := siblingsOf(p)
		require.LessOrEqual(t, len(s), maxSiblings, "%s imports %d of its siblings (%s): at most %d; only internal/edge wires", name, len(s), strings.Join(s, ", "), maxSiblings)
	}
}

// TestStructsHaveFewFields: no struct type in internal/edge or under it
// has more than 25 fields (an embedded one counts once).
func TestStructsHaveFewFields(t *testing.T) {
	dirs := []string{"."}
	for name := range edgePackages(t) {
		dirs = append(dirs, name)
	}
	checked := 0
	for _, dir := range dirs {
		p, err := build.ImportDir(dir, 0)
		require.NoError(t, err, dir)
		for _, f := range p.GoFiles {
			path := filepath.Join(dir, f)
			file, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			require.NoError(t, err, path)
			ast.Inspect(file, func(n ast.Node) bool {
				ts, ok := n.(*ast.TypeSpec)
				if !ok {
					return true
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					return true
				}
				fields := 0
				for _, f := range st.Fields.List {
					fields += max(len(f.Names), 1)
				}
				checked++
				require.LessOrEqual(t, fields, maxFields, "%s: type %s has %d fields", path, ts.Name.Name, fields)
				return true
			})
		}
	}
	require.Positive(t, checked)
}

// TestWiringStaysSmall: the wiring's files (this package's non-test files)
// hold at most maxWiring lines of code.
func TestWiringStaysSmall(t *testing.T) {
	p, err := build.ImportDir(".", 0)
	require.NoError(t, err)
	code := 0
	for _, f := range p.GoFiles {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, line := range strings.Split(string(data), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "//") {
				code++
			}
		}
	}
	t.Logf("the wiring: %d lines of code in %s", code, strings.Join(p.GoFiles, ", "))
	require.LessOrEqual(t, code, maxWiring, "the wiring (%s) grew: move what is not wiring into the part's package", strings.Join(p.GoFiles, ", "))
}
