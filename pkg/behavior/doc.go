// Package behaviour is the behaviour layer's model: the policy that decides
// how strict to be with each client from its short-term behaviour, while
// the limiter keeps enforcing the limits.
//
//  1. A client is an Identity: the API key a rule counts by, else its
//     address, hashed with the region's key salt.
//  2. Each request updates the client's signals over a sliding horizon
//     (State.Observe): burst (volume against what its limits admit), replay
//     (runs of identical requests), scan (distinct routes, a HyperLogLog in
//     Redis) and denial loop (requests sent before a 429's Retry-After).
//  3. The weighted signals are a score (Params.Score), and the score a risk
//     level, normal → elevated → suspicious → blocked, with hysteresis and a
//     cool-down before stepping down (Params.Step).
//  4. Settings, the rules document's behaviour section, say what each level
//     does (Policy) and whether the layer is off, in shadow or enforcing.
//
// The package does no I/O: lua/behaviour.lua keeps the same State
// region-wide in Redis (ScriptArgs, Keys, ParseReply; the tests hold the two
// together), and Tracker is an edge's bounded view of its clients.
package behavior
