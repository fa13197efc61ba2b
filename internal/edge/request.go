package edge

import (
	"strconv"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// b2s views bytes as a string for lookups that do not keep it.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// headerLookup is the one way the rules and the shedder read request
// headers and query parameters. One they ask about that appears more than
// once has no single meaning (the origin would see every value, the edge
// one of them), so it is recorded in repeated and reads as absent; the
// caller then refuses the request.
type headerLookup struct {
	h        *fasthttp.RequestHeader
	args     *fasthttp.Args
	repeated string // "header X-Api-Key", "query parameter key"
}

func (l *headerLookup) get(name string) (string, bool) {
	return l.one(l.h.PeekAll(name), "header ", name)
}

func (l *headerLookup) query(name string) (string, bool) {
	return l.one(l.args.PeekMulti(name), "query parameter ", name)
}

func (l *headerLookup) one(vs [][]byte, kind, name string) (string, bool) {
	switch len(vs) {
	case 0:
		return "", false
	case 1:
		return b2s(vs[0]), true
	}
	if l.repeated == "" {
		l.repeated = kind + name
	}
	return "", false
}

// refuseRepeated answers 400 for a repeated decision header or parameter.
func refuseRepeated(ctx *fasthttp.RequestCtx, what string) {
	refuse(ctx, fasthttp.StatusBadRequest, what+" is repeated; the edge decides on it and needs exactly one")
}

// refuse answers status with a problem document (no Retry-After: asking
// again will not help). The record stage closes the connection when the
// request's body was left unread.
func refuse(ctx *fasthttp.RequestCtx, status int, detail string) {
	writeProblem(ctx, problem{
		Type:   "about:blank",
		Title:  fasthttp.StatusMessage(status),
		Status: status,
		Detail: detail,
	}, 0)
	ctx.Response.Header.Del(fasthttp.HeaderRetryAfter)
}

func tooLarge(ctx *fasthttp.RequestCtx, limit int) {
	refuse(ctx, fasthttp.StatusRequestEntityTooLarge, "the request body exceeds "+strconv.Itoa(limit)+" bytes")
	ctx.SetConnectionClose()
}

// hasUnreadBody reports whether the request carries a body stream the
// handler may not have read to its end.
func hasUnreadBody(ctx *fasthttp.RequestCtx) bool {
	return ctx.Request.IsBodyStream() && ctx.Request.Header.ContentLength() != 0
}
