//go:build !race

package rules

// randomDocs: see race_test.go.
const randomDocs = 3000
