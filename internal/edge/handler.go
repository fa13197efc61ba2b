package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// scratch is a request's state and reusable buffers: what serve found out,
// for the metrics and the access log handle writes after it.
type scratch struct {
	matches  []rules.Match
	bypassed []*rules.CompiledRule // rules whose bypass named the request
	after    []rules.Match         // rules that count by the response (response.go)
	checks   []limiter.Check
	// afterChecks are after's checks, cost still the rule's.
	afterChecks []limiter.Check
	applied     []applied
	all         []applied     // every rule's outcome, shadow ones too (access log)
	tier        shedder.Tier  // TierNone until classified
	id          string        // the request id, once proxied
	upstream    time.Duration // time at the origin
	client      netip.Addr
	trace       context.Context // the request span's context; nil without tracing
	span        trace.Span
	// penalised: denied by a penalty (escapes.go), not counted.
	penalised bool
}

func (sc *scratch) reset() {
	clear(sc.matches)
	clear(sc.applied)
	clear(sc.all)
	clear(sc.bypassed)
	clear(sc.after)
	clear(sc.afterChecks)
	sc.after, sc.afterChecks = sc.after[:0], sc.afterChecks[:0]
	sc.matches, sc.checks, sc.applied, sc.all = sc.matches[:0], sc.checks[:0], sc.applied[:0], sc.all[:0]
	sc.bypassed, sc.penalised = sc.bypassed[:0], false
	sc.tier, sc.id, sc.upstream, sc.client = shedder.TierNone, "", 0, netip.Addr{}
	sc.trace, sc.span = nil, nil
}

var scratchPool = sync.Pool{New: func() any { return &scratch{tier: shedder.TierNone} }}

// b2s views bytes as a string for lookups that do not keep it.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// handle is the request path; see the package documentation for the steps.
func (e *Edge) handle(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	sc := scratchPool.Get().(*scratch)
	defer func() {
		sc.reset()
		scratchPool.Put(sc)
	}()
	outcome := e.serve(ctx, start, sc)
	if e.draining.Load() {
		// Keep-alive clients leave now, not when the listener closes.
		ctx.SetConnectionClose()
	}
	if outcome != outcomeProxied && hasUnreadBody(ctx) {
		// The rest of an unread body must not be taken for a request.
		ctx.SetConnectionClose()
	}
	total := time.Since(start)
	e.metrics.request(outcome, sc.tier).Inc()
	e.metrics.durationOf(outcome).Observe(total.Seconds())
	e.logAccess(ctx, start, total, outcome, sc)
	if sc.span != nil {
		e.endRequestSpan(sc.span, ctx, outcome, sc)
	}
}

