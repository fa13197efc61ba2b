package edge

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// seenRequest is what the rules saw of one proxied request.
type seenRequest struct {
	host, method, path string
	rawPath, rawQuery  string
}

// gotRequest is what the origin received.
type gotRequest struct {
	host, method, uri string
	header            []byte
}

// requestRecorder pairs, by request id, what the rules saw with what the
// origin received.
type requestRecorder struct {
	mu   sync.Mutex
	seen map[string]seenRequest
	got  map[string]gotRequest
}

const fuzzRules = `
version: 1
rules:
  - id: host
    match: {hosts: [api.example.com]}
    key: [ip]
    algorithm: fixed_window
    limit: 1000000000
    window: 1h
  - id: query
    key: ["query:key", "header:X-Api-Key"]
    algorithm: fixed_window
    limit: 1000000000
    window: 1h
`

// FuzzRequestSeenAsForwarded sends raw bytes to a running edge (a real
// socket) and holds every request it proxies to one rule: what the rules
// saw and what the origin received are the same request — host, method,
// path (as the rules normalize it) and the query bytes as sent — and no
// forwarding field of the (untrusted) client, nor a header name with an
// underscore, reached the origin.
func FuzzRequestSeenAsForwarded(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"GET /x?%7e=a%20b&%zz&a==b&a=1&&b=2&key=k HTTP/1.1\r\nHost: a.example\r\n\r\n",
		"GET /x HTTP/1.0\r\n\r\n",
		"GET http://api.example.com/a/../b?key=1 HTTP/1.1\r\nHost: other.example\r\n\r\n",
		"GET /%2e%2e/%2F/a HTTP/1.1\r\nHost: API.Example.com.\r\nX-Forwarded-Host: evil\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: api.example.com:8080\r\nX-HTTP-Method-Override: DELETE\r\nContent-Length: 3\r\n\r\nabc",
		"GET /a HTTP/1.1\r\nHost: a.example\r\nX_Api_Key: k\r\nForwarded: for=1.2.3.4\r\n\r\nGET /b HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: u:p@api.example.com\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: [::1]:80\r\nX-Api-Key: k\r\nX-Api-Key: j\r\n\r\n",
		"get /a#frag HTTP/1.1\r\nHost: a.example\r\n\r\n",
		"POST /a HTTP/1.1\r\nHost: a.example\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /b HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"POST /a HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n0\r\nT: 1\r\n\r\nGET /b?key=1 HTTP/1.1\nHost: api.example.com\n\n",
	} {
		f.Add([]byte(seed))
	}
	addr, rec, stop, err := startFuzzEdge()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(stop)
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(in); err != nil {
			return // the edge may close first on garbage
		}
		_ = c.(*net.TCPConn).CloseWrite()
		_, _ = io.Copy(io.Discard, c) // every answer, until the edge closes
		rec.check(t)
	})
}

// check compares every pair recorded since the last check, then forgets them.
func (r *requestRecorder) check(t *testing.T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, got := range r.got {
		seen, ok := r.seen[id]
		if !ok {
			t.Fatalf("the origin got a request the rules never saw: %+v", got)
		}
		path, query, _ := strings.Cut(got.uri, "?")
		switch {
		case rules.NormalizeHost(got.host) != seen.host:
			t.Fatalf("host: rules saw %q, origin got %q", seen.host, got.host)
		case got.method != seen.method:
			t.Fatalf("method: rules saw %q, origin got %q (%s)", seen.method, got.method, got.header)
		case rules.NormalizePath(path) != seen.path:
			t.Fatalf("path: rules saw %q, origin got %q", seen.path, path)
		case path != seen.rawPath && !(seen.rawPath == "" && path == "/"):
			t.Fatalf("path: client sent %q, origin got %q", seen.rawPath, path)
		case query != seen.rawQuery:
			t.Fatalf("query: client sent %q, origin got %q", seen.rawQuery, query)
		}
		lower := bytes.ToLower(got.header)
		for _, name := range spoofedFields {
			switch name {
			case "x-forwarded-for", "forwarded", "x-forwarded-proto", "x-forwarded-host":
				continue // the edge's own
			}
			if bytes.Contains(lower, []byte("\n"+name+":")) {
				t.Fatalf("an untrusted %s reached the origin:\n%s", name, got.header)
			}
		}
		for _, line := range bytes.Split(got.header, []byte("\r\n")) {
			if name, _, ok := bytes.Cut(line, []byte(":")); ok && bytes.IndexByte(name, '_') >= 0 {
				t.Fatalf("a header name with an underscore reached the origin: %q", line)
			}
		}
	}
	clear(r.got)
	clear(r.seen)
}

// startFuzzEdge starts an edge (no trusted peers) in front of a recording
// origin; stop shuts both down.
func startFuzzEdge() (addr string, rec *requestRecorder, stop func(), err error) {
	rec = &requestRecorder{seen: map[string]seenRequest{}, got: map[string]gotRequest{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, err
	}
	origin := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		id := string(ctx.Request.Header.Peek("X-Request-ID"))
		if id == "" {
			return // the edge's health check
		}
		rec.mu.Lock()
		rec.got[id] = gotRequest{
			host:   string(ctx.Request.Header.Host()),
			method: string(ctx.Method()),
			uri:    string(ctx.Request.Header.RequestURI()),
			header: append([]byte(nil), ctx.Request.Header.Header()...),
		}
		rec.mu.Unlock()
	}}
	go func() { _ = origin.Serve(ln) }()
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Origins = []string{"http://" + ln.Addr().String()}
	cfg.DrainDelay = 0
	cfg.MaxConnsPerIP = 0
	cfg.Rules = ""
	e, err := New(cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		err = e.ApplyRules([]byte(fuzzRules))
	}
	if err != nil {
		_ = origin.Shutdown()
		return "", nil, nil, err
	}
	e.pipe.SetSeen(func(ctx *fasthttp.RequestCtx, req *rules.Request, id string) {
		rec.mu.Lock()
		rec.seen[id] = seenRequest{
			// Copies: the request's values view buffers fasthttp reuses.
			host: strings.Clone(req.Host), method: strings.Clone(req.Method), path: strings.Clone(req.Path),
			rawPath: string(ctx.URI().PathOriginal()), rawQuery: string(ctx.URI().QueryString()),
		}
		rec.mu.Unlock()
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	return e.Addr(), rec, func() { cancel(); <-done; _ = origin.Shutdown() }, nil
}
