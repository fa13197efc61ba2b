package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/problem"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// slowArrived receives once per /slow or /hold request the test origin
// starts serving.
var slowArrived = make(chan struct{}, 100)

// holdRelease answers one /hold request the test origin holds (each gives
// up after a minute, so a failed test leaves nothing behind).
var holdRelease = make(chan struct{})

// testOrigin is a real origin on loopback: /slow?ms=N sleeps, /hold waits
// for holdRelease, everything else echoes what the edge forwarded.
func testOrigin(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/slow" {
			select {
			case slowArrived <- struct{}{}:
			default:
			}
			ms, _ := strconv.Atoi(string(ctx.QueryArgs().Peek("ms")))
			time.Sleep(time.Duration(ms) * time.Millisecond) // kept: the origin's service time is the subject
		}
		if string(ctx.Path()) == "/hold" {
			select {
			case slowArrived <- struct{}{}:
			default:
			}
			select {
			case <-holdRelease:
			case <-time.After(time.Minute):
			}
		}
		if string(ctx.Path()) == "/status" { // /status?code=401&cost=3&set=X-A: that status, an X-Cost header, X-A: 1
			code, _ := strconv.Atoi(string(ctx.QueryArgs().Peek("code")))
			ctx.SetStatusCode(code)
			for _, name := range ctx.QueryArgs().PeekMulti("set") {
				ctx.Response.Header.Set(string(name), "1")
			}
			if c := ctx.QueryArgs().Peek("cost"); c != nil {
				ctx.Response.Header.SetBytesV("X-Cost", c)
			}
			return
		}
		ctx.SetContentType("application/json")
		var keys []string
		for _, v := range ctx.Request.Header.PeekAll("X-Api-Key") {
			keys = append(keys, string(v))
		}
		var all strings.Builder
		for k, v := range ctx.Request.Header.All() {
			all.WriteString(string(k) + ": " + string(v) + "\n")
		}
		body, _ := json.Marshal(map[string]string{
			"uri":     string(ctx.Request.Header.RequestURI()),
			"headers": all.String(),
			"fwd":     string(ctx.Request.Header.Peek("Forwarded")),
			"proto":   string(ctx.Request.Header.Peek("X-Forwarded-Proto")),
			"path":    string(ctx.Path()),
			"host":    string(ctx.Request.Header.Host()),
			"xff":     string(ctx.Request.Header.Peek("X-Forwarded-For")),
			"rid":     string(ctx.Request.Header.Peek("X-Request-ID")),
			"keys":    strings.Join(keys, "|"),
			"method":  string(ctx.Method()),
			"body":    strconv.Itoa(len(ctx.Request.Body())),
		})
		ctx.SetBody(body)
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

type running struct {
	*Edge
	stop    func() // cancels Run and waits for it
	done    chan error
	stopErr error // what Run returned, once stop returned
}

func startEdge(t *testing.T, rulesYAML string, mutate func(*config.Config)) *running {
	t.Helper()
	return startEdgeBefore(t, rulesYAML, mutate, nil)
}

// startEdgeBefore is startEdge calling before, when set, on the edge built
// and not yet running.
func startEdgeBefore(t *testing.T, rulesYAML string, mutate func(*config.Config), before func(*Edge)) *running {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Origins = []string{testOrigin(t)}
	cfg.DrainDelay = 0
	cfg.AdminToken = testAdminToken
	cfg.Rules = filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(cfg.Rules, []byte(rulesYAML), 0o600))
	if mutate != nil {
		mutate(&cfg)
	}
	e, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	if before != nil {
		before(e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Edge: e, done: make(chan error, 1)}
	go func() { r.done <- e.Run(ctx) }()
	var once sync.Once
	r.stop = func() { once.Do(func() { cancel(); r.stopErr = <-r.done }) }
	t.Cleanup(r.stop)
	return r
}

func (r *running) get(t *testing.T, path string, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+r.Addr()+path, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func codes(t *testing.T, r *running, n int, path string, headers ...string) []int {
	var out []int
	for range n {
		resp := r.get(t, path, headers...)
		_, _ = io.Copy(io.Discard, resp.Body)
		out = append(out, resp.StatusCode)
	}
	return out
}

const perIP = `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_log
    limit: 3
    window: 1m
    metrics: true
`

func TestDeniedResponseFields(t *testing.T) {
	r := startEdge(t, perIP, nil)
	resp := r.get(t, "/")
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, `"per-ip";q=3;w=60`, resp.Header.Get("RateLimit-Policy"))
	require.Equal(t, `"per-ip";r=2;t=60`, resp.Header.Get("RateLimit"))
	require.Empty(t, resp.Header.Get("X-RateLimit-Limit"), "legacy fields are opt-in")
	require.Equal(t, []int{200, 200, 429}, codes(t, r, 3, "/"))

	resp = r.get(t, "/")
	require.Equal(t, 429, resp.StatusCode)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, retry, 59, "never earlier than the oldest entry leaves the window")
	require.LessOrEqual(t, retry, 60)
	require.Equal(t, `"per-ip";r=0;t=60`, resp.Header.Get("RateLimit"))
	var p problem.Problem
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
	require.Equal(t, problem.QuotaExceeded, p.Type)
	require.Equal(t, 429, p.Status)
	require.Equal(t, []string{"per-ip"}, p.Violated)
}