func (e *Edge) serve(ctx *fasthttp.RequestCtx, start time.Time, sc *scratch) string {
	// Screen: what the edge never passes on, and what this peer may not send
	// (trust.go); from here on the rules, the shedder and the origin see one
	// and the same request.
	peer := peerAddr(ctx.RemoteIP())
	trusted := e.trusted.contains(peer)
	if e.tracing != nil {
		sc.trace, sc.span = e.tracing.begin(ctx, trusted)
	}
	if !e.screen(ctx, trusted) {
		return outcomeRefused
	}
	headers := headerLookup{h: &ctx.Request.Header, args: ctx.QueryArgs()}
	header := headers.get
	path := rules.NormalizePath(b2s(ctx.Request.URI().PathOriginal()))

	// Identify.
	client := clientAddr(peer, ctx.Request.Header.PeekAll("X-Forwarded-For"), e.trusted)
	sc.client = client
	bh := e.bh.begin(client, trusted, &headers, path, ctx.Conn()) // the client's behaviour level (behaviour.go)

	// Shed: before any I/O, by priority tier.
	tier := e.bh.tier(&bh, e.shed.Classify(b2s(ctx.Method()), path, header, trusted))
	sc.tier = tier
	if headers.repeated != "" {
		refuseRepeated(ctx, headers.repeated)
		return outcomeRefused
	}
	if !e.shed.Admit(start, tier) {
		unavailable(ctx, "the edge is shedding load; retry later", 1)
		return outcomeShed
	}
	// Not ctx: fasthttp's RequestCtx as a context costs a goroutine per
	// derived context and races with Shutdown; the queue timeout bounds
	// this, and a waiter whose client left gives up its place.
	_, wait := e.tracing.child(sc.trace, "shedder.wait")
	release, err := e.workers.AcquireUnless(context.Background(), tier, func() bool { return clientGone(ctx.Conn()) })
	wait.End()
	switch {
	case errors.Is(err, shedder.ErrGone):
		ctx.SetConnectionClose()
		unavailable(ctx, "the client left while waiting", 1)
		return outcomeAbandoned
	case err != nil:
		unavailable(ctx, "no worker free; retry later", 1)
		return outcomeNoWorker
	}
	defer release()
	// Adaptive origin limit (off unless the shedder settings enable it):
	// learned from the origin's latency, released when the exchange ends.
	// Taken before the limiter so a refusal costs no Redis call; the slot
	// is held through the decision, a millisecond against the origin's
	// tens.
	if !e.shed.AcquireOrigin(start, tier) {
		unavailable(ctx, "the origin is at its learned concurrency limit; retry later", 1)
		return outcomeShed
	}
	defer func() { e.shed.ReleaseOrigin(time.Now(), tier, sc.upstream, originAnswered(ctx, sc)) }()

	// Match.
	snap := e.rules.Load()
	req := rules.Request{
		Host:     rules.NormalizeHost(b2s(ctx.Request.Header.Host())), // the one the origin gets (screen)
		Method:   b2s(ctx.Method()),
		Path:     path,
		ClientIP: client,
		Header:   header,
		Query:    headers.query,
		JA4:      ja4Of(ctx.Conn()),
	}
	sc.matches = snap.Match(&req, sc.matches)
	if headers.repeated != "" {
		refuseRepeated(ctx, headers.repeated)
		return outcomeRefused
	}
	sc.matches, sc.bypassed = e.dropBypassed(sc.matches, sc.bypassed)
	sc.matches, sc.after = splitAfter(sc.matches, sc.after)

	// Limit.
	var verdict limiter.Verdict
	for _, m := range sc.after {
		sc.afterChecks = append(sc.afterChecks, e.check(m, trusted, header))
	}
	for _, m := range sc.matches {
		sc.checks = append(sc.checks, e.check(m, trusted, header))
	}
	if headers.repeated != "" { // a limit header sent twice
		refuseRepeated(ctx, headers.repeated)
		return outcomeRefused
	}
	if (len(sc.matches) > 0 || len(sc.after) > 0) && e.penalised(ctx, sc) {
		return outcomeDenied
	}
	if len(sc.matches) > 0 {
		lctx := context.Background()
		obs, early, block := e.bh.apply(ctx, &bh, sc.matches, sc.checks)
		if block {
			blocked(ctx, bh.cfg.params.Cooldown())
			return outcomeDenied
		}
		rider := e.bh.rider(&bh, obs)
		if rider != nil {
			lctx = limiter.WithRider(lctx, rider)
		}
		_, decide := e.tracing.child(sc.trace, "limiter.decide")
		verdict, err = e.limiter.Decide(lctx, sc.checks) // bounded by --redis-timeout
		decide.End()
		e.bh.done(&bh, obs, early, rider, verdict)
		switch {
		case errors.Is(err, limiter.ErrUnavailable):
			unavailable(ctx, "rate limiting is unavailable; retry later", 1)
			return outcomeUnavailable
		case err != nil:
			// A check the limiter refuses is a bug (rules are validated);
			// never a wall of errors for clients.
			e.metrics.limiterError.Inc()
			e.log.Error("limiter refused checks", "err", err)
			verdict = limiter.Verdict{Allowed: true}
		}
		if !verdict.Allowed {
			e.startPenalties(sc.matches, sc.checks, &verdict)
		}
		sc.applied, sc.all = e.record(sc.matches, sc.checks, verdict, sc.applied, sc.all, e.access != nil || sc.span != nil)
		if !verdict.Allowed {
			deny(ctx, sc.applied, e.cfg.LegacyHeaders)
			return outcomeDenied
		}
		defer e.limiter.ReleaseAsync(verdict) // never holds the response back
	}

	// Proxy.
	hop := origin.Hop{Peer: peer.String(), Trusted: trusted, RequestID: e.requestID(ctx, trusted)}
	if e.seen != nil {
		e.seen(ctx, &req, hop.RequestID)
	}
	sc.id = hop.RequestID
	octx, ospan := e.tracing.child(sc.trace, "origin.request")
	e.tracing.inject(octx, &ctx.Request.Header)
	upstream := time.Now()
	e.proxy.Serve(ctx, hop)
	sc.upstream = time.Since(upstream)
	ctx.Response.Header.Del(notProcessed) // the edge's word, never the origin's
	ospan.End()
	setRateLimitFields(&ctx.Response.Header, sc.applied, e.cfg.LegacyHeaders)
	if len(sc.after) > 0 {
		e.countResponse(ctx, sc) // after the response is ready; never holds it back
	}
	return outcomeProxied
}

