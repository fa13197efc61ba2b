//go:build race

package regionctl

// largeRules is the size of the documents the large-document tests push.
// The race detector makes YAML parsing about ten times slower, and a push
// and an edge reload each parse the document a few times; with -race (as
// `make test` runs) the tests push 4,000 rules, still stored in two
// parts, and without it 100,000.
const largeRules = 4_000
