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
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

var remainingRE = regexp.MustCompile(`;r=(\d+);`)

func behaviourRules(mode string) string {
	section := ""
	if mode != "" {
		section = "behaviour:\n  mode: " + mode + "\n"
	}
	return "version: 1\n" + section + `rules:
  - {id: per-ip, key: [ip], algorithm: fixed_window, limit: 1000000000, window: 1h, behaviour: true}
`
}

// debugMode is the mode /debug/clients reports.
func debugMode(t *testing.T, r *running) string {
	t.Helper()
	code, resp := adminGet(t, r, "/debug/clients?ip=192.0.2.1", "Bearer "+testAdminToken)
	require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, code, "an unknown client is 404, with the mode: %s", resp)
	var d struct{ Mode string }
	require.NoError(t, json.Unmarshal([]byte(resp), &d))
	return d.Mode
}

// The behaviour section arrives through Consul like the rest of the rules
// and changes the layer live: shadow, enforce, and off once a document has
// no section.
func TestBehaviourFromConsulLive(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	r := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), filepath.Join(t.TempDir(), "cache.yaml"))
	for _, mode := range []string{"shadow", "enforce", ""} {
		doc := behaviourRules(mode)
		file := filepath.Join(t.TempDir(), "global.yaml")
		require.NoError(t, os.WriteFile(file, []byte(doc), 0o600))
		out, code := regionctlRun(t, "--consul", c.HTTPAddr(), "rules", "push", "--region", "eu-west", "--global", file)
		require.Equal(t, 0, code, out)
		waitVersion(t, r, effectiveVersion(t, doc, ""), time.Now())
		want := mode
		if want == "" {
			want = "off"
		}
		// The layer learns the rules just after they are swapped in
		// (SetRules): the mode is waited for, not read at the swap.
		err := proc.PollEvery(testenv.Within(t, 10*time.Second), 10*time.Millisecond, "behaviour mode "+want, func(context.Context) error {
			if got := debugMode(t, r); got != want {
				return fmt.Errorf("mode %s", got)
			}
			return nil
		})
		require.NoError(t, err)
	}
}

// Without Redis the layer scores from what the edge sees, and says so.
func TestBehaviourLocalOnly(t *testing.T) {
	r := startEdge(t, behaviourRules("enforce"), nil)
	first := 0
	for i := range 80 {
		resp := r.get(t, fmt.Sprintf("/scan/%d", i))
		_, _ = io.Copy(io.Discard, resp.Body)
		m := remainingRE.FindStringSubmatch(resp.Header.Get("RateLimit"))
		require.NotNil(t, m, resp.Header.Get("RateLimit"))
		if n, _ := strconv.ParseInt(m[1], 10, 64); n < 100_000_000 && first == 0 { // 1e9 × 0.1: suspicious
			first = i + 1
		}
	}
	require.Equal(t, 49, first, "suspicious from the 48th distinct route, the request after")
	require.Equal(t, 1.0, metricValue(t, r, "edgeguard_behaviour_local_only"))
	require.Positive(t, metricSum(t, r, "edgeguard_behaviour_actions_total", "action", "tightened"))
}

// counters reads the edge's counters behind round trips per request.
type counters struct{ takes, flushes, rides, requests float64 }

func readCounters(t *testing.T, r *running) counters {
	return counters{
		takes:    histCount(t, r, "edgeguard_limiter_store_call_duration_seconds"),
		flushes:  metricSum(t, r, "edgeguard_behaviour_flushes_total"),
		rides:    metricSum(t, r, "edgeguard_behaviour_updates_total", "path", "ride"),
		requests: metricSum(t, r, "edgeguard_edge_requests_total"),
	}
}

// histCount is the number of observations of a histogram.
func histCount(t *testing.T, r *running, name string) float64 {
	s := scrape(t, r)
	total := 0.0
	for line := range strings.Lines(s) {
		if strings.HasPrefix(line, name+"_count") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			require.NoError(t, err)
			total += v
		}
	}
	return total
}

