// Package peerbench sets the edge beside nginx (and HAProxy) on loopback,
// all in front of one origin process, and measures what a streaming proxy
// promises and what a request costs:
//
//  1. Stream: time to the first body byte (p50, p99) of a 4 MiB object
//     from the origin directly, through the edge and through nginx, and the
//     CPU each proxy (and the origin) spends per GiB proxied for 1 KiB,
//     64 KiB and 4 MiB objects, in sets that alternate the edge and nginx.
//  2. SlowReaders: the edge's resident memory per open stream while many
//     clients read a 1 GiB object at a fixed slow rate.
//  3. BigObject: a 10 GiB object through the edge, hashed by the origin as
//     it writes it and by the client as it reads it.
//  4. Requests: what a small request costs the edge, nginx and HAProxy,
//     scenario by scenario (proxied, access log, a rule, a flood answered
//     429, the edge's shedding, TLS, HTTP/2 over TLS), in front of a
//     fasthttp origin: CPU per request, requests/s under wrk (h2load for
//     HTTP/2), p99 at half the peak. The peers' configurations are the
//     templates in peers/.
//  5. Tenants: one tenant (a.example) beside another (b.example) behind the
//     edge at its defaults and behind nginx: a.example's origin slow under
//     1,200 clients, then a.example flooded; b.example's goodput and p99
//     alone and beside it, a.example's answers and 503s, its critical
//     requests. a.example's clients run in processes of their own
//     (ServeOriginIfAsked drives them), as clients on other machines would.
//
// The origin is this program itself, re-executed (ServeOriginIfAsked): a
// separate process, so the CPU and memory read from /proc are the proxy's
// alone. Objects are the bytes of a seeded PRNG, generated, never stored.
// scripts/peerbench is the command; the Makefile's bench-stream-peers,
// bench-slow-readers, bench-big-object, bench-peers and bench-tenants run it.
package peerbench
