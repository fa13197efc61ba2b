package pipeline

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/accesslog"
	"github.com/edgeguard/edgeguard/internal/edge/trust"
	"github.com/edgeguard/edgeguard/internal/problem"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// Refusal reasons besides the framing's (listen/framing.go): the label of
// edgeguard_edge_requests_refused_total and the access log's refuse_reason.
const (
	reasonVersion        = "version"          // 505
	reasonMethod         = "method"           // 405
	reasonBodyTooLarge   = "body_too_large"   // 413
	reasonHost           = "host"             // 400: no usable Host
	reasonRepeatedField  = "repeated_field"   // 400: a field a stage decides on, sent twice
	reasonHeaderTooLarge = "header_too_large" // 431
	reasonTimeout        = "timeout"          // 408
	reasonMalformed      = "malformed"        // 400: fasthttp could not parse the request
	reasonAmbiguousPath  = "ambiguous_path"   // 400: the host refuses paths origins read differently
	reasonMisdirected    = "misdirected"      // 421: the connection's certificate does not cover Host
)

// refusalReasons is every reason, the framing's first: the counter's
// series exist from the start and no other value is ever a label.
func refusalReasons(framing []string) []string {
	return append(slices.Clone(framing),
		reasonVersion, reasonMethod, reasonBodyTooLarge, reasonHost,
		reasonRepeatedField, reasonHeaderTooLarge, reasonTimeout, reasonMalformed,
		reasonAmbiguousPath, reasonMisdirected,
	)
}

func newRefusedCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgeguard_edge_requests_refused_total",
		Help: "Requests the edge answered itself without passing them on, by reason: line_ending (a bare LF or CR), obs_fold, field_syntax, content_length, transfer_encoding (400), transfer_coding (501: a coding other than chunked), chunk_syntax, version (505), method (405), body_too_large (413), host (400: no usable Host), repeated_field (400), header_too_large (431), timeout (408: the request was not received in time), malformed (400: a request line or field fasthttp refuses), ambiguous_path (400: a path origins of different kinds read differently, on a host that refuses them), misdirected (421: with --tls-check-host, a Host the connection's certificate does not cover).",
	}, []string{"reason"})
}

func refusedByReason(v *prometheus.CounterVec, refusalReasons []string) map[string]prometheus.Counter {
	m := make(map[string]prometheus.Counter, len(refusalReasons))
	for _, r := range refusalReasons {
		m[r] = v.WithLabelValues(r)
	}
	return m
}

// countRefusal counts a refusal by its reason (unknown reasons as
// malformed: the labels stay bounded).
func (m *metrics) countRefusal(reason string) {
	c, ok := m.refused[reason]
	if !ok {
		c = m.refused[reasonMalformed]
	}
	c.Inc()
}

// ServerError answers what fasthttp refuses before the handler runs
// (Server.ErrorHandler) — a request whose framing the edge refuses
// (listen/framing.go), a header block too large, a body too large, a read that
// timed out, bytes fasthttp cannot parse — in the edge's problem format,
// and counts and logs it like the pipeline's refusals. The client is the
// socket peer: no field of a request that could not be read is trusted.
// fasthttp closes the connection after it.
func (e *Pipeline) ServerError(ctx *fasthttp.RequestCtx, err error) {
	start := time.Now()
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	reason, status, detail, framing := e.conns.Framing(err)
	switch {
	case framing:
		problem.Refuse(ctx, status, detail)
	case errors.As(err, &small):
		problem.Refuse(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "the request header block is too large")
		reason = reasonHeaderTooLarge
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		problem.Refuse(ctx, fasthttp.StatusRequestEntityTooLarge, "the request body is too large")
		reason = reasonBodyTooLarge
	case errors.As(err, &ne) && ne.Timeout():
		problem.Refuse(ctx, fasthttp.StatusRequestTimeout, "the request was not received in time")
		reason = reasonTimeout
	default:
		problem.Refuse(ctx, fasthttp.StatusBadRequest, "the request could not be parsed")
		reason = reasonMalformed
	}
	if !e.conns.Sent(ctx.Conn()) {
		// Nothing was asked: a failed TLS handshake or PROXY header
		// (counted where they fail), a connection refused at the cap, a
		// connection silent until --read-timeout. Answered, not recorded.
		return
	}
	e.recordRefusal(ctx, start, trust.Peer(ctx.RemoteIP()), reason, true)
}

// Expect answers Expect: 100-continue (Server.ExpectHandler): a declared
// body above the limit gets its 413 before the client sends it.
func (e *Pipeline) Expect(ctx *fasthttp.RequestCtx) int {
	n := ctx.Request.Header.ContentLength()
	if n <= 0 {
		return fasthttp.StatusContinue
	}
	limit := e.bodyLimit(ctx)
	if limit == 0 || n <= limit {
		return fasthttp.StatusContinue
	}
	start := time.Now()
	problem.TooLarge(ctx, limit)
	// fasthttp answers without the handler: the refusal is recorded here.
	peer := trust.Peer(ctx.RemoteIP())
	e.recordRefusal(ctx, start, trust.Client(peer, ctx.Request.Header.PeekAll("X-Forwarded-For"), e.trusted), reasonBodyTooLarge, false)
	return fasthttp.StatusRequestEntityTooLarge
}

// recordRefusal counts and logs a refusal made outside the pipeline
// (fasthttp's ErrorHandler, the Expect handler), as recordStage does for
// the pipeline's.
func (e *Pipeline) recordRefusal(ctx *fasthttp.RequestCtx, start time.Time, client netip.Addr, reason string, unread bool) {
	total := time.Since(start)
	e.metrics.request(outcomeRefused, shedder.TierNone).Inc()
	e.metrics.durationOf(outcomeRefused).Observe(total.Seconds())
	e.metrics.countRefusal(reason)
	if e.access == nil {
		return
	}
	sc := scratchPool.Get().(*scratch)
	sc.ctx, sc.client, sc.refusal, sc.unread = ctx, client, reason, unread
	e.logAccess(ctx, start, total, outcomeRefused, sc)
	sc.reset()
	scratchPool.Put(sc)
}

// logRefusal adds a refused request's reason to its access-log line.
func logRefusal(line *accesslog.Line, sc *scratch) {
	if sc.refusal != "" {
		line.Str("refuse_reason", sc.refusal)
	}
}
