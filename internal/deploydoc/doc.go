// Package deploydoc holds the test that runs docs/deployment.md's "try it"
// recipe as a reader pastes it: the block under the "deploydoc:try-it"
// marker, whole, in bash.
package deploydoc
