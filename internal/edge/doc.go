// Package edge is the edge node's wiring: it builds each part from the
// settings (package config) and hands it the others it needs. Package
// listen accepts connections (TCP, TLS by SNI, the PROXY protocol, the
// per-client cap, the strict HTTP/1 framing reader, HTTP/2); HTTP/1.x
// requests and HTTP/2 streams enter the same pipeline (package pipeline:
// screen, identify, shed, match, checks, penalty, behaviour, limit,
// proxy; record wraps them). Package lifecycle serves, reloads on
// signals, drains and shuts down; admin serves metrics, readiness and
// debug on its own address, never on the public port. The rest, each in
// its own package: the rate limit store and shedder built from the
// settings (build), the behaviour layer (bhlayer), Envoy's rate limit
// service (rlslink), global rules' home regions (globalhome), the rules in
// force (liverules), the host table and origin pools (hostroute), the
// Consul link (consullink) and the sockets handed to the next binary
// (handoff). The wiring meets each part through the part's own small
// types: the Consul link is built first, and the parts that read a
// document of their own take it as a consullink.Doc (their Consul
// interface); the link takes the parts as the interfaces of
// consullink.Parts. layout_test.go holds them to that shape: none imports more
// than two of its siblings or the wiring, no struct has more than 25
// fields, and the wiring's lines of code may only come down.
package edge
