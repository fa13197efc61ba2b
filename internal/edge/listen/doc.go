// Package listen is the edge's listeners, what happens to a connection
// before a request reaches the pipeline: the per-client connection cap
// (conns.go; HTTP/2 streams beyond a connection's first count too), the
// PROXY protocol from trusted balancers only (proxyproto.go), TLS
// termination with certificates by SNI reloaded from files, session-ticket
// keys and ACME names (tls.go, certs.go, tickets.go, acme.go), the strict
// reader of the HTTP/1 framing (framing.go: CRLF lines, one
// Content-Length, Transfer-Encoding exactly chunked), and HTTP/2 with its
// frame meter and stream budget (h2.go, h2_frames.go, h2_streams.go). The
// public server bounds the header size and times reads, writes and idle
// connections; what fasthttp refuses before the handler runs is counted
// and logged like the pipeline's refusals. The handler runs once the
// header and at most 8 KiB of body are in: bodies are streamed, never
// buffered whole. The HTTP/2 server runs each stream through the handler
// it is given: the edge's pipeline.
package listen
