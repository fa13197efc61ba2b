package pipeline

import (
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/problem"
	"github.com/edgeguard/edgeguard/internal/reqhead"
)

// b2s views bytes as a string for lookups that do not keep it.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// headerLookup is the one way the rules and the shedder read request
// headers and query parameters (package reqhead, which rule tests share).
type headerLookup = reqhead.Lookup

// refuseRepeated answers 400 for a repeated decision header or parameter.
func refuseRepeated(ctx *fasthttp.RequestCtx, what string) {
	problem.Refuse(ctx, fasthttp.StatusBadRequest, what+" is repeated; the edge decides on it and needs exactly one")
}

// hasUnreadBody reports whether the request carries a body stream the
// handler may not have read to its end.
func hasUnreadBody(ctx *fasthttp.RequestCtx) bool {
	return ctx.Request.IsBodyStream() && ctx.Request.Header.ContentLength() != 0
}
