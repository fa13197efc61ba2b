// Package rules defines edgeguard's rate-limit rule documents: the YAML
// schema, strict parsing, validation, merging of global and regional
// documents, content versioning, and compilation into an immutable Snapshot
// whose Match method is the edge's hot path. Match finds its candidate rules
// through an index (index.go), so its cost does not grow with the number of
// rules, e.g. one per customer host; the plain scan it replaces stays as the
// reference the index is tested against.
//
// The package is pure: it performs no I/O, so the same code decides what a
// rule means on the edge, in the CLI and in tests. Loading documents (files,
// Consul KV) and talking to Redis belong to the callers.
package rules