func evalshaCalls(t *testing.T, addr string) int64 {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			n, err := strconv.ParseInt(strings.SplitN(v, ",", 2)[0], 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	return 0
}

// TestRoundTripsPerRequest: the layer adds no round trip. Each request is
// one Take (one pipeline, one round trip) with and without the layer; its
// signal update is a second script call in that same pipeline
// (INFO commandstats: 1 EVALSHA per request without the layer, 2 with),
// and nothing waits for a flush.
func TestRoundTripsPerRequest(t *testing.T) {
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	defer rd.Close()
	const n = 300
	for _, tc := range []struct {
		mode      string
		ap        bool
		perReq    float64 // EVALSHA per request
		ridesPerN float64
	}{
		{"", false, 1, 0}, {"enforce", false, 2, 1}, {"", true, 1, 0}, {"enforce", true, 2, 1},
	} {
		t.Run(fmt.Sprintf("layer=%q autopipeline=%t", tc.mode, tc.ap), func(t *testing.T) {
			r := startEdge(t, behaviourRules(tc.mode), func(c *config.Config) {
				c.Redis, c.RedisAutopipeline, c.RedisTimeout = rd.URL(), tc.ap, time.Second
				c.KeySalt = testenv.KeyPrefix(t)
			})
			resp := r.get(t, "/warm") // scripts loaded, connections up
			_, _ = io.Copy(io.Discard, resp.Body)
			before, calls := readCounters(t, r), evalshaCalls(t, rd.Addr)
			for i := range n {
				resp := r.get(t, fmt.Sprintf("/p/%d", i%20), "X-Forwarded-For", "192.0.2.7")
				_, _ = io.Copy(io.Discard, resp.Body)
				require.Equal(t, 200, resp.StatusCode)
			}
			after, calls2 := readCounters(t, r), evalshaCalls(t, rd.Addr)
			reqs := after.requests - before.requests
			trips := (after.takes - before.takes) + (after.flushes - before.flushes)
			t.Logf("%v requests: %.2f round trips per request (Takes %v, flushes %v), %.2f EVALSHA per request, %v signal updates rode",
				reqs, trips/reqs, after.takes-before.takes, after.flushes-before.flushes, float64(calls2-calls)/reqs, after.rides-before.rides)
			require.Equal(t, float64(n), reqs)
			require.Equal(t, 1.0, trips/reqs)
			require.Equal(t, tc.perReq, float64(calls2-calls)/reqs)
			require.Equal(t, tc.ridesPerN*n, after.rides-before.rides)
		})
	}
}

// BenchmarkHandlerBehaviour measures the request handler (identify, match,
// limit against real Redis, proxy to a loopback origin) with the layer off
// and on (enforce; every request rides its signal update). The two edges
// take requests alternately within one loop, so both see the same load on
// a busy host: compare on-ns/req with off-ns/req (and on/off) of one run,
// over -count=10. allocs/req are counted with testing.AllocsPerRun.
func BenchmarkHandlerBehaviour(b *testing.B) {
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(b, err)
	defer rd.Close()
	edges := [2]*Edge{benchEdge(b, behaviourRules(""), rd.URL()), benchEdge(b, behaviourRules("enforce"), rd.URL())}
	offOn(b, edges, benchRequests(b, 1))
}

// benchRequests returns a function that sends one GET through an edge's
// handler, from one of 1,024 client addresses in 10.subnet.0.0/16 in turn,
// and fails the benchmark unless it is answered 200.
func benchRequests(b *testing.B, subnet byte) func(e *Edge) {
	addrs := make([]net.Addr, 1024)
	for i := range addrs {
		addrs[i] = &net.TCPAddr{IP: net.IPv4(10, subnet, byte(i>>8), byte(i)), Port: 40000}
	}
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	i := 0
	return func(e *Edge) {
		req.Reset()
		req.SetRequestURI("http://bench.test/p/" + strconv.Itoa(i%20))
		ctx.Init(&req, addrs[i%len(addrs)], nil)
		e.pipe.Handle(&ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
		i++
	}
}

// offOn measures a feature's cost: the edge with it off (edges[0]) and the
// edge with it on take requests alternately within one loop, so both see
// the same load on a busy host; it reports each one's ns/req (their
// difference as added-ns/req, and on/off)
// and allocs/req (testing.AllocsPerRun). Compare within one run, over
// -count=10.
func offOn(b *testing.B, edges [2]*Edge, one func(e *Edge)) {
	var allocs [2]float64
	for k, e := range edges {
		allocs[k] = testing.AllocsPerRun(200, func() { one(e) })
	}
	var took [2]time.Duration
	b.ResetTimer()
	for b.Loop() {
		for k, e := range edges {
			start := time.Now()
			one(e)
			took[k] += time.Since(start)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(took[0].Nanoseconds())/n, "off-ns/req")
	b.ReportMetric(float64(took[1].Nanoseconds())/n, "on-ns/req")
	b.ReportMetric(float64((took[1]-took[0]).Nanoseconds())/n, "added-ns/req")
	b.ReportMetric(float64(took[1])/float64(took[0]), "on/off")
	b.ReportMetric(allocs[0], "off-allocs/req")
	b.ReportMetric(allocs[1], "on-allocs/req")
}

func benchEdge(b *testing.B, rulesYAML, redisURL string) *Edge {
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Origins = []string{benchOrigin(b)}
	cfg.Rules = filepath.Join(b.TempDir(), "rules.yaml")
	require.NoError(b, os.WriteFile(cfg.Rules, []byte(rulesYAML), 0o600))
	cfg.Redis, cfg.KeySalt, cfg.RedisTimeout = redisURL, "bench-salt-"+strconv.FormatInt(time.Now().UnixNano(), 10), time.Second
	e, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	return e
}

// benchOrigin answers 200 "ok" on loopback.
func benchOrigin(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}
