// Package edge is the edge node: a fasthttp server that runs every request
// through one pass, in this order:
//
//  1. Accept: bounded header and body sizes, read/write/idle timeouts.
//  2. Shed: the request is classified into a priority tier and the
//     worker-utilization shedder may drop it (503); otherwise it takes a
//     worker slot (waiting briefly in a bounded queue, or 503).
//  3. Identify: the client address, from the socket or, only when the peer is
//     a trusted proxy, from X-Forwarded-For (right-most untrusted hop).
//  4. Match: the current rules snapshot returns every rule that applies, each
//     with its hashed key (pure code, no I/O).
//  5. Limit: the limiter decides all of them — over-limit cache, per-key
//     coalescing, one round trip per Redis node, local fallback when Redis
//     fails. Denied → 429 with Retry-After, RateLimit fields and a
//     problem+json body.
//  6. Proxy: allowed traffic goes to the origin with the RateLimit fields
//     added; concurrency slots are released when the handler returns.
//  7. Record: Prometheus metrics with bounded labels.
//
// The admin server (metrics, health, readiness, rules, pprof) listens on its
// own address; nothing admin is served on the public port.
package edge