func TestLegacyHeadersOptIn(t *testing.T) {
	r := startEdge(t, perIP, func(c *config.Config) { c.LegacyHeaders = true })
	resp := r.get(t, "/")
	require.Equal(t, "3", resp.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "2", resp.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, "60", resp.Header.Get("X-RateLimit-Reset"))
}

func TestSpoofedForwardedForIgnored(t *testing.T) {
	r := startEdge(t, perIP, nil) // 127.0.0.1 is not a trusted proxy
	var got []int
	for i := range 4 {
		resp := r.get(t, "/", "X-Forwarded-For", "203.0.113."+strconv.Itoa(i))
		got = append(got, resp.StatusCode)
		if i == 0 {
			var echo map[string]string
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&echo))
			require.Equal(t, "127.0.0.1", echo["xff"], "the client's own XFF is dropped, the socket peer appended")
		}
	}
	require.Equal(t, []int{200, 200, 200, 429}, got, "one client, whatever it claims")
}

// TestOriginCannotSayNotProcessed: the field that tells a client its
// request never reached an origin is the edge's word alone; an origin's,
// in any case, is dropped, and the origin's other fields pass.
func TestOriginCannotSayNotProcessed(t *testing.T) {
	r := startEdge(t, noRules, nil)
	for _, name := range []string{problem.NotProcessed, strings.ToLower(problem.NotProcessed), strings.ToUpper(problem.NotProcessed)} {
		resp := r.get(t, "/status?code=200&set=X-Other&set="+name)
		require.Equal(t, http.StatusOK, resp.StatusCode, name)
		require.Equal(t, "1", resp.Header.Get("X-Other"), name)
		require.Empty(t, resp.Header.Values(problem.NotProcessed), name)
	}
}

func TestTrustedProxyHopHonoured(t *testing.T) {
	r := startEdge(t, perIP, func(c *config.Config) {
		c.TrustedProxies = append(c.TrustedProxies, mustPrefix("127.0.0.1/32"))
	})
	for _, client := range []string{"203.0.113.1", "203.0.113.2"} {
		require.Equal(t, []int{200, 200, 200, 429}, codes(t, r, 4, "/", "X-Forwarded-For", "6.6.6.6, "+client), client)
	}
	resp := r.get(t, "/", "X-Forwarded-For", "203.0.113.3", "X-Request-ID", "trace-42")
	var echo map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&echo))
	require.Equal(t, "203.0.113.3, 127.0.0.1", echo["xff"])
	require.Equal(t, "trace-42", echo["rid"], "a trusted proxy's request id is kept")
}

func TestPathNormalizationCannotSidestepPrefix(t *testing.T) {
	r := startEdge(t, `
version: 1
rules:
  - id: admin
    match: {path_prefix: ["/admin"]}
    key: [ip]
    algorithm: sliding_log
    limit: 1
    window: 1h
`, nil)
	require.Equal(t, 200, r.get(t, "/admin").StatusCode)
	for _, p := range []string{"//admin", "/%2Fadmin", "/%61dmin", "/x/../admin", "/admin/deeper"} {
		require.Equal(t, 429, r.get(t, p).StatusCode, p)
	}
	require.Equal(t, 200, r.get(t, "/administrator").StatusCode, "segment boundary: not the /admin prefix")
}

func TestShadowRuleCountsButNeverDenies(t *testing.T) {
	r := startEdge(t, `
version: 1
rules:
  - id: trial
    key: [ip]
    algorithm: sliding_log
    limit: 1
    window: 1h
    shadow: true
    metrics: true
`, nil)
	for range 3 {
		resp := r.get(t, "/")
		require.Equal(t, 200, resp.StatusCode)
		require.Empty(t, resp.Header.Get("RateLimit-Policy"), "shadow rules never appear in headers")
	}
	m := scrape(t, r)
	require.Contains(t, m, `edgeguard_edge_decisions_total{decision="allowed",reason="memory",rule="trial"} 1`)
	require.Contains(t, m, `edgeguard_edge_decisions_total{decision="shadow_denied",reason="memory",rule="trial"} 2`)
}

