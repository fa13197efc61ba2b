// Package pipeline is the edge's request path: one pipeline of stages.
// The order is written once, in pipeline.go; each stage is a function in
// the file named after it, which either answers the request or passes it
// on to the next stage, and gives back what it holds (a worker slot, a
// concurrency slot) when the rest returns. HTTP/1.x requests (fasthttp)
// and HTTP/2 streams (listen's HTTP/2 server) enter the same pipeline
// (Handle). Step 1, Accept, is package listen's (package edge's doc); what
// fasthttp refuses before the handler runs is answered, counted and logged
// here too (ServerError, Expect: refusal.go).
//
//  2. Screen (stage_screen.go): the peer and whether it is a trusted proxy;
//     HTTP/1.0 and 1.1 only (505), CONNECT and TRACE refused (405),
//     declared bodies over the limit refused (413); an absolute-form
//     target's authority becomes the Host; fields this peer may not send
//     dropped.
//  3. Identify (stage_identify.go): the host's origin pool and path
//     policy (the host table); the path as that origin reads it (package
//     pathsem), which the shedder, the behaviour layer and the rules all
//     see; a path origins read differently refused (400) where the policy
//     says so; the client address, from the socket or,
//     only when the peer is a trusted proxy, from X-Forwarded-For
//     (right-most untrusted hop: package trust); with a behaviour section in
//     the rules, the client's identity and risk level (package bhlayer); the
//     request's priority tier (a client whose level says so is put in the
//     lowest).
//  4. Shed (stage_shed.go): the worker-utilization shedder may drop the
//     request (503); otherwise it takes a worker slot (waiting briefly in a
//     bounded queue, or 503) and, with the adaptive origin limit on, an
//     origin slot.
//  5. Match (stage_match.go): the current rules snapshot returns every rule
//     that applies, each with its hashed key (pure code, no I/O).
//  6. Checks (stage_checks.go): bypassed rules dropped, response-counted
//     rules set aside (response.go), each rule's limit (the key's override
//     or a trusted peer's limit header: escapes.go), enforced or shadow as
//     the region's switch says (enforcement.go).
//  7. Penalty (stage_penalty.go): a key serving a penalty, or blocked by a
//     response-counted rule, is denied (429) without being counted.
//  8. Behaviour (stage_behaviour.go): the client's level applies (opted-in
//     rules' limits multiplied, or a blocked client answered 429); its
//     signal update rides with the limit checks.
//  9. Limit (stage_limit.go): the limiter decides every check — over-limit
//     cache, per-key coalescing, one round trip per Redis node, local
//     fallback when Redis fails. A penalty rule's denial starts its penalty.
//     Denied → 429 with Retry-After, RateLimit fields and a problem+json
//     body.
//  10. Proxy (stage_proxy.go): allowed traffic goes to the origin, its body
//     streamed, with the RateLimit fields added; response-counted rules
//     count the response afterwards. An upgrade (WebSocket) the origin
//     accepts becomes a tunnel that outlives the handler (origin/tunnel.go;
//     its access-log line at close: tunnel.go).
//  11. Record (stage_record.go, first in the list because it wraps the
//     rest): Prometheus metrics with bounded labels, the access-log line
//     (access.go), the request's span (trace.go). A response given without
//     reading the body, and every response while draining, closes the
//     connection.
//
// A header or query parameter a stage decided on that was sent more than
// once is refused (400) before the next stage runs (pipeline.go's next).
package pipeline
