package pipeline

import (
	"time"
)

// recordStage wraps the rest of the pipeline (step 11, Record): once they
// return, the connection is told to close when it must, and the request is
// counted (Prometheus), logged (access.go) and its span ended (trace.go).
func (e *Pipeline) recordStage(sc *scratch) string {
	sc.start = time.Now()
	outcome := e.next(sc)
	ctx := sc.ctx
	if e.draining.Load() {
		// Keep-alive clients leave now, not when the listener closes.
		ctx.SetConnectionClose()
	}
	if outcome != outcomeProxied && hasUnreadBody(ctx) {
		// The rest of an unread body must not be taken for a request.
		ctx.SetConnectionClose()
	}
	if e.conns.ClosesAfter(ctx.Conn()) {
		// Transfer-Encoding with Content-Length: answered (the body read
		// as chunked), then the connection ends (RFC 9112 §6.3); the
		// framer reads nothing after the body (listen/framing.go).
		ctx.SetConnectionClose()
	}
	total := time.Since(sc.start)
	e.metrics.request(outcome, sc.tier).Inc()
	if outcome == outcomeRefused {
		e.metrics.countRefusal(sc.refusal)
	}
	e.metrics.durationOf(outcome).Observe(total.Seconds())
	e.logAccess(ctx, sc.start, total, outcome, sc)
	if sc.span != nil {
		e.endRequestSpan(sc.span, ctx, outcome, sc)
	}
	return outcome
}
