package pipeline

import (
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/accesslog"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// logAccess writes the request's access-log line (step 11, Record): every
// request the edge did not proxy (denied, shed, refused, abandoned,
// unavailable) and a --access-log-sample share of the proxied ones.
func (e *Pipeline) logAccess(ctx *fasthttp.RequestCtx, start time.Time, total time.Duration, outcome string, sc *scratch) {
	if e.access == nil || outcome == outcomeProxied && e.cfg.AccessLogSample < 1 && rand.Float64() >= e.cfg.AccessLogSample {
		return
	}
	id := sc.id
	if id == "" {
		id = e.requestID(ctx, false, &sc.idBuf) // a line of its own to grep for
	}
	var client [64]byte
	line := e.access.Begin(start).
		Str("id", id).
		Str("client", appendClient(client[:0], sc))
	if sc.unread {
		// fasthttp could not read the request: its host, method and path
		// are fasthttp's defaults, not the client's.
		line.Str("host", "").Str("method", "").Str("path", "")
	} else {
		line.Bytes("host", ctx.Request.Header.Host()).
			Bytes("method", ctx.Method()).
			Bytes("path", ctx.Request.URI().PathOriginal())
	}
	line.Int("status", int64(ctx.Response.StatusCode())).
		Str("outcome", outcome).
		Str("decision", decisionOf(outcome, sc)).
		Str("tier", sc.tier.String())
	var ids [8]string
	rules, source := e.decidedBy(sc, ids[:0])
	line.List("rules", rules).Str("source", source)
	if len(sc.bypassed) > 0 {
		var bids [8]string
		by := bids[:0]
		for _, r := range sc.bypassed {
			by = append(by, r.ID)
		}
		line.List("bypassed", by)
	}
	if fp := e.conns.JA4(ctx.Conn()); fp != "" {
		line.Str("ja4", fp)
	}
	if outcome == outcomeShed || outcome == outcomeNoWorker || outcome == outcomeAbandoned || outcome == outcomeHostShare || outcome == outcomePoolLimit {
		line.Str("shed_reason", outcome)
	}
	logRefusal(line, sc)
	line.Dur("upstream_seconds", sc.upstream).
		Dur("total_seconds", total).
		Int("bytes_in", int64(max(ctx.Request.Header.ContentLength(), 0))).
		Int("bytes_out", bytesOut(&ctx.Response))
	e.access.Send(line)
}

// bytesOut is the response body's size as the line is written, when the
// handler returns: a body streaming from the origin has not been sent yet,
// so it is its declared length, or -1 when it streams chunked (reading
// Body would pull the whole stream into memory).
func bytesOut(resp *fasthttp.Response) int64 {
	if resp.IsBodyStream() {
		return int64(max(resp.Header.ContentLength(), -1))
	}
	return int64(len(resp.Body()))
}

// decidedBy is what the access log and the request's span say decided a
// request: the ids of the rules that applied (appended to buf) and where the
// deciding answer came from (the first denial's source, else the first's).
func (e *Pipeline) decidedBy(sc *scratch, buf []string) (rules []string, source string) {
	rules = buf
	for _, a := range sc.all {
		if a.skipped {
			continue
		}
		rules = append(rules, a.rule.ID)
		if source == "" || !a.out.Allowed {
			source = e.reason(a.out.Source)
		}
	}
	if sc.penalised {
		source = "penalty"
	}
	return rules, source
}

func clientString(sc *scratch) string {
	if !sc.client.IsValid() {
		return ""
	}
	return sc.client.String()
}

// appendClient is clientString written into b, for a line that copies it.
func appendClient(b []byte, sc *scratch) string {
	if !sc.client.IsValid() {
		return ""
	}
	return b2s(sc.client.AppendTo(b))
}

// decisionOf is the access log's decision: allowed, denied (a rule),
// shadow (a shadow rule would have denied), or what else happened.
func decisionOf(outcome string, sc *scratch) string {
	switch outcome {
	case outcomeDenied:
		return "denied"
	case outcomeProxied:
		if len(sc.all) == 0 && len(sc.bypassed) > 0 {
			return "bypass" // every rule that applied let it pass
		}
		for _, a := range sc.all {
			if a.shadow && !a.out.Allowed && a.out.Source != limiter.SourceSkipped {
				return "shadow"
			}
		}
		return "allowed"
	}
	return outcome
}

// openAccessLog opens --access-log, if any.
func (e *Pipeline) openAccessLog(reg prometheus.Registerer) error {
	if e.cfg.AccessLog == "" {
		return nil
	}
	format, err := accesslog.ParseFormat(e.cfg.AccessLogFormat)
	if err != nil {
		return err
	}
	l, err := accesslog.Open(e.cfg.AccessLog, format, func(err error) {
		if ok, suppressed := e.accessWarn.Allow(time.Now()); ok {
			e.log.Warn("access log write failed", "err", err, "suppressed", suppressed)
		}
	})
	if err != nil {
		return err
	}
	e.access = l
	e.closers = append(e.closers, l.Close)
	if err := e.metrics.accessLog(reg, l); err != nil {
		return err
	}
	return nil
}