// originAnswered says whether the exchange measured the origin's latency:
// it was proxied and did not fail for want of a connection (502, 503 from
// the proxy), which would read as a fast answer.
func originAnswered(ctx *fasthttp.RequestCtx, sc *scratch) bool {
	code := ctx.Response.StatusCode()
	return sc.upstream > 0 && code != fasthttp.StatusBadGateway && code != fasthttp.StatusServiceUnavailable
}

// check turns a matched rule into a limiter check, with the key's own
// limit if it has one (escapes.go), enforced or shadow as the rule and the
// region's switch say (enforcement.go).
func (e *Edge) check(m rules.Match, trusted bool, header func(string) (string, bool)) limiter.Check {
	r := m.Rule
	key, nodes := m.Key, e.nodesRegion.Load()
	if r.Scope == rules.ScopePoP {
		key, nodes = e.popKeyPrefix+key, e.nodesPoP.Load()
	}
	shadow := e.shadowed(r, m.Key)
	if shadow {
		e.metrics.enforce.shadow.Inc()
	} else {
		e.metrics.enforce.enforced.Inc()
	}
	return limiter.Check{Limit: e.limitOf(m, key, trusted, header), Cost: r.Cost, Shadow: shadow, Nodes: int(nodes), Tolerance: r.Tolerance, Global: r.Scope == rules.ScopeGlobal}
}

// ruleLimit is a compiled rule's limit on key: rules compile to the
// limiter's own algorithms, so nothing is parsed per request.
func ruleLimit(r *rules.CompiledRule, key string) limiter.Limit {
	return limiter.Limit{Key: key, Algorithm: r.Algorithm, Limit: r.Limit, Window: r.Window, Burst: r.Burst, MinInterval: r.MinInterval}
}

// record counts every rule's decision and returns the non-shadow checks
// (checks[i] is ms[i]'s) as clients see them, and, when all is wanted, every
// rule's outcome.
func (e *Edge) record(ms []rules.Match, checks []limiter.Check, v limiter.Verdict, dst, all []applied, wantAll bool) ([]applied, []applied) {
	for i, m := range ms {
		if i >= len(v.Checks) { // the limiter failed: admitted unchecked
			break
		}
		o, shadow := v.Checks[i], checks[i].Shadow
		decision := "allowed"
		switch {
		case o.Source == limiter.SourceSkipped:
		case !o.Allowed && shadow:
			decision = "shadow_denied"
			e.log.Info("shadow rule would deny", "rule", m.Rule.ID, "retry_after", o.RetryAfter)
		case !o.Allowed:
			decision = "denied"
		}
		if o.Source != limiter.SourceSkipped {
			e.metrics.decision(ruleLabel(m.Rule), decision, e.reason(o.Source)).Inc()
		}
		a := applied{rule: m.Rule, out: o, skipped: o.Source == limiter.SourceSkipped, shadow: shadow}
		if !shadow {
			dst = append(dst, a)
		}
		if wantAll {
			all = append(all, a)
		}
	}
	return dst, all
}

func (e *Edge) reason(s limiter.Source) string {
	if s == limiter.SourceStore {
		return e.storeName
	}
	return s.String()
}

// requestID keeps a trusted proxy's well-formed X-Request-ID, or makes one.
func (e *Edge) requestID(ctx *fasthttp.RequestCtx, trusted bool) string {
	if id := ctx.Request.Header.Peek("X-Request-ID"); trusted && validRequestID(id) {
		return string(id)
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
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
