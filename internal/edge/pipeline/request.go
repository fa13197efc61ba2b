package pipeline

import (
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/problem"
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
	problem.Refuse(ctx, fasthttp.StatusBadRequest, what+" is repeated; the edge decides on it and needs exactly one")
}

// hasUnreadBody reports whether the request carries a body stream the
// handler may not have read to its end.
func hasUnreadBody(ctx *fasthttp.RequestCtx) bool {
	return ctx.Request.IsBodyStream() && ctx.Request.Header.ContentLength() != 0
}
