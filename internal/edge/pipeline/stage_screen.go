package pipeline

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/trust"
	"github.com/edgeguard/edgeguard/internal/problem"
	"github.com/edgeguard/edgeguard/internal/reqhead"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// screenStage is the first look at a request (step 2, Screen): who sent
// it (the peer, and whether it is a trusted proxy: internal/edge/trust), the request's
// span when tracing, and what the edge never passes on. From here on the
// rules, the shedder and the origin see one and the same request.
func (e *Pipeline) screenStage(sc *scratch) string {
	ctx := sc.ctx
	sc.peer = trust.Peer(ctx.RemoteIP())
	sc.trusted = e.trusted.Contains(sc.peer)
	if e.tracing != nil {
		sc.trace, sc.span = e.tracing.begin(ctx, sc.trusted)
	}
	if sc.refusal = e.screen(ctx, sc.trusted); sc.refusal != "" {
		// The access log names the client the trust model decides, as
		// identify would have.
		sc.client = e.clientOf(sc)
		return outcomeRefused
	}
	return e.next(sc)
}

// allowHeader is the Allow field of a 405: what the edge passes on.
const allowHeader = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

var (
	http10 = []byte("HTTP/1.0")
	http11 = []byte("HTTP/1.1")
)

// screen refuses what the edge must not pass on, before shedding or
// counting: HTTP versions other than 1.0 and 1.1 (505), refused methods
// (405), declared bodies above --max-body-bytes (413) and a request with no
// usable Host (400, or --default-host when set: an HTTP/1.0 request may
// omit it, and host rules must not be skipped by leaving it out). It makes
// an absolute-form request-target's authority the request's Host (RFC 9112
// §3.2.2), so the rules match and the origin receives one and the same
// host, and drops the fields this peer may not send (internal/edge/trust). It reports
// why it refused the request ("" when it may go on: refusal.go's reasons).
func (e *Pipeline) screen(ctx *fasthttp.RequestCtx, trusted bool) string {
	if proto := ctx.Request.Header.Protocol(); !bytes.Equal(proto, http11) && !bytes.Equal(proto, http10) {
		problem.Refuse(ctx, fasthttp.StatusHTTPVersionNotSupported, "only HTTP/1.0 and HTTP/1.1 are served")
		return reasonVersion
	}
	if m := e.cfg.RefusedMethod(ctx); m != "" && !e.allowMethods[m] {
		problem.Refuse(ctx, fasthttp.StatusMethodNotAllowed, "method "+m+" is not allowed")
		ctx.Response.Header.Set(fasthttp.HeaderAllow, allowHeader)
		return reasonMethod
	}
	if n := ctx.Request.Header.ContentLength(); n > 0 {
		if limit := e.bodyLimit(ctx); limit > 0 && n > limit {
			problem.TooLarge(ctx, limit)
			return reasonBodyTooLarge
		}
	}
	if why := reqhead.SettleHost(&ctx.Request, e.cfg.DefaultHost, e.cfg.UsableHost); why != "" {
		problem.Refuse(ctx, fasthttp.StatusBadRequest, why)
		return reasonHost
	}
	// A connection serves the names its certificate covers: an HTTP/2
	// client may reuse it for any of them (RFC 9113 §9.1.1), never for a
	// name it would not have trusted this certificate for.
	if e.cfg.TLSCheckHost && !e.conns.CertCovers(ctx.Conn(), rules.NormalizeHost(b2s(ctx.Request.Header.Host()))) {
		problem.Refuse(ctx, fasthttp.StatusMisdirectedRequest, "the certificate of this connection does not cover the request's Host: connect again with it as the server name")
		return reasonMisdirected
	}
	var tier [2]string
	tier[0], tier[1] = e.shed.Classifier().TrustedHeaders()
	e.headerScreen.Apply(&ctx.Request.Header, trusted, tier)
	return ""
}

// bodyLimit is the largest request body the host's origin pool takes (0:
// no limit): --max-body-bytes unless the host table sets the pool's own.
// Only a request declaring a body asks, before its Host is settled: the
// host is the one the request will go to (reqhead.TargetHost), not a Host
// field an absolute-form target overrides.
func (e *Pipeline) bodyLimit(ctx *fasthttp.RequestCtx) int {
	pool, _, _ := e.route(rules.NormalizeHost(reqhead.TargetHost(&ctx.Request, e.cfg.DefaultHost)))
	return pool.MaxRequestBodySize()
}
