//go:build race

package rules

// randomDocs is how many random documents the scanner's and Marshal's
// differential tests check: the race detector makes them about ten times
// slower, and `make test` runs with it.
const randomDocs = 400
