package pipeline

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/origin"
)

// outcomeTunnelClosed is the outcome of the access-log line a tunnel
// writes when it closes.
const outcomeTunnelClosed = "tunnel_closed"

// tunnelClosed is what writes a tunnel's second access-log line, at its
// close (nil without an access log). An upgrade's own line is written
// when the handler returns, like any request's (status 101, sampled by
// --access-log-sample); the tunnel outlives it, so its bytes and its
// length can only be known later: this line, never sampled, carries the
// request's id, how the tunnel ended (end), bytes_in (client to origin),
// bytes_out (origin to client) and total_seconds (the request's start to
// the close).
func (e *Pipeline) tunnelClosed(ctx *fasthttp.RequestCtx, sc *scratch, id string) func(origin.TunnelEnd) {
	if e.access == nil {
		return nil
	}
	start := sc.start
	client, host := clientString(sc), string(ctx.Request.Header.Host())
	method, path := string(ctx.Method()), string(ctx.Request.URI().PathOriginal())
	tier := sc.tier.String()
	return func(end origin.TunnelEnd) {
		line := e.access.Begin(time.Now()).
			Str("id", id).
			Str("client", client).
			Str("host", host).
			Str("method", method).
			Str("path", path).
			Int("status", fasthttp.StatusSwitchingProtocols).
			Str("outcome", outcomeTunnelClosed).
			Str("end", end.Reason).
			Str("tier", tier).
			Dur("total_seconds", time.Since(start)).
			Int("bytes_in", end.ToOrigin).
			Int("bytes_out", end.ToClient)
		e.access.Send(line)
	}
}
