//go:build race

package edge

// overrideKeys is how many overrides TestEscapes's override rule carries:
// the race detector makes parsing and compiling a document ten times
// slower, and `make test` runs with it (pkg/rules compiles 100,000 under
// it too, without an edge around).
const overrideKeys = 10_000
