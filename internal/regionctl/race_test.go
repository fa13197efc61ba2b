//go:build race

package regionctl

// largeRules is the size of the documents the large-document tests push.
// The race detector makes YAML parsing about ten times slower, and a push
// and an edge reload each parse the document a few times; with -race (as
// `make test` runs) the tests push 4,000 rules, still stored in two
// parts, and without it 100,000.
const largeRules = 4_000

// largeHosts is the host count of the large host table test, for the same
// reason: 10,000 hosts with -race, still over region.InlineMax, and 20,000
// without.
const largeHosts = 10_000
