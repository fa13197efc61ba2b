// Package mixedversion tests a fleet that runs two versions at once: edges
// built from the previous release (the commit CHANGELOG.md's newest release
// section was cut from) and edges built from this tree, serving one Redis
// Cluster and one Consul. It holds tests only (docs/compatibility.md, "Mixed versions"):
//
//  1. the release is found in CHANGELOG.md and built from its commit with
//     the Go toolchain running the tests, once per commit (the binary is
//     cached under the user's cache directory);
//  2. this tree's edge is built;
//  3. a Redis Cluster and a Consul agent start, and one rules document with
//     an exact and a leased limit is pushed to the region;
//  4. the tests start edges of both versions and count what they admit.
package mixedversion
