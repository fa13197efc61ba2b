// Package listen is the edge's listeners, what happens to a connection
// before a request reaches the pipeline: the per-client connection cap
// (conns.go), the PROXY protocol from trusted balancers (proxyproto.go),
// TLS termination with certificates by SNI, session-ticket keys and ACME
// names (tls.go, certs.go, tickets.go, acme.go), the strict reader of the
// HTTP/1 framing (framing.go), and HTTP/2 with its frame meter and stream
// budget (h2.go, h2_frames.go, h2_streams.go). The HTTP/2 server runs each
// stream through the handler it is given: the edge's pipeline.
package listen