func scrape(t *testing.T, r *running) string {
	resp, err := http.Get("http://" + r.AdminAddr() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

const oneSlot = `
version: 1
rules:
  - id: one-at-a-time
    key: [ip]
    algorithm: concurrency
    limit: 1
    window: 1m
`

func TestConcurrencySlotReleased(t *testing.T) {
	// The slot is held while the origin holds the request: until the test
	// releases it, at the default header timeout, so no machine is slow
	// enough to release it early.
	r := startEdge(t, oneSlot, nil)
	t.Run("on completion", func(t *testing.T) {
		require.Equal(t, []int{200, 200, 200}, codes(t, r, 3, "/"))
	})
	t.Run("while held", func(t *testing.T) {
		held := make(chan int)
		for len(slowArrived) > 0 {
			<-slowArrived
		}
		go func() {
			defer close(held)
			resp, err := http.Get("http://" + r.Addr() + "/hold")
			if err == nil {
				resp.Body.Close()
				held <- resp.StatusCode
			}
		}()
		select { // the held request holds the slot at the origin
		case <-slowArrived:
		case code := <-held:
			t.Fatalf("the held request was answered %d before it reached the origin", code)
		}
		require.Equal(t, 429, r.get(t, "/").StatusCode, "a second request while the slot is held")
		holdRelease <- struct{}{}
		require.Equal(t, 200, <-held)
		require.Equal(t, 200, r.get(t, "/").StatusCode)
	})
	t.Run("on origin timeout", func(t *testing.T) {
		// An origin that never answers within the header timeout: the 504
		// gives the slot back.
		r := startEdge(t, oneSlot, func(c *config.Config) { c.OriginHeaderTimeout = 300 * time.Millisecond })
		for len(slowArrived) > 0 {
			<-slowArrived
		}
		require.Equal(t, 504, r.get(t, "/hold").StatusCode)
		require.Len(t, slowArrived, 1, "the 504 is the origin's silence")
		<-slowArrived
		holdRelease <- struct{}{} // the origin lets the abandoned request go
		require.Equal(t, 200, r.get(t, "/").StatusCode, "the slot came back with the 504")
	})
}

func TestOversizedHeadersRejected(t *testing.T) {
	r := startEdge(t, perIP, func(c *config.Config) { c.MaxHeaderBytes = 4096 })
	resp := r.get(t, "/", "X-Big", strings.Repeat("a", 8000))
	require.Equal(t, 431, resp.StatusCode)
}

func TestInvalidRulesRefuseToStart(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.DemoOrigin = true
	cfg.Rules = filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(cfg.Rules, []byte("version: 1\nrules:\n  - id: broken\n    key: [ip]\n    algorithm: sliding_log\n    limit: 0\n    window: 1m\n"), 0o600))
	_, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.ErrorContains(t, err, `rule "broken": limit`)
}

// The slot is held until the origin's response header (a streamed body
// does not hold it), so the header timeout is what it must outlive.
func TestConcurrencySlotMustOutliveOriginHeaderTimeout(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.DemoOrigin = true
	cfg.OriginHeaderTimeout = 2 * time.Minute
	cfg.Rules = filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(cfg.Rules, []byte(oneSlot), 0o600))
	_, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.ErrorContains(t, err, `rule "one-at-a-time": window: a concurrency slot's TTL (1m0s) must exceed --origin-header-timeout (2m0s)`)
}

// testAdminToken is the admin token of the tests' edges.
const testAdminToken = "test-admin-token"

// adminGet is GET path on the admin port with the given Authorization.
func adminGet(t *testing.T, r *running, path, auth string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+r.AdminAddr()+path, nil)
	require.NoError(t, err)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

func TestAdminEndpointsOnlyOnAdminPort(t *testing.T) {
	r := startEdge(t, perIP, func(c *config.Config) { c.Pprof = true })
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/debug/rules": `"per-ip"`, "/metrics": "edgeguard_edge_ready", "/debug/pprof/": "goroutine"} {
		code, b := adminGet(t, r, path, "Bearer "+testAdminToken)
		require.Equal(t, 200, code, path)
		require.Contains(t, b, want, path)
	}
	resp := r.get(t, "/metrics")
	b, _ := io.ReadAll(resp.Body)
	require.NotContains(t, string(b), "edgeguard_", "the public port proxies /metrics to the origin")
}

