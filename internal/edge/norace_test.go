//go:build !race

package edge

// overrideKeys: see race_test.go.
const overrideKeys = 100_000
