//go:build !race

package regionctl

// largeRules: see race_test.go.
const largeRules = 100_000

// largeHosts: see race_test.go.
const largeHosts = 20_000
