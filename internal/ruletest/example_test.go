package ruletest_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/ruletest"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// TestExample runs examples/rules.test.yaml against examples/rules.yaml, so
// the example cannot rot: a change to the rules, or to how the edge reads
// requests, that breaks what the example says fails here.
func TestExample(t *testing.T) {
	path := filepath.Join("..", "..", "examples", "rules.test.yaml")
	f := parseFile(t, path)
	doc := loadRules(t, filepath.Join(filepath.Dir(path), f.Rules))
	results, err := ruletest.Run(f, doc)
	require.NoError(t, err)
	require.Len(t, results, len(f.Tests))
	for _, r := range results {
		require.True(t, r.Pass, "%s: %v", r.Name, r.Diffs)
	}
	warnings, err := ruletest.Lint(doc)
	require.NoError(t, err)
	require.Empty(t, warnings)
}

func parseFile(t *testing.T, path string) *ruletest.File {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	f, err := ruletest.Parse(data)
	require.NoError(t, err)
	return f
}

func loadRules(t *testing.T, path string) *rules.Document {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	doc, err := rules.Parse(data)
	require.NoError(t, err)
	return doc
}
