package edge_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// The golden tests pin what the edge says to the outside — its response
// bodies and fields, the access log's fields and its own log messages —
// through nothing but its command line, so that a change inside the
// package cannot change them unnoticed. go test -run TestGolden -update
// rewrites testdata/golden/.
var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

const goldenRules = `
version: 1
rules:
  - id: per-ip
    match: {path_prefix: [/limited]}
    key: [ip]
    algorithm: sliding_log
    limit: 2
    window: 1m
  - id: per-key
    match: {path_prefix: [/keyed]}
    key: [header:X-Api-Key]
    algorithm: sliding_log
    limit: 100
    window: 1m
`

// goldenOrigin answers a fixed body, except /slow: it signals the
// request's arrival on slowArrived and holds it until the test ends.
func goldenOrigin(t *testing.T) (url string, slowArrived <-chan struct{}) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/slow" {
			select { // the edge holds a worker for this request now
			case arrived <- struct{}{}:
			default:
			}
			<-release // never answered in time: the edge's origin timeout ends it
		}
		ctx.SetContentType("text/plain")
		ctx.SetBodyString("origin\n")
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	t.Cleanup(func() { close(release) }) // before Shutdown, which waits for the handler
	return "http://" + ln.Addr().String(), arrived
}

type goldenEdge struct {
	addr      string
	logs      *goldenLog
	accessLog string
	stop      func()
}

type goldenLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *goldenLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *goldenLog) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// plainOrigin is goldenOrigin for tests that send no slow request.
func plainOrigin(t *testing.T) string {
	url, _ := goldenOrigin(t)
	return url
}

// startGoldenEdge starts an edge from a command line, as cmd/edge does.
func startGoldenEdge(t *testing.T, originURL string, args ...string) *goldenEdge {
	t.Helper()
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	require.NoError(t, os.WriteFile(rulesFile, []byte(goldenRules), 0o600))
	g := &goldenEdge{logs: &goldenLog{}, accessLog: filepath.Join(dir, "access.log")}
	base := []string{
		"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--drain-delay", "0s",
		"--origin", originURL, "--rules", rulesFile, "--access-log", g.accessLog,
		"--region", "eu-west", "--pop", "ams",
	}
	var out bytes.Buffer
	cfg, code, ok := config.ParseCommandLine(append(base, args...), nil, &out, &out)
	require.True(t, ok, "exit %d: %s", code, out.String())
	e, err := edge.New(cfg, config.NewLogger(g.logs, cfg.LogLevel))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var once sync.Once
	g.stop = func() { once.Do(func() { cancel(); require.NoError(t, <-done) }) }
	t.Cleanup(g.stop)
	g.addr = e.Addr()
	return g
}

// exchange sends raw bytes and reads one response.
func (g *goldenEdge) exchange(t *testing.T, raw string) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", g.addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(c, raw)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	return resp
}

var (
	digits   = regexp.MustCompile(`[0-9]+`)
	hostPort = regexp.MustCompile(`[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+:[0-9]+`)
)

// goldenHeaders are the response fields pinned; values that depend on the
// clock have their numbers replaced.
var goldenHeaders = []struct {
	name   string
	masked bool
}{
	{"Content-Type", false},
	{"Cache-Control", false},
	{"Retry-After", true},
	{"Edgeguard-Not-Processed", false},
	{"Connection", false},
	{"Ratelimit-Policy", false},
	{"Ratelimit", true},
}

func describe(t *testing.T, resp *http.Response) string {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", resp.Proto, resp.Status)
	for _, h := range goldenHeaders {
		for _, v := range resp.Header.Values(h.name) {
			if h.masked {
				v = digits.ReplaceAllString(v, "N")
			}
			fmt.Fprintf(&b, "%s: %s\n", h.name, v)
		}
	}
	if strings.Contains(resp.Header.Get("Content-Type"), "json") {
		fmt.Fprintf(&b, "\n%s\n", body)
	} else {
		fmt.Fprintf(&b, "\n(%d bytes of %s)\n", len(body), resp.Header.Get("Content-Type"))
	}
	return b.String()
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "no golden file; run with -update")
	require.Equal(t, string(want), got, "%s differs; run with -update if the change is meant", path)
}

// goldenRequests are the requests the public edge answers itself or
// proxies, in order: each response's status, pinned fields and body.
var goldenRequests = []struct{ name, raw string }{
	{"proxied", "GET /limited HTTP/1.1\r\nHost: example.com\r\n\r\n"},
	{"allowed-second", "GET /limited HTTP/1.1\r\nHost: example.com\r\n\r\n"},
	{"429-over-limit", "GET /limited HTTP/1.1\r\nHost: example.com\r\n\r\n"},
	{"400-repeated-header", "GET /keyed HTTP/1.1\r\nHost: example.com\r\nX-Api-Key: a\r\nX-Api-Key: b\r\n\r\n"},
	{"400-no-host", "GET / HTTP/1.1\r\n\r\n"},
	{"400-bare-lf", "GET / HTTP/1.1\nHost: example.com\n\n"},
	{"400-two-lengths", "POST / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"},
	{"405-trace", "TRACE / HTTP/1.1\r\nHost: example.com\r\n\r\n"},
	{"413-expect", "POST / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n"},
	{"505-version", "GET / HTTP/2.0\r\nHost: example.com\r\n\r\n"},
}