// The admin port is safe to expose inside a PoP: /debug needs the token
// (none configured: off), pprof is off unless asked for, and the command
// line is never served.
func TestAdminDebugNeedsToken(t *testing.T) {
	r := startEdge(t, perIP, nil)
	for _, path := range []string{"/debug/rules", "/debug/clients?api_key=k", "/debug/pprof/"} {
		code, _ := adminGet(t, r, path, "")
		require.Equal(t, http.StatusUnauthorized, code, path)
		code, _ = adminGet(t, r, path, "Bearer wrong-"+testAdminToken)
		require.Equal(t, http.StatusUnauthorized, code, path)
	}
	code, _ := adminGet(t, r, "/debug/rules", "Bearer "+testAdminToken)
	require.Equal(t, http.StatusOK, code)
	code, _ = adminGet(t, r, "/debug/pprof/", "Bearer "+testAdminToken)
	require.Equal(t, http.StatusNotFound, code, "pprof is off by default")
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		code, _ = adminGet(t, r, path, "")
		require.Equal(t, http.StatusOK, code, "%s stays open for scrapers and load balancers", path)
	}

	noToken := startEdge(t, perIP, func(c *config.Config) { c.AdminToken, c.Pprof = "", true })
	for _, path := range []string{"/debug/rules", "/debug/pprof/cmdline", "/debug/pprof/"} {
		code, body := adminGet(t, noToken, path, "Bearer ")
		require.Equal(t, http.StatusForbidden, code, path)
		require.Contains(t, body, "EDGEGUARD_ADMIN_TOKEN")
	}
	withPprof := startEdge(t, perIP, func(c *config.Config) { c.Pprof = true })
	code, _ = adminGet(t, withPprof, "/debug/pprof/cmdline", "Bearer "+testAdminToken)
	require.Equal(t, http.StatusNotFound, code, "the command line is never served")
}

func TestGracefulShutdownFinishesInFlight(t *testing.T) {
	r := startEdge(t, perIP, func(c *config.Config) { c.DrainDelay = 200 * time.Millisecond })
	type result struct {
		code int
		err  error
	}
	inflight := make(chan result, 1)
	for len(slowArrived) > 0 {
		<-slowArrived
	}
	go func() {
		resp, err := http.Get("http://" + r.Addr() + "/slow?ms=400")
		if err != nil {
			inflight <- result{err: err}
			return
		}
		resp.Body.Close()
		inflight <- result{code: resp.StatusCode}
	}()
	<-slowArrived // it reached the origin
	stopped := make(chan struct{})
	go func() { r.stop(); close(stopped) }()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + r.AdminAddr() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 503
	}, time.Second, 5*time.Millisecond, "/readyz turns 503 while draining")
	res := <-inflight
	require.NoError(t, res.err)
	require.Equal(t, 200, res.code)
	<-stopped
	require.NoError(t, r.stopErr)
}

func TestFailModesWithRedisDown(t *testing.T) {
	dead := "redis://" + testenv.ClosedAddr(t)
	for mode, want := range map[string]int{"fallback": 200, "open": 200, "closed": 503} {
		t.Run(mode, func(t *testing.T) {
			r := startEdge(t, perIP, func(c *config.Config) {
				c.Redis = dead
				c.KeySalt = "a-salt-of-16-chars"
				c.FailMode = limiterFailMode(t, mode)
			})
			resp := r.get(t, "/")
			require.Equal(t, want, resp.StatusCode)
			if want == 503 {
				require.NotEmpty(t, resp.Header.Get("Retry-After"))
				require.Equal(t, "1", resp.Header.Get(problem.NotProcessed), "refused before the origin: safe to retry")
				var p problem.Problem
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
				require.Equal(t, problem.ReducedCapacity, p.Type)
			}
		})
	}
}

// Against a real Redis, with and without go-redis's autopipelining, the
// limit holds exactly and decisions are Redis's.
func TestRedisStoreWithAndWithoutAutopipeline(t *testing.T) {
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	defer rd.Close()
	for _, ap := range []bool{false, true} {
		t.Run(fmt.Sprintf("autopipeline=%t", ap), func(t *testing.T) {
			r := startEdge(t, perIP, func(c *config.Config) {
				c.Redis, c.RedisAutopipeline = rd.URL(), ap
				c.RedisTimeout = time.Second
				c.KeySalt = t.Name() // fresh keys per run
			})
			require.Equal(t, []int{200, 200, 200, 429, 429}, codes(t, r, 5, "/"))
			m := scrape(t, r)
			require.Contains(t, m, `edgeguard_edge_decisions_total{decision="allowed",reason="redis",rule="per-ip"} 3`)
			require.Contains(t, m, `edgeguard_edge_decisions_total{decision="denied",reason="redis",rule="per-ip"} 1`)
			require.Contains(t, m, `edgeguard_edge_decisions_total{decision="denied",reason="prefilter",rule="per-ip"} 1`)
		})
	}
}
