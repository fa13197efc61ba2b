// Package reqhead is how the edge settles a request's Host and reads its
// headers and query parameters for the rules and the shedder: the edge's
// pipeline and regionctl's rule tests both go through it, so a rule test
// sees what the edge sees.
package reqhead

import (
	"bytes"
	"strings"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// Lookup reads single values. One asked about that appears more than once
// has no single meaning (the origin would see every value, the edge one of
// them), so it is recorded (Repeated) and reads as absent; the caller then
// refuses the request.
type Lookup struct {
	h        *fasthttp.RequestHeader
	args     *fasthttp.Args
	repeated string // "header X-Api-Key", "query parameter key"
}

// New reads h and args (either may be nil: nothing there).
func New(h *fasthttp.RequestHeader, args *fasthttp.Args) Lookup {
	return Lookup{h: h, args: args}
}

// Get looks up a header, case-insensitively.
//
// A name fasthttp keeps with the other fields is looked for first among
// the names, as they are: asking for it by name copies and normalizes the
// name and scans every field, though the field (a priority or an API-key
// header, on a request from the internet) is most often not there.
func (l *Lookup) Get(name string) (string, bool) {
	if l.h == nil {
		return "", false
	}
	if !keptApart(name) && !Holds(l.h, name) {
		return "", false
	}
	return l.one(l.h.PeekAll(name), "header ", name)
}

// keptApart reports whether fasthttp keeps name's field apart from the
// others, where PeekAll finds it otherwise than under its name.
func keptApart(name string) bool {
	for _, k := range apart {
		if len(k) == len(name) && strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

var apart = [...]string{
	fasthttp.HeaderHost, fasthttp.HeaderContentType, fasthttp.HeaderUserAgent, fasthttp.HeaderConnection,
	fasthttp.HeaderContentLength, fasthttp.HeaderCookie, fasthttp.HeaderTrailer, fasthttp.HeaderTransferEncoding,
}

// Holds reports whether h has a field named name, in any case, from one
// look over the names: nothing is copied or normalized. All
// gathers the request's cookies, which changes how PeekAll answers for
// Cookie; both callers (the edge's pipeline, regionctl's rule tests) have
// walked the header with the trust screen before, which gathers them too.
func Holds(h *fasthttp.RequestHeader, name string) bool {
	for k := range h.All() {
		if len(k) == len(name) && strings.EqualFold(b2s(k), name) {
			return true
		}
	}
	return false
}

// FoldEqual reports whether k is lower with its ASCII letters in any case;
// lower is in lower case. A field's name is compared so without being
// copied or normalized.
func FoldEqual(k []byte, lower string) bool {
	if len(k) != len(lower) {
		return false
	}
	for i, c := range k {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// Query looks up a decoded query parameter by exact name.
func (l *Lookup) Query(name string) (string, bool) {
	if l.args == nil {
		return "", false
	}
	return l.one(l.args.PeekMulti(name), "query parameter ", name)
}

// Repeated names the first header or parameter asked about that was sent
// more than once ("header X-Api-Key"); "" when none was.
func (l *Lookup) Repeated() string { return l.repeated }

func (l *Lookup) one(vs [][]byte, kind, name string) (string, bool) {
	switch len(vs) {
	case 0:
		return "", false
	case 1:
		return unsafe.String(unsafe.SliceData(vs[0]), len(vs[0])), true
	}
	if l.repeated == "" {
		l.repeated = kind + name
	}
	return "", false
}

// SettleHost gives r the one Host the rules match and the origin receives,
// and reports why r has none it may go on with ("" when it has). A Host or
// an absolute-form target with user info ("u:p@host") would reach the
// origin as an Authorization field (fasthttp's client writes one from a
// URI's user): no such request goes on. An absolute-form target's
// authority becomes the Host (RFC 9112 §3.2.2): fasthttp takes the URI's
// host from it and keeps the Host field as sent, and the origin client
// sends the Host field. A request with no Host (HTTP/1.0 may omit it) gets
// defaultHost when set, so host rules cannot be skipped by leaving it
// out; usable says whether a Host may go on.
func SettleHost(r *fasthttp.Request, defaultHost string, usable func(host []byte) bool) string {
	if uri := r.URI(); len(uri.Username()) > 0 || len(uri.Password()) > 0 || bytes.IndexByte(r.Header.Host(), '@') >= 0 {
		return "the request has no usable Host (user info is not allowed)"
	}
	if host := r.URI().Host(); len(host) > 0 && !bytes.Equal(host, r.Header.Host()) {
		r.Header.SetHostBytes(host)
	}
	if host := r.Header.Host(); len(host) == 0 && defaultHost != "" {
		r.Header.SetHost(defaultHost)
	} else if !usable(host) {
		return "the request has no usable Host"
	}
	return ""
}

// TargetHost is the Host SettleHost gives r, read without changing r: an
// absolute-form target's authority, else the Host field, else defaultHost.
// What is decided before the Host is settled (a declared body's size
// limit, the answer to Expect: 100-continue) asks it, so an
// absolute-form target cannot be judged by another host's settings than
// the one it goes to. It is r's own bytes, valid until r changes: not to
// be kept.
func TargetHost(r *fasthttp.Request, defaultHost string) string {
	if host := r.URI().Host(); len(host) > 0 {
		return b2s(host)
	}
	if host := r.Header.Host(); len(host) > 0 {
		return b2s(host)
	}
	return defaultHost
}
