package pipeline

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/internal/problem"
)

// proxyStage sends the request to the origin (step 10, Proxy), its body
// streamed, and adds the RateLimit fields to the origin's response; a rule
// that counts by the response counts it once the response is ready
// (response.go). It is the last stage: it never calls next.
//
// Serve returns with the origin's response header (and a body of up to
// 64 KiB); a larger body streams after the handler returns. So upstream is
// the time to the response header, the RateLimit fields and the edge's
// own headers go out ahead of the body, a response-counted rule counts by
// the status and headers, and the worker slot, an adaptive origin slot
// and a concurrency rule's slot are all given back when the header is in,
// not when the body has gone: a stream that lasts hours holds none of
// them (the write and read-idle timeouts bound it instead).
func (e *Pipeline) proxyStage(sc *scratch) string {
	ctx := sc.ctx
	// The peer and the request id are views of the scratch's buffers:
	// what keeps them past the request (a tunnel, a streamed body, a test's
	// seen) keeps a copy.
	hop := origin.Hop{Peer: b2s(sc.peer.AppendTo(sc.peerBuf[:0])), Trusted: sc.trusted, RequestID: e.requestID(ctx, sc.trusted, &sc.idBuf), AtEnd: sc.atEnd}
	if sc.paths.ForwardNormalized {
		hop.Path = sc.path
	}
	if e.seen != nil {
		e.seen(ctx, &sc.req, strings.Clone(hop.RequestID))
	}
	sc.id = hop.RequestID
	octx, ospan := e.tracing.child(sc.trace, "origin.request")
	e.tracing.inject(octx, &ctx.Request.Header)
	upstream := time.Now()
	pool := sc.pool
	if e.tunnels.Wants(ctx) {
		// An upgrade (tunnel.go): a tunnel holds a concurrency slot to
		// its close, and writes a line of its own then.
		hop.Peer, hop.RequestID = strings.Clone(hop.Peer), strings.Clone(hop.RequestID)
		opened := e.tunnels.Serve(ctx, pool, hop, e.tunnelClosed(ctx, sc, hop.RequestID))
		sc.endHandedOn = sc.atEnd != nil && opened
	} else {
		pool.Serve(ctx, hop)
		// A streamed body calls AtEnd when it ends; anything else is
		// given back when the limit stage returns.
		sc.endHandedOn = sc.atEnd != nil && ctx.Response.IsBodyStream()
	}
	sc.upstream = time.Since(upstream)
	if hasField(&ctx.Response.Header, problem.NotProcessed) {
		ctx.Response.Header.Del(problem.NotProcessed) // the edge's word, never the origin's
	}
	ospan.End()
	setRateLimitFields(&ctx.Response.Header, sc.applied, e.cfg.LegacyHeaders)
	if len(sc.after) > 0 {
		e.countResponse(ctx, sc) // after the response is ready; never holds it back
	}
	return outcomeProxied
}

// requestID keeps a trusted proxy's well-formed X-Request-ID, or makes one
// in buf: the id is then a view of buf, good while buf is not written again.
func (e *Pipeline) requestID(ctx *fasthttp.RequestCtx, trusted bool, buf *[32]byte) string {
	if trusted {
		if id := ctx.Request.Header.Peek("X-Request-ID"); validRequestID(id) {
			return string(id)
		}
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	hex.Encode(buf[:], b[:])
	return b2s(buf[:])
}

// hasField reports whether h holds name, in any case, from one look over
// its names. Asking for a field by name (Del, Peek) copies and normalizes
// the name and scans every field, on every request, though the field is
// nearly never there.
func hasField(h *fasthttp.ResponseHeader, name string) bool {
	for k := range h.All() {
		if len(k) == len(name) && bytes.EqualFold(k, []byte(name)) {
			return true
		}
	}
	return false
}

func validRequestID(id []byte) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}
