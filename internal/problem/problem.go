// Package problem writes the edge's own answers as RFC 9457 problem
// documents (application/problem+json), for the pipeline's stages and for
// what the listeners refuse before a request reaches them.
package problem

import (
	"encoding/json"
	"strconv"

	"github.com/valyala/fasthttp"
)

// Problem types of the IANA HTTP problem types registry.
const (
	QuotaExceeded   = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	ReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)

// Refuse answers status with a problem document (no Retry-After: asking
// again will not help). The record stage closes the connection when the
// request's body was left unread.
func Refuse(ctx *fasthttp.RequestCtx, status int, detail string) {
	Write(ctx, Problem{
		Type:   "about:blank",
		Title:  fasthttp.StatusMessage(status),
		Status: status,
		Detail: detail,
	}, 0)
	ctx.Response.Header.Del(fasthttp.HeaderRetryAfter)
}

// TooLarge answers 413 and closes the connection: the body is not read.
func TooLarge(ctx *fasthttp.RequestCtx, limit int) {
	Refuse(ctx, fasthttp.StatusRequestEntityTooLarge, "the request body exceeds "+strconv.Itoa(limit)+" bytes")
	ctx.SetConnectionClose()
}

// Problem is the body of an answer the edge gives itself.
type Problem struct {
	Type     string   `json:"type"`
	Title    string   `json:"title"`
	Status   int      `json:"status"`
	Detail   string   `json:"detail,omitempty"`
	Violated []string `json:"violated-policies,omitempty"`
}

// Write answers with p; retryAfter is at least 1.
func Write(ctx *fasthttp.RequestCtx, p Problem, retryAfter int64) {
	ctx.Response.Reset()
	ctx.SetStatusCode(p.Status)
	ctx.Response.Header.Set("Retry-After", strconv.FormatInt(max(retryAfter, 1), 10))
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetContentType("application/problem+json")
	body, _ := json.Marshal(p) // plain strings and ints: cannot fail
	ctx.SetBody(body)
}

// NotProcessed marks a response the edge gave before any origin work: the
// request had no effect anywhere, so retrying it is safe even when it is
// not idempotent (a client cannot tell that from a bare 503, which an
// origin may also send after doing part of the work).
const NotProcessed = "EdgeGuard-Not-Processed"

// Unavailable answers 503: shed, no worker free, over the adaptive origin
// limit, or Redis down in fail-closed; always before the origin saw the
// request.
func Unavailable(ctx *fasthttp.RequestCtx, detail string, retryAfter int64) {
	Write(ctx, Problem{
		Type:   ReducedCapacity,
		Title:  "Service Unavailable",
		Status: fasthttp.StatusServiceUnavailable,
		Detail: detail,
	}, retryAfter)
	ctx.Response.Header.Set(NotProcessed, "1")
}
