package pipeline

import (
	"bytes"
	"net/netip"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/trust"
	"github.com/edgeguard/edgeguard/internal/problem"
	"github.com/edgeguard/edgeguard/internal/reqhead"
	"github.com/edgeguard/edgeguard/pkg/pathsem"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// identifyStage says who is asking, for what, and how much it matters
// (step 3, Identify): the host's origin pool and path policy (the host
// table), the path as the host's origin reads it (package pathsem; a path
// origins read differently refused where the policy says so), the client
// address (from X-Forwarded-For only through a trusted proxy:
// internal/edge/trust), with a behaviour section in the rules the client's
// identity and level (package bhlayer), and the request's priority tier
// for the shedder (a client whose level says so is put in the lowest).
func (e *Pipeline) identifyStage(sc *scratch) string {
	ctx := sc.ctx
	sc.headers = reqhead.New(&ctx.Request.Header, ctx.QueryArgs())
	sc.host = rules.NormalizeHost(b2s(ctx.Request.Header.Host())) // settled by screen
	sc.pool, sc.paths, sc.tenant = e.route(sc.host)
	var ambiguous bool
	sc.path, ambiguous = pathsem.Normalize(b2s(ctx.Request.URI().PathOriginal()), sc.paths.Semantics)
	// fasthttp cuts a fragment off the path (it never reaches the origin);
	// a raw '#' in the request line is still one origins read differently.
	ambiguous = ambiguous || bytes.IndexByte(ctx.Request.Header.RequestURI(), '#') >= 0
	sc.client = e.clientOf(sc)
	if ambiguous && sc.paths.RefuseAmbiguous {
		problem.Refuse(ctx, fasthttp.StatusBadRequest, "the request path is ambiguous: origins of different kinds read it differently (a ';' parameter, '\\', an encoded '/' or '\\', a malformed or double escape, a segment ending in '.' or ' ', a '..' above the root, a '#'); this host refuses such paths")
		sc.refusal = reasonAmbiguousPath
		return outcomeRefused
	}
	sc.bh = e.bh.Begin(sc.client, sc.trusted, sc.header, sc.query, sc.path, ctx.Conn())
	sc.tier = e.bh.Tier(&sc.bh, e.shed.Classify(b2s(ctx.Method()), sc.path, sc.header, sc.trusted))
	return e.next(sc)
}

// clientOf is the client as the trust model names it (trust.Client): the
// peer, or behind a trusted proxy the address its X-Forwarded-For gives.
// An untrusted peer's field would be ignored, so it is not looked up: the
// lookup copies and normalizes the field's name, on every request of a
// flood from the internet.
func (e *Pipeline) clientOf(sc *scratch) netip.Addr {
	if !sc.trusted { // sc.trusted is e.trusted.Contains(sc.peer)
		return sc.peer
	}
	return trust.Client(sc.peer, sc.ctx.Request.Header.PeekAll("X-Forwarded-For"), e.trusted)
}
