// Package problem writes the edge's own answers as RFC 9457 problem
// documents (application/problem+json), for the pipeline's stages and for
// what the listeners refuse before a request reaches them.
package problem

import (
	"encoding/json"
	"strconv"
	"strings"

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
	var buf [512]byte
	WriteBody(ctx, p.Status, p.AppendJSON(buf[:0]), retryAfter)
}

// WriteBody answers status with body, a problem document p.AppendJSON
// gave (a caller answering the same problem again keeps its body instead
// of encoding it each time); retryAfter is at least 1.
func WriteBody(ctx *fasthttp.RequestCtx, status int, body []byte, retryAfter int64) {
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	SetRetryAfter(&ctx.Response.Header, retryAfter)
	ctx.Response.Header.SetCanonical(fieldCacheControl, noStore)
	ctx.Response.Header.SetContentTypeBytes(contentType)
	ctx.SetBody(body)
}

// SetRetryAfter sets h's Retry-After to seconds, at least 1: a problem's
// answer after WriteBody changes it with this (a copied 429's header).
func SetRetryAfter(h *fasthttp.ResponseHeader, seconds int64) {
	var num [20]byte
	h.SetCanonical(fieldRetryAfter, strconv.AppendInt(num[:0], max(seconds, 1), 10))
}

var (
	fieldRetryAfter   = []byte("Retry-After")
	fieldCacheControl = []byte("Cache-Control")
	noStore           = []byte("no-store")
	contentType       = []byte("application/problem+json")
)

// AppendJSON appends p as encoding/json writes it (the struct's tags,
// omitempty, HTML-safe escapes), byte for byte, without allocating when
// its strings need no escape beyond a quote or a backslash.
func (p Problem) AppendJSON(b []byte) []byte {
	b = append(b, `{"type":`...)
	b = appendString(b, p.Type)
	b = append(b, `,"title":`...)
	b = appendString(b, p.Title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(p.Status), 10)
	if p.Detail != "" {
		b = append(b, `,"detail":`...)
		b = appendString(b, p.Detail)
	}
	if len(p.Violated) > 0 {
		b = append(b, `,"violated-policies":[`...)
		for i, v := range p.Violated {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, v)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendString appends s as a JSON string, as encoding/json does: printable
// ASCII as is, '"' and '\\' escaped; anything else (control characters,
// '<', '>', '&', non-ASCII) is left to encoding/json itself.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '<' || c == '>' || c == '&' {
			// A clone: s itself must not escape, or neither could a
			// caller's stack array of strings.
			q, _ := json.Marshal(strings.Clone(s)) // a string: cannot fail
			return append(b, q...)
		}
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
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
