// Package edgeguard is the k6 extension k6/x/edgeguard: what a load test of
// an edgeguard deployment needs beyond counting status codes.
//
//  1. parseRateLimit(res): the IETF RateLimit-Policy / RateLimit items and
//     Retry-After of a response; malformed fields are counted in the
//     edgeguard_ratelimit_malformed metric.
//  2. population(opts): a deterministic client population (IPv4, IPv6 in
//     distinct /64s, API keys; uniform or Zipf) shared by every VU.
//  3. checker(opts): the accuracy checker, fed every response, reading each
//     policy's algorithm, limit, window and scope from the rules document;
//     it reports over-admission, false denials and broken retry promises as
//     the metrics edgeguard_over_admissions, edgeguard_false_denials and
//     edgeguard_broken_retry_promises (edgeguard_leased_false_denials and
//     edgeguard_leased_broken_retry_promises for leased and global rules,
//     whose design allows a few; see package accuracy).
//  4. scrape / serverDelta: the edges' admin /metrics before and after, so
//     the summary carries the server-side figures (fallback decisions,
//     script calls per request, shedding by tier).
//  5. resolve(dns, name): DNS through a region's Consul DNS server.
//  6. observe / quantile / slope: small shared series for soak checks.
//
// State shared by VUs (populations, checkers, snapshots, series, the DNS
// cache) lives in the RootModule behind a lock; each VU gets its own
// ModuleInstance holding its picker and metric handles.
package edgeguard