// TestGoldenResponses pins the bodies and fields of the edge's answers:
// the problem+json documents for 400, 405, 413, 429, 502, 503, 504 and
// 505, and the fields of a proxied answer.
func TestGoldenResponses(t *testing.T) {
	t.Parallel() // it mostly waits (the 504's 3 s), as package edge's waiting tests
	g := startGoldenEdge(t, plainOrigin(t), "--max-body-bytes", "1024")
	var b strings.Builder
	for _, r := range goldenRequests {
		fmt.Fprintf(&b, "=== %s\n%s", r.name, describe(t, g.exchange(t, r.raw)))
	}

	// 502: no origin listens.
	down := startGoldenEdge(t, "http://"+testenv.ClosedAddr(t))
	fmt.Fprintf(&b, "=== 502-origin-down\n%s", describe(t, down.exchange(t, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")))

	// 504, then 503: the one worker held by a request the origin answers
	// too late, the next finds no worker free.
	slowOrigin, slowArrived := goldenOrigin(t)
	slow := startGoldenEdge(t, slowOrigin, "--workers", "1", "--origin-header-timeout", "3s")
	held := make(chan *http.Response, 1)
	c, err := net.Dial("tcp", slow.addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: example.com\r\n\r\n")
	require.NoError(t, err)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			held <- nil
			return
		}
		held <- resp
	}()
	<-slowArrived // the slow request holds the worker
	fmt.Fprintf(&b, "=== 503-no-worker\n%s", describe(t, slow.exchange(t, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")))
	resp := <-held
	require.NotNil(t, resp)
	fmt.Fprintf(&b, "=== 504-origin-timeout\n%s", describe(t, resp))
	checkGolden(t, "responses.txt", b.String())
}

// accessMasked are the access-log fields whose values depend on the clock,
// the ports or the process; the others are pinned as written.
var accessMasked = map[string]bool{"time": true, "id": true, "client": true, "upstream_seconds": true, "total_seconds": true, "trace_id": true, "span_id": true}

// TestGoldenAccessLog pins the access log's fields: every line's names,
// and the values that do not depend on the clock or the ports.
func TestGoldenAccessLog(t *testing.T) {
	g := startGoldenEdge(t, plainOrigin(t), "--max-body-bytes", "1024")
	for _, r := range goldenRequests {
		_, _ = io.Copy(io.Discard, g.exchange(t, r.raw).Body)
	}
	g.stop()
	data, err := os.ReadFile(g.accessLog)
	require.NoError(t, err)
	var lines []string
	for l := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var b strings.Builder
		for _, k := range keys {
			v, _ := json.Marshal(m[k])
			if accessMasked[k] {
				v = []byte("*")
			}
			fmt.Fprintf(&b, " %s=%s", k, v)
		}
		lines = append(lines, strings.TrimSpace(b.String()))
	}
	// Lines are written as requests end; the requests above end in order.
	checkGolden(t, "access.txt", strings.Join(lines, "\n")+"\n")
}

// logMasked are the log attributes whose values are pinned too (the
// others by name only).
var logMasked = map[string]bool{"level": true, "msg": true, "store": true, "region": true, "pop": true, "rules": true, "reason": true, "status": true}

// TestGoldenLog pins the edge's own log: each message once, with its level
// and the names of its attributes, from start to stop.
func TestGoldenLog(t *testing.T) {
	g := startGoldenEdge(t, plainOrigin(t), "--max-body-bytes", "1024", "--log-level", "debug")
	for _, r := range goldenRequests {
		_, _ = io.Copy(io.Discard, g.exchange(t, r.raw).Body)
	}
	g.stop()
	demo := startGoldenEdge(t, "", "--demo-origin", "--log-level", "debug")
	_, _ = io.Copy(io.Discard, demo.exchange(t, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n").Body)
	demo.stop()
	seen := map[string]bool{}
	var lines []string
	for l := range strings.SplitSeq(strings.TrimSpace(g.logs.String()+demo.logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		keys := make([]string, 0, len(m))
		for k := range m {
			if k != "time" {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		var b strings.Builder
		fmt.Fprintf(&b, "%s %q", m["level"], m["msg"])
		for _, k := range keys {
			if k == "level" || k == "msg" {
				continue
			}
			if logMasked[k] {
				v, _ := json.Marshal(m[k])
				fmt.Fprintf(&b, " %s=%s", k, v)
			} else {
				fmt.Fprintf(&b, " %s", k)
			}
		}
		if s := hostPort.ReplaceAllString(b.String(), "ADDR"); !seen[s] {
			seen[s] = true
			lines = append(lines, s)
		}
	}
	slices.Sort(lines) // goroutines log in no fixed order
	checkGolden(t, "log.txt", strings.Join(lines, "\n")+"\n")
}
