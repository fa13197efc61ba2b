//go:build !race

package regionctl

// largeRules: see race_test.go.
const largeRules = 100_000
