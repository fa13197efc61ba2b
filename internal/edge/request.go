package edge

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"strconv"

	"github.com/valyala/fasthttp"
)

// refusedMethods are answered 405 unless --allow-methods names them:
// CONNECT asks the edge to open a tunnel, TRACE echoes the request
// (credentials included) back; neither belongs on a CDN origin by default.
var refusedMethods = [...]string{fasthttp.MethodConnect, fasthttp.MethodTrace}

// refusedMethod returns the refused method m names (case-insensitively,
// as origins may read it), or "".
func refusedMethod(m []byte) string {
	for _, r := range refusedMethods {
		if bytes.EqualFold(m, []byte(r)) {
			return r
		}
	}
	return ""
}

// allowHeader is the Allow field of a 405: what the edge passes on.
const allowHeader = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

var (
	http10 = []byte("HTTP/1.0")
	http11 = []byte("HTTP/1.1")
)

// screen refuses what the edge must not pass on, before shedding or
// counting: HTTP versions other than 1.0 and 1.1 (505), refused methods
// (405), declared bodies above --max-body-bytes (413) and a request with no
// usable Host (400, or --default-host when set: an HTTP/1.0 request may
// omit it, and host rules must not be skipped by leaving it out). It makes
// an absolute-form request-target's authority the request's Host (RFC 9112
// §3.2.2), so the rules match and the origin receives one and the same
// host, and drops the fields this peer may not send (trust.go). It reports
// whether the request may go on.
func (e *Edge) screen(ctx *fasthttp.RequestCtx, trusted bool) bool {
	if proto := ctx.Request.Header.Protocol(); !bytes.Equal(proto, http11) && !bytes.Equal(proto, http10) {
		refuse(ctx, fasthttp.StatusHTTPVersionNotSupported, "only HTTP/1.0 and HTTP/1.1 are served")
		return false
	}
	if m := refusedMethod(ctx.Method()); m != "" && !e.allowMethods[m] {
		refuse(ctx, fasthttp.StatusMethodNotAllowed, "method "+m+" is not allowed")
		ctx.Response.Header.Set(fasthttp.HeaderAllow, allowHeader)
		return false
	}
	if n := ctx.Request.Header.ContentLength(); n > e.cfg.MaxBodyBytes {
		tooLarge(ctx, e.cfg.MaxBodyBytes)
		return false
	}
	// A Host or an absolute-form target with user info ("u:p@host") would
	// reach the origin as an Authorization field (fasthttp's client writes
	// one from a URI's user): no such request goes on.
	if uri := ctx.URI(); len(uri.Username()) > 0 || len(uri.Password()) > 0 || bytes.IndexByte(ctx.Request.Header.Host(), '@') >= 0 {
		refuse(ctx, fasthttp.StatusBadRequest, "the request has no usable Host (user info is not allowed)")
		return false
	}
	// fasthttp takes the URI's host from an absolute-form target and keeps
	// the Host field as sent; the origin client sends the Host field.
	if host := ctx.URI().Host(); len(host) > 0 && !bytes.Equal(host, ctx.Request.Header.Host()) {
		ctx.Request.Header.SetHostBytes(host)
	}
	if host := ctx.Request.Header.Host(); len(host) == 0 && e.cfg.DefaultHost != "" {
		ctx.Request.Header.SetHost(e.cfg.DefaultHost)
	} else if !usableHost(host) {
		refuse(ctx, fasthttp.StatusBadRequest, "the request has no usable Host")
		return false
	}
	e.headerScreen.apply(&ctx.Request.Header, trusted)
	return true
}

// usableHost reports whether h can name a site: a DNS name or an IP
// literal, with an optional port, at most 255 bytes. Anything else would
// match no host rule (an empty host skips them all) while an origin might
// still route it.
func usableHost(h []byte) bool {
	if len(h) == 0 || len(h) > 255 {
		return false
	}
	name := h
	if h[0] == '[' {
		end := bytes.IndexByte(h, ']')
		if end < 0 {
			return false
		}
		if _, err := netip.ParseAddr(string(h[1:end])); err != nil {
			return false
		}
		name, h = nil, h[end+1:]
		if len(h) > 0 && h[0] != ':' {
			return false
		}
	} else if i := bytes.IndexByte(h, ':'); i >= 0 {
		name, h = h[:i], h[i:]
	} else {
		h = nil
	}
	if len(h) > 0 { // ":port"
		if len(h) < 2 || len(h) > 6 {
			return false
		}
		for _, c := range h[1:] {
			if c < '0' || c > '9' {
				return false
			}
		}
	}
	if name == nil {
		return true
	}
	if len(name) == 0 || len(bytes.Trim(name, ".")) == 0 {
		return false
	}
	for _, c := range name {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.', c == '_':
		default:
			return false
		}
	}
	return true
}

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
// again will not help). handle closes the connection when the request's
// body was left unread.
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

// serverError answers what fasthttp refuses before the handler runs
// (Server.ErrorHandler), in the edge's problem format.
func serverError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.As(err, &small):
		refuse(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "the request header block is too large")
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		refuse(ctx, fasthttp.StatusRequestEntityTooLarge, "the request body is too large")
	case errors.As(err, &ne) && ne.Timeout():
		refuse(ctx, fasthttp.StatusRequestTimeout, "the request was not received in time")
	default:
		refuse(ctx, fasthttp.StatusBadRequest, "the request could not be parsed")
	}
}
