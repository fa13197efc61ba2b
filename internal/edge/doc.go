// Package edge is the edge node: a fasthttp server that runs every request
// through one pipeline of stages (package pipeline: its doc has steps 2 to
// 11, each stage in the file named after it). The edge builds the parts
// the pipeline sends requests through and opens the listeners; package
// lifecycle serves, reloads on signals, drains and shuts down. HTTP/1.x
// requests (fasthttp) and HTTP/2 streams (listen's HTTP/2 server) enter the
// same pipeline.
//
//  1. Accept (package listen): plain HTTP on --listen, TLS on --listen-tls
//     (certificates by SNI, reloaded from files: listen/certs.go,
//     pkg/certstore); a PROXY header only from --proxy-protocol-from
//     balancers (listen/proxyproto.go); at most --max-conns-per-ip connections per
//     client address (listen/conns.go; HTTP/2 streams beyond a connection's
//     first count too, and what they hold waiting on their client is
//     bounded: listen/h2_streams.go);
//     bounded header size, read/write/idle timeouts; every HTTP/1.x byte
//     passes a strict reader of the request framing (listen/framing.go: CRLF
//     lines, one Content-Length, Transfer-Encoding exactly chunked), and
//     what fasthttp refuses before the handler runs is counted and logged
//     like the pipeline's refusals (pipeline/refusal.go). The handler runs once
//     the header and at most 8 KiB of body are in: bodies are streamed,
//     never buffered whole.
//  2. to 11. The pipeline (package pipeline): screen, identify, shed,
//     match, checks, penalty, behaviour, limit, proxy; record wraps them.
//
// The admin server (package admin: metrics, health, readiness, rules,
// pprof) listens on its own address; nothing admin is served on the public
// port. The settings (flags, file, environment, validation) are package
// config's; the problem+json answers package problem's; the behaviour
// layer (identity, level, signal updates) package bhlayer's; Envoy's rate
// limit service on --rls-listen package rlslink's; global rules' home
// regions package globalhome's; the rules in force package liverules';
// the host table and the origin pools package hostroute's; the Consul
// link, its registrations and caches package consullink's; the rate limit
// store, the load shedder and the request path's settings are built from
// the settings by package build.
package edge
