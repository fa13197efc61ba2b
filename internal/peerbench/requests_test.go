package peerbench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// haproxyBin is Debian's haproxy (make tools installs it); EDGEGUARD_HAPROXY
// names another.
func haproxyBin(t *testing.T) string {
	if p := os.Getenv("EDGEGUARD_HAPROXY"); p != "" {
		return p
	}
	if p, err := exec.LookPath("haproxy"); err == nil {
		return p
	}
	_, err := os.Stat("/usr/sbin/haproxy")
	require.NoError(t, err, "haproxy is needed (make tools installs it: apt-get install haproxy)")
	return "/usr/sbin/haproxy"
}

// h2loadBin is nghttp2's h2load (make tools installs it: apt-get install
// nghttp2-client).
func h2loadBin(t *testing.T) string {
	p, err := exec.LookPath("h2load")
	require.NoError(t, err, "h2load is needed (make tools installs it: apt-get install nghttp2-client)")
	return p
}

func wrkBin(t *testing.T) string {
	p, err := exec.LookPath("wrk")
	require.NoError(t, err, "wrk is needed (make tools installs it: apt-get install wrk)")
	return p
}

// Every scenario with every peer, about a second each: each started from
// its template, each answered as its scenario says (wrk's counts, the
// forwarding fields at the origin, 429s with the edge's RateLimit fields,
// 503s the edge's ramp counted, access logs of JSON lines), and the table
// printed. No figure is asserted.
func TestRequestsSmoke(t *testing.T) {
	var out strings.Builder
	cfg := SmokeRequestsConfig()
	cfg.EdgeBin, cfg.NginxBin, cfg.HAProxyBin, cfg.WrkBin, cfg.Out = edgeBin, nginxBin(t), haproxyBin(t), wrkBin(t), &out
	cfg.H2loadBin = h2loadBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := Requests(ctx, cfg)
	require.NoError(t, err, out.String())
	t.Log(out.String())
	want := []string{"floor/origin", "shed/edge"}
	for _, sc := range []string{"proxied", "accesslog", "rule", "denied", "tls", "h2"} {
		for _, p := range proxies {
			want = append(want, sc+"/"+p)
		}
	}
	require.ElementsMatch(t, want, sortedKeys(r.Samples))
	for key, ss := range r.Samples {
		require.Len(t, ss, 1, key)
		require.Positive(t, ss[0].wrk.Requests, key)
		if strings.HasPrefix(key, "h2/") {
			// h2load spoke h2 (runH2load refuses a run that did not) and
			// every answer was a 2xx (checkWrk).
			require.Zero(t, ss[0].wrk.Non2xx, key)
			require.Zero(t, ss[0].wrk.SocketErrors, key)
			continue
		}
		require.Positive(t, ss[0].fixedP99, key)
	}
	checks := strings.Join(r.Checks, "\n")
	for _, p := range proxies {
		require.Contains(t, checks, "denied/"+p+": 429")
		require.Contains(t, checks, "accesslog/"+p+": access log of ")
	}
	require.Contains(t, checks, `denied/edge: 429 with RateLimit "\"per-client\";r=0`)
	require.Contains(t, checks, "shed/edge: 503")
	require.Contains(t, out.String(), "| edge | nginx | haproxy | edge÷nginx |")
	require.Contains(t, out.String(), "| proxied, HTTP/2 over TLS (h2load): requests/s (h2load -c16 -m10) |")
}

// A proxy that passes the client's fields on (Go's ReverseProxy appends to
// X-Forwarded-For and keeps X-Real-IP) fails the forwarding check, each
// problem named.
func TestForwardingCheckCatchesAPassThroughProxy(t *testing.T) {
	dir := t.TempDir()
	origin, err := startOriginAs(context.Background(), dir, "origin", fastOriginEnv)
	require.NoError(t, err)
	defer origin.stop()
	u, _ := url.Parse("http://" + origin.addr)
	proxy := httptest.NewServer(httputil.NewSingleHostReverseProxy(u))
	defer proxy.Close()
	err = checkForwarding(context.Background(), &target{scenario: scenarios[0], addr: strings.TrimPrefix(proxy.URL, "http://")})
	require.Error(t, err)
	for _, want := range []string{
		`X-Forwarded-For "203.0.113.9, 127.0.0.1"`,
		`the client's X-Real-IP "203.0.113.9"`,
		`the client's True-Client-IP`,
		`Forwarded "for=203.0.113.9"`,
		`X-Request-ID "spoofed-id"`,
		`X-Forwarded-Proto "gopher"`,
	} {
		require.ErrorContains(t, err, want)
	}
	// The origin alone is no proxy either: it adds none of the fields.
	err = checkForwarding(context.Background(), &target{scenario: scenarios[0], addr: origin.addr})
	require.ErrorContains(t, err, `origin got X-Forwarded-For "203.0.113.9", want "127.0.0.1"`)
}

