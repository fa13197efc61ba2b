// Package edge is the edge node: a fasthttp server that runs every request
// through one pass, in this order:
//
//  1. Accept: plain HTTP on --listen, TLS on --listen-tls (certificates by
//     SNI, reloaded from files: tls.go, pkg/certstore); a PROXY header only
//     from --proxy-protocol-from balancers (proxyproto.go); at most
//     --max-conns-per-ip connections per client address;
//     bounded header size, read/write/idle timeouts. The handler runs once
//     the header and at most 8 KiB of body are in: bodies are streamed,
//     never buffered whole.
//  2. Screen: HTTP/1.0 and 1.1 only (505), CONNECT and TRACE refused (405),
//     declared bodies over the limit refused (413); an absolute-form
//     target's authority becomes the Host. A header the next steps decide
//     on that appears twice is refused (400) when it is read.
//  3. Identify: the client address, from the socket or, only when the peer is
//     a trusted proxy, from X-Forwarded-For (right-most untrusted hop); with
//     a behaviour section in the rules, the client's identity and risk level
//     (behaviour.go).
//  4. Shed: the request is classified into a priority tier (a client whose
//     level says so is put in the lowest) and the worker-utilization shedder
//     may drop it (503); otherwise it takes a worker slot (waiting briefly in
//     a bounded queue, or 503).
//  5. Match: the current rules snapshot returns every rule that applies, each
//     with its hashed key (pure code, no I/O).
//  6. Limit: the client's level applies (opted-in rules' limits multiplied,
//     or a blocked client answered 429), then the limiter decides every rule
//     — over-limit cache, per-key coalescing, one round trip per Redis node
//     (the behaviour signal update riding in it), local fallback when Redis
//     fails. Denied → 429 with Retry-After, RateLimit fields and a
//     problem+json body.
//  7. Proxy: allowed traffic goes to the origin, its body streamed, with the
//     RateLimit fields added; concurrency slots are released when the
//     handler returns. A response given without reading the body, and
//     every response while draining, closes the connection.
//  8. Record: Prometheus metrics with bounded labels.
//
// The admin server (metrics, health, readiness, rules, pprof) listens on its
// own address; nothing admin is served on the public port.
package edge