// A run whose answers are not its scenario's fails instead of giving a
// figure for something else.
func TestCheckWrkRefusesTheWrongAnswers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sc     scenario
		r      wrkResult
		errMsg string
	}{
		{"proxied, all 2xx", scenarios[0], wrkResult{Requests: 100}, ""},
		{"proxied, one 502", scenarios[0], wrkResult{Requests: 100, Non2xx: 1}, "1 of 100 requests not answered 2xx/3xx"},
		{"socket errors", scenarios[0], wrkResult{Requests: 100, SocketErrors: 3}, "3 socket errors"},
		{"denied, all refused", scenarios[3], wrkResult{Requests: 100, Non2xx: 99}, ""},
		{"denied, half admitted", scenarios[3], wrkResult{Requests: 100, Non2xx: 50}, "only 50 of 100 requests refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkWrk(&target{scenario: tc.sc}, tc.r)
			if tc.errMsg == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tc.errMsg)
			}
		})
	}
}

const wrkReport = `Running 10s test @ http://127.0.0.1:8080/
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.10ms    1.02ms  30.11ms   90.12%
    Req/Sec    15.20k     1.01k   17.30k    70.50%
  Latency Distribution
     50%    1.90ms
     75%    2.40ms
     90%    3.10ms
     99%  812.50us
  302518 requests in 10.00s, 41.26MB read
  Socket errors: connect 1, read 2, write 3, timeout 4
  Non-2xx or 3xx responses: 302000
Requests/sec:  30249.41
Transfer/sec:      4.13MB
`

func TestParseWrk(t *testing.T) {
	r, err := parseWrk(wrkReport)
	require.NoError(t, err)
	require.Equal(t, wrkResult{Requests: 302518, Seconds: 10, PerSecond: 30249.41, P99: 812500 * time.Nanosecond, SocketErrors: 10, Non2xx: 302000}, r)

	r, err = parseWrk(strings.ReplaceAll(wrkReport, "812.50us", "1.02s"))
	require.NoError(t, err)
	require.Equal(t, 1020*time.Millisecond, r.P99)

	for name, tc := range map[string]struct{ report, errMsg string }{
		"no --latency":     {strings.Replace(wrkReport, "     99%  812.50us\n", "", 1), "the 99% latency"},
		"empty":            {"", `no "N requests in T", Requests/sec, the 99% latency`},
		"garbage count":    {strings.Replace(wrkReport, "302518 requests", "3e5x requests", 1), `request count "3e5x"`},
		"garbage latency":  {strings.Replace(wrkReport, "812.50us", "fast", 1), `duration "fast": no unit`},
		"negative latency": {strings.Replace(wrkReport, "812.50us", "-1ms", 1), `duration "-1ms"`},
		"garbage errors":   {strings.Replace(wrkReport, "timeout 4", "timeout", 1), "socket errors"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseWrk(tc.report)
			require.ErrorContains(t, err, tc.errMsg)
		})
	}
}

// The fixed-rate client sends what its schedule says, and a target that
// fails a request fails the run.
func TestFixedRate(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1) }))
	addr := strings.TrimPrefix(srv.URL, "http://")
	p99, err := fixedRate(context.Background(), addr, nil, "/", 200, 1, 500*time.Millisecond)
	require.NoError(t, err)
	require.Positive(t, p99)
	require.Equal(t, int64(100), n.Load())
	srv.Close()
	_, err = fixedRate(context.Background(), addr, nil, "/", 200, 1, 100*time.Millisecond)
	require.ErrorContains(t, err, "request 0 at 200/s")
	_, err = fixedRate(context.Background(), addr, nil, "/", 0, 1, time.Second)
	require.ErrorContains(t, err, "no request to send")
}

// An access log passes when it holds enough JSON lines with a status; a line
// that is not a JSON object, or has no status, fails at once.
func TestAccessLogLines(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for name, tc := range map[string]struct {
		text, errMsg string
		want         int64
	}{
		"enough":     {"{\"status\":200}\n{\"status\":429,\"id\":\"x\"}\n", "", 2},
		"not json":   {"{\"status\":200}\nGET / 200\n", "line 2 is not a JSON object: GET / 200", 1},
		"json array": {"[\"status\":1]\n", "line 1 is not a JSON object", 1},
		"no status":  {"{\"code\":200}\n", "line 1 has no status", 1},
		"empty line": {"{\"status\":200}\n\n", "line 2 is not a JSON object", 1},
	} {
		t.Run(name, func(t *testing.T) {
			f := dir + "/" + strings.ReplaceAll(name, " ", "-") + ".log"
			require.NoError(t, os.WriteFile(f, []byte(tc.text), 0o644))
			n, err := accessLogLines(ctx, f, tc.want)
			if tc.errMsg == "" {
				require.NoError(t, err)
				require.Equal(t, tc.want, n)
			} else {
				require.ErrorContains(t, err, tc.errMsg)
			}
		})
	}
}
