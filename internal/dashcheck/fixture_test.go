package dashcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	consulapi "github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/promtext"
	regionctlcmd "github.com/edgeguard/edgeguard/internal/regionctl"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// The fixture: one region ("dc-test") with two PoPs of one edge each,
// started from the real binary with a real Redis, its exporter, and a real
// Prometheus scraping them every second with the repository's rules loaded.
const (
	regionName     = "dc-test"
	scrapeInterval = time.Second
	redisPassword  = "dashcheck-secret"
	// countWindow is the range the counted values are read over.
	countWindow = 15 * time.Second
)

const rulesYAML = `version: 1
rules:
  - id: per-client
    match:
      path_prefix: ["/api"]
    key: [ip]
    algorithm: fixed_window
    limit: 5
    window: 10m
    metrics: true
  - id: shadow-trial
    match:
      path_prefix: ["/shadow"]
    key: [ip]
    algorithm: fixed_window
    limit: 2
    window: 10m
    shadow: true
    metrics: true
  - id: escapes
    match:
      path_prefix: ["/escape"]
    key: [ip]
    algorithm: fixed_window
    limit: 1000000
    window: 10m
    metrics: true
    limit_header: X-Edge-Limit
    bypass:
      path_prefix: ["/escape/open"]
  - id: outage
    match:
      path_prefix: ["/outage"]
    key: [ip]
    algorithm: fixed_window
    limit: 5
    window: 10m
  - id: hot-key
    match:
      path_prefix: ["/burst"]
    key: [ip]
    algorithm: fixed_window
    limit: 1000000
    window: 10m
  - id: leased
    match:
      path_prefix: ["/leased"]
    key: [ip]
    algorithm: fixed_window
    limit: 1000
    window: 4s
    accuracy: leased
  - id: global
    match:
      path_prefix: ["/global"]
    key: [ip]
    algorithm: fixed_window
    limit: 1000
    window: 4s
    scope: global
`

// What the counted scenario drives, and the panels must report.
const (
	wantDenied   = 7
	wantShadow   = 4
	wantCritical = 10
	wantRejected = 2
	wantBypass   = 6
)

// A short ramp so overload sheds within seconds.
var shedderSettings = []string{"good=0.5", "bad=0.6", "start_after=1s", "full_after=3s", "smoothing=100ms",
	"share_window=1s", "queue_size=2", "queue_timeout=30ms"}

// regionctl runs the operator CLI in-process against the fixture's Consul.
func regionctl(t *testing.T, consul string, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	code := regionctlcmd.Main(append([]string{"--consul", consul}, args...), func(string) string { return "" }, &out, &out)
	require.Zero(t, code, "regionctl %v: %s", args, out.String())
	return out.String()
}

type edgeProc struct {
	pop, addr, admin string
	rls              string // Envoy's rate limit service (gRPC)
	cmd              *exec.Cmd
	out              *strings.Builder
	mu               sync.Mutex
}

type phase struct {
	name       string
	start, end time.Time
}

// repoRoot is the module's root: go test runs a test binary in its
// package's directory (a source path from runtime.Caller is no path on
// disk in a -trimpath build).
func repoRoot(t *testing.T) string {
	wd, err := os.Getwd()
	require.NoError(t, err)
	return filepath.Join(wd, "..", "..")
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// startEdgeProc starts an edge of the region taking its rules and shedder
// settings from the region's Consul datacenter, as deployed edges do.
func startEdgeProc(t *testing.T, bin, pop, origin, redisURL, consul string) *edgeProc {
	dir := t.TempDir()
	e := &edgeProc{pop: pop, out: &strings.Builder{}}
	e.addr, e.admin, e.rls = freePort(t), freePort(t), freePort(t)
	e.cmd = exec.Command(bin,
		"--listen", e.addr, "--admin", e.admin,
		"--rls-listen", e.rls,
		"--region", regionName, "--pop", pop,
		"--origin", origin,
		// The default --redis-timeout (250 ms): the phases that pause
		// Redis last as long as their pause, however long each call waits.
		// A stall of a busy machine is under it; fallback counts are still
		// read against their value before a phase.
		"--consul", consul, "--rules-cache", filepath.Join(dir, "rules-cache.json"),
		"--workers", "4",
		"--trusted-proxies", "127.0.0.1/32",
		"--drain-delay", "0",
	)
	// Secrets in the environment, as the edge requires: the region's salt
	// (one per region, as deployed) and the Redis URL, which carries a password.
	e.cmd.Env = append(os.Environ(), "EDGEGUARD_KEY_SALT=dashcheck-region-salt", "EDGEGUARD_REDIS="+redisURL)
	w := lockedWriter{&e.mu, e.out}
	e.cmd.Stdout, e.cmd.Stderr = w, w
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	require.NoError(t, e.cmd.Start())
	exited := make(chan struct{})
	go func() { _ = e.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			e.mu.Lock()
			t.Logf("--- edge %s output ---\n%s", pop, tail(e.out.String(), 30))
			e.mu.Unlock()
		}
	})
	c := &http.Client{Timeout: time.Second}
	err := proc.PollEvery(testenv.Within(t, 30*time.Second), 20*time.Millisecond, "edge "+pop+" ready", func(context.Context) error {
		resp, err := c.Get("http://" + e.admin + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz answered %d", resp.StatusCode)
		}
		return nil
	})
	require.NoError(t, err)
	return e
}

// rlsYAML is the region's rate limit service document: 2 calls per user
// and hour.
const rlsYAML = `domain: dashcheck
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
`

// askRLS makes n ShouldRateLimit calls for user through e's rate limit
// service and returns their overall codes.
func askRLS(t *testing.T, e *edgeProc, user string, n int) []string {
	t.Helper()
	conn, err := grpc.NewClient(e.rls, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var codes []string
	for range n {
		resp, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "dashcheck",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
		require.NoError(t, err)
		codes = append(codes, resp.OverallCode.String())
	}
	return codes
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128}}

// send makes one request through an edge as client ip (the edge trusts the
// loopback peer's X-Forwarded-For) and returns the status code (0 on a
// transport error).
func send(e *edgeProc, path, ip, priority string) int {
	req, _ := http.NewRequest(http.MethodGet, "http://"+e.addr+path, nil)
	req.Header.Set("X-Forwarded-For", ip)
	if priority != "" {
		req.Header.Set("X-Priority", priority)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// sendEscapes sends n bypassed requests and n with an invalid limit header
// (both counted by edgeguard_edge_escapes_total) and returns the statuses.
func sendEscapes(e *edgeProc, n int, ip string) map[int]int {
	got := map[int]int{}
	for range n {
		got[send(e, "/escape/open", ip, "")]++
		req, _ := http.NewRequest(http.MethodGet, "http://"+e.addr+"/escape", nil)
		req.Header.Set("X-Forwarded-For", ip)
		req.Header.Set("X-Edge-Limit", "NaN")
		resp, err := client.Do(req)
		if err != nil {
			got[0]++
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got[resp.StatusCode]++
	}
	return got
}

func sendN(t *testing.T, e *edgeProc, n int, path, ip, priority string) map[int]int {
	got := map[int]int{}
	for range n {
		got[send(e, path, ip, priority)]++
	}
	return got
}

// promValue is the value of an instant query returning one series.
func promValue(ctx context.Context, p promv1.API, q string, at time.Time) (float64, error) {
	v, _, _, err := p.Query(ctx, q, at)
	if err != nil {
		return 0, err
	}
	vec, ok := v.(model.Vector)
	if !ok || len(vec) != 1 {
		return 0, fmt.Errorf("%s: want one series, got %v", q, v)
	}
	return float64(vec[0].Value), nil
}

// waitProm polls until q returns one series of value want.
func waitProm(t *testing.T, p promv1.API, q string, want float64) {
	t.Helper()
	waitPromValue(t, p, q, fmt.Sprintf("%s = %v", q, want), func(v float64) bool { return v == want })
}

// waitPromAtLeast polls until q returns one series of value min or more.
func waitPromAtLeast(t *testing.T, p promv1.API, q string, min float64) {
	t.Helper()
	waitPromValue(t, p, q, fmt.Sprintf("%s >= %v", q, min), func(v float64) bool { return v >= min })
}

// waitPromValue polls q until it returns one series whose value is ok; a
// failure names what was awaited and the last answer.
func waitPromValue(t *testing.T, p promv1.API, q, what string, ok func(float64) bool) {
	t.Helper()
	err := proc.PollEvery(testenv.Within(t, 30*time.Second), 100*time.Millisecond, what, func(ctx context.Context) error {
		v, err := promValue(ctx, p, q, time.Now())
		if err != nil {
			return err
		}
		if !ok(v) {
			return fmt.Errorf("%s is %v", q, v)
		}
		return nil
	})
	require.NoError(t, err)
}

// scrape reads the metrics an admin listener at addr serves now.
func scrape(t *testing.T, addr string) promtext.Families {
	f, err := promtext.Scrape(context.Background(), http.DefaultClient, "http://"+addr+"/metrics")
	require.NoError(t, err)
	return f
}

func metricFamilies(t *testing.T, addr string) map[string]bool {
	out := map[string]bool{}
	for name := range scrape(t, addr) {
		out[name] = true
	}
	return out
}

// counterSum is the sum of counter name's series on the edge at addr
// now, 0 while it has none.
func counterSum(t *testing.T, addr, name string) float64 {
	return promtext.Sum(scrape(t, addr), name)
}

// dashFixture is what the scenarios run against: two edges (ams, fra) of
// one region behind an origin, with the region's Redis and its exporter,
// a second region's Redis (away) homing global keys, Consul, and a
// Prometheus scraping them all and evaluating the alert rules.
type dashFixture struct {
	rd, away       *testenv.Standalone
	exp            *testenv.RedisExporter
	consul         *testenv.Consul
	cc             *consulapi.Client
	regionRulesKey string
	ams, fra       *edgeProc
	origin         string // the origin's URL
	prom           *testenv.Prometheus
	p              promv1.API
}

func startDashFixture(t *testing.T, rulesPath string) *dashFixture {
	// The edge builds (the linker, mostly) while the servers start.
	bin := filepath.Join(t.TempDir(), "edge")
	var buildErr error
	built := make(chan struct{})
	go func() {
		defer close(built)
		if err := testenv.BuildEdge(bin); err != nil {
			buildErr = fmt.Errorf("building the edge: %w", err)
		}
	}()
	t.Cleanup(func() { <-built }) // no build outlives the test (nor writes into its removed temp dir)

	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{Password: redisPassword})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rd.Close() })
	exp, err := testenv.StartRedisExporter(rd.Addr, redisPassword)
	require.NoError(t, err)
	t.Cleanup(func() { _ = exp.Close() })

	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			time.Sleep(200 * time.Millisecond) // kept: the origin's service time is the subject
		case "/broken":
			// The connection drops without a response: an origin error.
			if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
				c.Close()
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(origin.Close)

	consul, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: regionName})
	require.NoError(t, err)
	t.Cleanup(func() { _ = consul.Close() })
	cc, err := consul.Client("")
	require.NoError(t, err)
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(rulesFile, []byte(rulesYAML), 0o600))
	regionctl(t, consul.HTTPAddr(), "rules", "push", "--region", regionName, rulesFile)
	regionctl(t, consul.HTTPAddr(), append([]string{"shedder", "set", "--region", regionName}, shedderSettings...)...)
	regionRulesKey := region.NewLayout("edgeguard/").RegionRules(regionName)
	rlsFile := filepath.Join(t.TempDir(), "envoy.yaml")
	require.NoError(t, os.WriteFile(rlsFile, []byte(rlsYAML), 0o600))
	regionctl(t, consul.HTTPAddr(), "rls", "push", "--region", regionName, "--yes", rlsFile)

	// A second region's Redis, named in the region catalog, homes about
	// half of the global rule's keys: the edges lease those from it.
	// (regionctl catalog push wants every region's datacenter; dc-away
	// has none here, so the document goes straight into dc-test's KV.)
	away, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = away.Close() })
	catalog := fmt.Sprintf(`{"regions": [{"name": %q, "redis": "redis://%s"}, {"name": "dc-away", "redis": %q}]}`, regionName, rd.Addr, away.URL())
	_, err = cc.KV().Put(&consulapi.KVPair{Key: region.NewLayout("edgeguard/").Catalog(), Value: []byte(catalog)}, nil)
	require.NoError(t, err)

	<-built
	require.NoError(t, buildErr)
	ams := startEdgeProc(t, bin, "ams", origin.URL, rd.URL(), consul.HTTPAddr())
	fra := startEdgeProc(t, bin, "fra", origin.URL, rd.URL(), consul.HTTPAddr())

	prom, err := testenv.StartPrometheus(testenv.PrometheusOptions{
		ScrapeInterval: scrapeInterval,
		Jobs: []testenv.ScrapeJob{
			// region and pop are target labels, as the stack's Consul
			// discovery attaches them from the service meta.
			{Name: "edgeguard-edge", Targets: []string{ams.admin, fra.admin}, TargetLabels: map[string]map[string]string{
				ams.admin: {"region": regionName, "pop": "ams"},
				fra.admin: {"region": regionName, "pop": "fra"},
			}},
			{Name: "redis", Targets: []string{exp.Addr}, Labels: map[string]string{"region": regionName}},
		},
		RuleFiles: []string{rulesPath},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = prom.Close() })
	pc, err := api.NewClient(api.Config{Address: prom.URL})
	require.NoError(t, err)
	p := promv1.NewAPI(pc)
	waitProm(t, p, `sum(up{job="edgeguard-edge"})`, 2)
	waitProm(t, p, `sum(redis_up)`, 1)
	return &dashFixture{rd: rd, away: away, exp: exp, consul: consul, cc: cc, regionRulesKey: regionRulesKey,
		ams: ams, fra: fra, origin: origin.URL, prom: prom, p: p}
}

func TestBoardsAndAlertsAgainstRealData(t *testing.T) {
	root := repoRoot(t)
	boards, err := LoadBoards(filepath.Join(root, "dashboards"))
	require.NoError(t, err)
	rulesPath := filepath.Join(root, "dashboards", "alerts", "edgeguard.rules.yml")
	rules, err := LoadRules(rulesPath)
	require.NoError(t, err)

	r := &dashRun{t: t, dashFixture: startDashFixture(t, rulesPath), marks: map[string][2]time.Time{}}
	runStart := time.Now()
	r.phase("warm-up: allowed, denied, shadow_denied, critical proxied", r.warmUp)
	r.phase("counted: 7 denied per-client, 4 shadow_denied, 10 critical proxied, 2 rejected documents, 6 bypassed", r.counted)
	r.phase("failures: redis paused (fallback, breaker open), WRONGPASS, origin drops connections", r.failures)
	r.phase("hot key on fra: concurrent requests of one client coalesced", r.hotKey)
	r.phase("leased and global rules: leases, dc-away's Redis paused (static share), debts settled", r.leases)
	// The overload sends critical traffic: it must fall after the counting
	// window (a wall-clock window, so waiting for the clock is the signal).
	time.Sleep(time.Until(r.countAt.Add(scrapeInterval))) // a wall-clock boundary, not an event
	r.phase("overload on fra: shed, no_worker, queue waits; regionctl shedder set good=0.55", r.overload)
	r.phase("recorded overload on ams (start_after=2s full_after=20s), replayed by regionctl shedder simulate", r.simulated)
	r.phase("pool limit on ams: a host table pool of limit 1, queue 1, and 6 clients of its host (queue_full, queue_timeout)", r.poolLimit)
	r.phase("host shares on ams: slow.example waits for its share (admitted, timed_out) beside fast.example", r.hostShares)
	r.phase("consul stopped: watch errors; rules still enforced", r.consulStopped)

	// Both edges' last state is in Prometheus: a scrape of each after now.
	lastScene := time.Now()
	waitProm(t, r.p, fmt.Sprintf(`count(timestamp(edgeguard_edge_ready) > %d)`, lastScene.Unix()+1), 2)
	runEnd := time.Now()

	// --- variables, as Grafana fills them from label_values ---
	vars := grafanaVars(t, r.p, boards, runStart, runEnd)

	ck := &checks{boards: boards, rules: rules, p: r.p, phases: r.phases, vars: vars, start: runStart, end: runEnd}
	t.Run("panels", ck.panels)
	t.Run("counted values", func(t *testing.T) { ck.counted(t, r.countAt) })
	t.Run("annotations", func(t *testing.T) { ck.annotations(t, r.marks, r.newVersion, r.switchVersion) })
	t.Run("alerts", ck.alerts)
	t.Run("exported", func(t *testing.T) { ck.exported(t, []string{r.ams.admin, r.fra.admin}, r.exp.Addr) })
	for _, l := range append(r.report, ck.report...) {
		t.Log(l)
	}
}

// dashRun is the scenario the boards and alerts are checked against: one
// method per phase, run in order by phase, and what later phases and the
// checks read.
type dashRun struct {
	t *testing.T
	*dashFixture
	phases  []phase
	report  []string
	countAt time.Time     // the end of the counting window
	rc      *redis.Client // the region's Redis
	// The shedder's settings after the overload's change, and the marks
	// the boards must show: version -> (before, after) its push.
	current                   shedder.Config
	newVersion, switchVersion string
	marks                     map[string][2]time.Time
}

// phase runs one phase and records its name and times.
func (r *dashRun) phase(name string, run func()) {
	ph := phase{name: name, start: time.Now()}
	run()
	ph.end = time.Now()
	r.phases = append(r.phases, ph)
	r.report = append(r.report, fmt.Sprintf("PHASE %s: %.1f s", name, ph.end.Sub(ph.start).Seconds()))
}

// warmUp: allowed, denied, shadow and critical traffic, an escape and the
// rate limit service, so every series exists before the counted phase.
func (r *dashRun) warmUp() {
	t, p, ams := r.t, r.p, r.ams
	// Two denials: the first decided by Redis, the second by the over-limit
	// cache, so both denied series exist before the counted phase (a
	// counter's first sample carries no increase). per-client and
	// shadow-trial count in 10-minute windows on the clock: a client's
	// sends fall in one of them.
	testenv.EarlyInWindow(10*time.Minute, 10*time.Second)
	require.Equal(t, map[int]int{200: 5, 429: 2}, sendN(t, ams, 7, "/api/x", "203.0.113.1", ""))
	require.Equal(t, map[int]int{200: 3}, sendN(t, ams, 3, "/shadow", "203.0.113.1", ""))
	require.Equal(t, map[int]int{200: 1}, sendN(t, ams, 1, "/", "203.0.113.1", "critical"))
	require.Equal(t, map[int]int{200: 2}, sendEscapes(ams, 1, "203.0.113.1"))
	waitProm(t, p, `sum(edgeguard_edge_escapes_total{pop="ams", rule="escapes", escape="bypass"})`, 1)
	waitProm(t, p, `count(edgeguard_edge_decisions_total{pop="ams", rule="per-client", decision="denied"})`, 2)
	waitProm(t, p, `sum(edgeguard_edge_decisions_total{pop="ams", rule="per-client", decision="denied"})`, 2)
	waitProm(t, p, `sum(edgeguard_edge_decisions_total{pop="ams", rule="shadow-trial", decision="shadow_denied"})`, 1)
	waitProm(t, p, `sum(edgeguard_edge_requests_total{pop="ams", tier="critical", outcome="proxied"})`, 1)
	// Envoy's rate limit service: two calls within the limit, one over.
	require.Equal(t, []string{"OK", "OK", "OVER_LIMIT"}, askRLS(t, ams, "client-1", 3))
	waitProm(t, p, `sum(edgeguard_rls_requests_total{pop="ams", code="over_limit"})`, 1)
}

// counted sends the traffic whose values the panels must report, and sets
// the counting window.
func (r *dashRun) counted() {
	t, p, ams, cc := r.t, r.p, r.ams, r.cc
	testenv.EarlyInWindow(10*time.Minute, 10*time.Second)
	t0 := time.Now()
	require.Equal(t, map[int]int{200: 5, 429: wantDenied}, sendN(t, ams, 5+wantDenied, "/api/y", "203.0.113.2", ""))
	require.Equal(t, map[int]int{200: 2 + wantShadow}, sendN(t, ams, 2+wantShadow, "/shadow", "203.0.113.2", ""))
	require.Equal(t, map[int]int{200: wantCritical}, sendN(t, ams, wantCritical, "/", "203.0.113.3", "critical"))
	require.Equal(t, map[int]int{200: 2 * wantBypass}, sendEscapes(ams, wantBypass, "203.0.113.3"))
	// Invalid documents written straight into Consul (regionctl would
	// refuse them): every edge refuses each and keeps its rules.
	for i := range wantRejected {
		doc := fmt.Sprintf("version: 1\nrules:\n  - id: broken-%d\n    algorithm: nope\n", i)
		_, err := cc.KV().Put(&consulapi.KVPair{Key: r.regionRulesKey, Value: []byte(doc)}, nil)
		require.NoError(t, err)
		waitProm(t, p, `sum(edgeguard_edge_rules_rejected_total{pop="ams"})`, float64(i+1))
	}
	_, err := cc.KV().Put(&consulapi.KVPair{Key: r.regionRulesKey, Value: []byte(rulesYAML)}, nil)
	require.NoError(t, err)
	waitProm(t, p, `sum(edgeguard_edge_decisions_total{pop="ams", rule="per-client", decision="denied"})`, 2+wantDenied)
	waitProm(t, p, `sum(edgeguard_edge_decisions_total{pop="ams", rule="shadow-trial", decision="shadow_denied"})`, 1+wantShadow)
	waitProm(t, p, `sum(edgeguard_edge_escapes_total{pop="ams", rule="escapes", escape="bypass"})`, 1+wantBypass)
	waitProm(t, p, `sum(edgeguard_edge_requests_total{pop="ams", tier="critical", outcome="proxied"})`, 1+wantCritical)
	// The counting window starts before the counted traffic (one flat
	// sample in it) and ends before the overload adds critical traffic.
	r.countAt = t0.Add(-2 * scrapeInterval).Add(countWindow)
}

// failures: Redis paused (fallback, breaker) and rejected credentials, and
// an origin that drops connections.
func (r *dashRun) failures() {
	t, p, ams, rd := r.t, r.p, r.ams, r.rd
	rc := redis.NewClient(&redis.Options{Addr: rd.Addr, Password: redisPassword})
	t.Cleanup(func() { _ = rc.Close() })
	// What the fallback decided before: a store timeout at a stall of a
	// busy machine sends an earlier request to it too, as it should.
	unknownBefore := counterSum(t, ams.admin, "edgeguard_limiter_fallback_unknown_total")
	// Paused until the last request of the outage has its answer (UNPAUSE
	// below; 10 s bounds it should the test die): a request sent as a
	// timed pause lapsed would be answered by Redis, which is no outage.
	require.NoError(t, rc.Do(context.Background(), "CLIENT", "PAUSE", "10000", "WRITE").Err())
	pauseEnd := time.Now().Add(2500 * time.Millisecond)
	// A fresh client each time, decided by the fallback: Redis answered
	// this edge within the rule's window and the edge has no answer for
	// the key, so the exact rule denies it (other edges may have spent the
	// limit). Under a rule of its own (no metrics: its denials are _other),
	// so the counted per-client denials stay what the counted phase drove.
	codes := map[int]int{}
	for i := 0; time.Now().Before(pauseEnd); i++ {
		codes[send(ams, "/outage/z", fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), "")]++
		time.Sleep(5 * time.Millisecond) // pacing, not waiting for anything
	}
	require.NoError(t, rc.Do(context.Background(), "CLIENT", "UNPAUSE").Err())
	require.Len(t, codes, 1, "every fresh client is denied in the outage: %v", codes)
	require.Positive(t, codes[http.StatusTooManyRequests], "every fresh client is denied in the outage: %v", codes)
	waitProm(t, p, `sum(edgeguard_limiter_fallback_unknown_total{pop="ams"})`, unknownBefore+float64(codes[http.StatusTooManyRequests]))
	r.report = append(r.report, fmt.Sprintf("FAILURES fresh clients in the outage: %v", codes))
	bad := redis.NewClient(&redis.Options{Addr: rd.Addr, Password: "wrong", MaxRetries: -1})
	require.Error(t, bad.Ping(context.Background()).Err())
	_ = bad.Close()
	// One: the outage's fresh clients are denied, not proxied, so the few
	// proxied requests of these five minutes would make three origin
	// errors an error rate past EdgeguardOriginErrors' 5 %, which no
	// scenario drives.
	require.Equal(t, http.StatusBadGateway, send(ams, "/broken", "192.0.2.1", ""))
	waitPromAtLeast(t, p, `sum(edgeguard_limiter_fallback_total{pop="ams"})`, 1)
	waitPromAtLeast(t, p, `sum(redis_errors_total{err="WRONGPASS"})`, 1)
	waitPromAtLeast(t, p, `sum(edgeguard_origin_errors_total{pop="ams"})`, 1)
	r.rc = rc
}

// hotKey: Redis holds writes for a moment, so the concurrent requests of
// one client queue behind the first one's call and travel with it
// (coalescing).
func (r *dashRun) hotKey() {
	t, p, fra, rc := r.t, r.p, r.fra, r.rc
	require.NoError(t, rc.Do(context.Background(), "CLIENT", "PAUSE", "60", "WRITE").Err())
	var hot sync.WaitGroup
	for range 20 {
		hot.Add(1)
		go func() {
			defer hot.Done()
			send(fra, "/burst", "203.0.113.9", "")
		}()
	}
	hot.Wait()
	waitPromAtLeast(t, p, `sum(edgeguard_limiter_coalesced_checks_total{pop="fra"})`, 1)
}

// leases: leased and global rules. Clients of both edges lease (the global
// rule's keys homed in dc-away across "regions"), go idle (allowance given
// back), then dc-away's Redis stops answering: its keys are decided from
// the static share, and the debts are settled once it answers again.
func (r *dashRun) leases() {
	t, p, ams, fra, away := r.t, r.p, r.ams, r.fra, r.away
	// Allowances go back once idle for two periods (2 s for these 4 s
	// windows) while their window lasts: start as a window starts.
	testenv.EarlyInWindow(4*time.Second, 3500*time.Millisecond)
	for i := range 20 {
		for _, e := range []*edgeProc{ams, fra} {
			// Batches double (1, 2, 4, … units): a key's requests end
			// with units held, to be given back, unless their number
			// happens to spend the last batch; so the counts vary.
			for range 2 + i%5 {
				send(e, "/leased", fmt.Sprintf("198.18.0.%d", i+1), "")
			}
			for range 10 {
				send(e, "/global", fmt.Sprintf("198.18.1.%d", i+1), "")
			}
		}
	}
	waitPromAtLeast(t, p, `sum(edgeguard_limiter_lease_carves_total)`, 1)
	waitPromAtLeast(t, p, `sum(edgeguard_limiter_global_leased_units_total{home="dc-away"})`, 1)
	waitPromAtLeast(t, p, `sum(edgeguard_limiter_lease_returned_units_total)`, 1)
	waitPromAtLeast(t, p, `sum(edgeguard_limiter_global_returned_units_total{home="dc-away"})`, 1)
	ac := redis.NewClient(&redis.Options{Addr: away.Addr})
	t.Cleanup(func() { _ = ac.Close() })
	require.NoError(t, ac.Do(context.Background(), "CLIENT", "PAUSE", "5000", "ALL").Err())
	pauseEnd := time.Now().Add(5 * time.Second)
	for i := 0; time.Now().Before(pauseEnd); i++ {
		// Fresh clients: each check needs a lease, which hangs, then the
		// home is unreachable and the share decides.
		for _, e := range []*edgeProc{ams, fra} {
			send(e, "/global", fmt.Sprintf("198.18.%d.%d", 2+i/250, 1+i%250), "")
		}
		time.Sleep(20 * time.Millisecond) // pacing, not waiting for anything
	}
	require.NoError(t, ac.Do(context.Background(), "CLIENT", "UNPAUSE").Err())
	waitPromAtLeast(t, p, `sum(edgeguard_limiter_global_decisions_total{home="dc-away", from="share"})`, 1)
	waitPromAtLeast(t, p, `max_over_time(sum(edgeguard_limiter_global_fallback_share{home="dc-away"})[1m:1s])`, 1)
	waitPromAtLeast(t, p, `max_over_time(sum(edgeguard_limiter_global_debt_units{home="dc-away"})[1m:1s])`, 1)
	waitProm(t, p, `sum(edgeguard_limiter_global_fallback_share{home="dc-away"})`, 0)
	waitProm(t, p, `sum(edgeguard_limiter_global_debt_units{home="dc-away"})`, 0)
}

// overloadTiers are the tiers of overload's clients, in turn.
var overloadTiers = []string{"test", "read", "read", "write", "critical", ""}

// overloadOf sends from 24 clients (addresses 198.51.100.<first+i>) to e as
// fast as it answers, until the returned stop is called.
func overloadOf(e *edgeProc, first int) (stop func()) {
	var wg sync.WaitGroup
	done := make(chan struct{})
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				send(e, "/slow", fmt.Sprintf("198.51.100.%d", i+first), overloadTiers[i%len(overloadTiers)])
			}
		}()
	}
	return func() { close(done); wg.Wait() }
}

// overload: ramp shedding, the worker cap and queueing on fra, and a
// settings change and an enforcement switch pushed meanwhile.
func (r *dashRun) overload() {
	t, p, consul := r.t, r.p, r.consul
	stop := overloadOf(r.fra, 1)
	waitPromAtLeast(t, p, `sum(edgeguard_shedder_rejected_total{pop="fra", reason="ramp"})`, 1)
	waitPromAtLeast(t, p, `sum(edgeguard_shedder_rejected_total{pop="fra", reason=~"queue_full|queue_timeout"})`, 1)
	waitPromAtLeast(t, p, `sum(edgeguard_shedder_queue_wait_seconds_count{pop="fra"})`, 1)
	setBefore := time.Now()
	regionctl(t, consul.HTTPAddr(), "shedder", "set", "--region", regionName, "good=0.55")
	current, err := shedder.ApplySettings(shedder.DefaultConfig(), settingsMap(append(shedderSettings, "good=0.55")))
	require.NoError(t, err)
	r.current, r.newVersion = current, shedder.SettingsVersion(current)
	waitProm(t, p, fmt.Sprintf(`sum(edgeguard_shedder_settings_info{version=%q})`, r.newVersion), 2)
	r.marks[r.newVersion] = [2]time.Time{setBefore, time.Now()}
	// The enforcement switch, pushed while the overload runs: every board
	// marks it too.
	switchBefore := time.Now()
	regionctl(t, consul.HTTPAddr(), "enforcement", "set", "--region", regionName, "enforce", "--percent", "50")
	r.switchVersion = region.Enforcement{Mode: region.ModeEnforce, Percent: 50}.Version()
	waitProm(t, p, fmt.Sprintf(`sum(edgeguard_edge_enforcement_info{version=%q})`, r.switchVersion), 2)
	r.marks[r.switchVersion] = [2]time.Time{switchBefore, time.Now()}
	stop()
}

// simulated: a recorded overload on ams under a slower ramp, replayed by
// regionctl shedder simulate.
func (r *dashRun) simulated() {
	t, p, consul, prom := r.t, r.p, r.consul, r.prom
	regionctl(t, consul.HTTPAddr(), "shedder", "set", "--region", regionName, "start_after=2s", "full_after=20s", "smoothing=1s")
	simSettings, err := shedder.ApplySettings(r.current, map[string]string{"start_after": "2s", "full_after": "20s", "smoothing": "1s"})
	require.NoError(t, err)
	waitProm(t, p, fmt.Sprintf(`sum(edgeguard_shedder_settings_info{pop="ams", version=%q})`, shedder.SettingsVersion(simSettings)), 1)
	waitProm(t, p, `count(edgeguard_shedder_level{pop="ams"} < -0.099)`, 1) // at rest: -start_after/full_after
	simFrom := time.Now()
	stop := overloadOf(r.ams, 101)
	waitPromAtLeast(t, p, `max(edgeguard_shedder_level{pop="ams"})`, 0.25)
	stop()
	// Recovering: the level falls 1/full_after per second once idle.
	waitProm(t, p, `count(edgeguard_shedder_level{pop="ams"} < 0.15)`, 1)
	simTo := time.Now()
	waitPromAtLeast(t, p, fmt.Sprintf(`max(timestamp(edgeguard_shedder_level{pop="ams"})) - %d`, simTo.Unix()), 1)
	simulate := func(candidate ...string) simulation {
		args := append([]string{"--consul", consul.HTTPAddr(), "--output", "json", "shedder", "simulate", "--region", regionName, "--pop", "ams",
			"--from", simFrom.Format(time.RFC3339Nano), "--to", simTo.Format(time.RFC3339Nano), "--prometheus", prom.URL}, candidate...)
		var out bytes.Buffer
		code := regionctlcmd.Main(args, func(string) string { return "" }, &out, &out)
		require.Zero(t, code, out.String())
		var sim simulation
		require.NoError(t, json.Unmarshal(out.Bytes(), &sim), out.String())
		require.Len(t, sim.Edges, 1, out.String())
		return sim
	}
	later := simulate("start_after=30s")
	e := later.Edges[0]
	require.True(t, e.Reproduced)
	require.LessOrEqual(t, e.Deviation, 0.05)
	require.Positive(t, sum(e.Recorded), "the recorded overload shed requests")
	require.Positive(t, sum(e.Current.Shed), "the replay of the current settings sheds too")
	require.Zero(t, sum(e.Candidate.Shed), "start_after=30s would have shed nothing in this overload")
	require.LessOrEqual(t, e.Candidate.MaxLevel, 0.0)
	faster := simulate("full_after=5s").Edges[0]
	require.Greater(t, sum(faster.Candidate.Shed), sum(faster.Current.Shed), "a faster ramp sheds more")
	// The text an operator reads (dashboards/README.md walks through it).
	var text bytes.Buffer
	code := regionctlcmd.Main([]string{"--consul", consul.HTTPAddr(), "shedder", "simulate", "--region", regionName, "--pop", "ams",
		"--from", simFrom.Format(time.RFC3339Nano), "--to", simTo.Format(time.RFC3339Nano), "--prometheus", prom.URL, "good=0.6", "bad=0.9"},
		func(string) string { return "" }, &text, &text)
	require.Zero(t, code, text.String())
	require.Contains(t, text.String(), "the current settings reproduce the recorded shed level")
	t.Logf("regionctl shedder simulate ... good=0.6 bad=0.9:\n%s", text.String())
	r.report = append(r.report,
		fmt.Sprintf("SIMULATE %s: %d samples, current settings reproduce the recorded level within %.4f; shed recorded %v, replayed %v; candidate start_after=30s sheds %v (peak level %.3f); candidate full_after=5s sheds %v (peak %.3f)",
			e.Instance, e.Samples, e.Deviation, e.Recorded, e.Current.Shed, e.Candidate.Shed, e.Candidate.MaxLevel, faster.Candidate.Shed, faster.Candidate.MaxLevel))
}

// poolLimit: a host table whose pool "limited" has a concurrency limit of 1
// and a queue of 1 (20 ms), and 6 clients requesting its host's slow path
// on ams at once: one in flight, one queued until it times out, the rest
// refused at once. The table also lists hostShares' two hosts on the
// default pool: each host the table lists has a host share of its own.
func (r *dashRun) poolLimit() {
	t, p := r.t, r.p
	table := fmt.Sprintf("version: 1\npools:\n  limited:\n    urls: [%q]\n    concurrency: {limit: 1, queue: 1, queue_timeout: 20ms}\nhosts:\n  limited.example: {pool: limited}\n  fast.example: {pool: default}\n  slow.example: {pool: default}\n", r.origin)
	file := filepath.Join(t.TempDir(), "hosts.yaml")
	require.NoError(t, os.WriteFile(file, []byte(table), 0o600))
	regionctl(t, r.consul.HTTPAddr(), "hosts", "push", "--region", regionName, file)
	waitProm(t, p, `sum(edgeguard_origin_concurrency_limit{pop="ams", pool="limited"})`, 1)
	stop := hostClients(r.ams, "limited.example", "/slow", 200, 6)
	waitPromAtLeast(t, p, `sum(edgeguard_origin_concurrency_refused_total{pop="ams", pool="limited", reason="queue_full"})`, 1)
	waitPromAtLeast(t, p, `sum(edgeguard_origin_concurrency_refused_total{pop="ams", pool="limited", reason="queue_timeout"})`, 1)
	waitPromAtLeast(t, p, `max_over_time(edgeguard_origin_concurrency_in_flight{pop="ams", pool="limited"}[1m])`, 1)
	stop()
}

// hostShares: two hosts on ams's 4 workers, a share of 2 each. 16 clients
// of slow.example's slow path keep 2 in flight and 14 waiting in its
// host's queue, a place freeing every 100 ms or so: some are admitted
// from the queue, the rest get 503 host_share after
// host_share.queue_timeout. fast.example, within its share, keeps being
// answered.
func (r *dashRun) hostShares() {
	t, p := r.t, r.p
	stopFast := hostClients(r.ams, "fast.example", "/", 180, 2)
	stopSlow := hostClients(r.ams, "slow.example", "/slow", 150, 16)
	waitPromAtLeast(t, p, `max_over_time(edgeguard_shedder_host_queued{pop="ams", host="slow.example"}[1m])`, 1)
	waitPromAtLeast(t, p, `sum(edgeguard_shedder_host_queue_waits_total{pop="ams", outcome="admitted"})`, 1)
	waitPromAtLeast(t, p, `sum(edgeguard_shedder_host_queue_waits_total{pop="ams", outcome="timed_out"})`, 1)
	stopSlow()
	stopFast()
}

// hostClients starts n clients, each at its own address (198.51.100.first
// on), sending requests for host's path to e back to back until stop.
func hostClients(e *edgeProc, host, path string, first, n int) (stop func()) {
	var wg sync.WaitGroup
	done := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodGet, "http://"+e.addr+path, nil)
				req.Host = host
				req.Header.Set("X-Forwarded-For", fmt.Sprintf("198.51.100.%d", first+i))
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// consulStopped: Consul unreachable. The edges count failed watches and
// keep enforcing the rules they have.
func (r *dashRun) consulStopped() {
	t, p, ams, consul := r.t, r.p, r.ams, r.consul
	require.NoError(t, consul.Stop())
	waitPromAtLeast(t, p, `min(edgeguard_edge_consul_errors_total)`, 1)
	// A fresh client past the limit: 2×limit+1 requests are over the limit
	// in one fixed window even when a window boundary falls among them (the
	// client denied earlier may be in a new window by now).
	codes := sendN(t, ams, 11, "/api/w", "203.0.113.4", "")
	require.Positive(t, codes[http.StatusTooManyRequests], "the last good rules stay in force: %v", codes)
}

// grafanaVars fills the boards' variables as Grafana does from
// label_values over [start, end], and checks that every query variable
// of the boards is one it fills.
func grafanaVars(t *testing.T, p promv1.API, boards []Board, start, end time.Time) map[string]string {
	labelValues := func(label, match string) string {
		vs, _, _, err := p.LabelValues(context.Background(), label, []string{match}, start, end)
		require.NoError(t, err)
		require.NotEmpty(t, vs, "label_values(%s, %s)", match, label)
		var ss []string
		for _, v := range vs {
			ss = append(ss, string(v))
		}
		return MultiValue(ss)
	}
	vars := map[string]string{"region": labelValues("region", "edgeguard_edge_ready")}
	vars["pop"] = labelValues("pop", fmt.Sprintf(`edgeguard_edge_ready{region=~%q}`, vars["region"]))
	vars["instance"] = labelValues("instance", fmt.Sprintf(`edgeguard_edge_ready{region=~%q, pop=~%q}`, vars["region"], vars["pop"]))
	require.Equal(t, "(ams|fra)", vars["pop"])
	for _, b := range boards {
		require.Equal(t, "datasource", b.Templating.List[0].Name, "%s: first variable", b.File)
		require.Equal(t, "datasource", b.Templating.List[0].Type, "%s: first variable", b.File)
		for _, v := range b.Templating.List {
			if v.Type == "query" {
				require.Contains(t, v.Definition, "label_values(", "%s: variable %s", b.File, v.Name)
				_, ok := vars[v.Name]
				require.True(t, ok, "%s: variable %s is not filled by the check", b.File, v.Name)
			}
		}
	}
	vars["__rate_interval"] = (4 * scrapeInterval).String()
	vars["__interval"] = scrapeInterval.String()
	vars["__range"] = strconv.Itoa(int(end.Sub(start).Seconds())+1) + "s"
	return vars
}

// checks is what the scenarios leave for the checks: the boards and
// rules, Prometheus, the scenarios' phases and the run's span, the
// dashboards' variables as Grafana fills them; report collects what each
// check found.
type checks struct {
	boards     []Board
	rules      []Rule
	p          promv1.API
	phases     []phase
	vars       map[string]string
	start, end time.Time
	report     []string
}

// panels: every panel query returns series, with its legend labels set,
// and some value that is not zero.
func (ck *checks) panels(t *testing.T) {
	ctx := context.Background()
	// fedBy names the scenarios during which (or one scrape after) some
	// series of m moved off the value it started the run with, and whether
	// any value was non-zero.
	fedBy := func(m model.Matrix) (string, bool) {
		var names []string
		nonZero := false
		for _, ph := range ck.phases {
			moved := false
			for _, s := range m {
				first := s.Values[0].Value
				for _, v := range s.Values {
					if v.Value != 0 && !math.IsNaN(float64(v.Value)) {
						nonZero = true
					}
					at := v.Timestamp.Time()
					if !at.Before(ph.start) && !at.After(ph.end.Add(2*scrapeInterval)) && !v.Value.Equal(first) {
						moved = true
					}
				}
			}
			if moved {
				names = append(names, ph.name)
			}
		}
		if len(names) == 0 {
			return "constant through the run", nonZero
		}
		return strings.Join(names, " | "), nonZero
	}
	for _, b := range ck.boards {
		for _, panel := range b.Panels {
			name := b.Title + " / " + panel.Title
			panelNonZero := false
			require.NotEmpty(t, panel.Description, name)
			require.NotEmpty(t, panel.FieldConfig.Defaults.Unit, "%s: unit", name)
			require.NotNil(t, panel.FieldConfig.Defaults.Thresholds, "%s: thresholds", name)
			require.NotEmpty(t, panel.Targets, name)
			for _, tg := range panel.Targets {
				q, err := Substitute(tg.Expr, ck.vars)
				require.NoError(t, err, name)
				var series []model.Metric
				where := ""
				if tg.Instant {
					v, _, _, err := ck.p.Query(ctx, q, ck.end)
					require.NoError(t, err, "%s: %s", name, q)
					vec := v.(model.Vector)
					for _, s := range vec {
						series = append(series, s.Metric)
						panelNonZero = panelNonZero || s.Value != 0
					}
					where = "instant at the end of the run"
				} else {
					v, _, _, err := ck.p.QueryRange(ctx, q, promv1.Range{Start: ck.start, End: ck.end, Step: scrapeInterval})
					require.NoError(t, err, "%s: %s", name, q)
					m := v.(model.Matrix)
					for _, s := range m {
						series = append(series, s.Metric)
					}
					var nonZero bool
					where, nonZero = fedBy(m)
					panelNonZero = panelNonZero || nonZero
				}
				require.NotEmpty(t, series, "%s: no series for %s", name, q)
				for _, s := range series {
					for _, l := range LegendLabels(tg.Legend) {
						require.NotEmpty(t, s[model.LabelName(l)], "%s: series %v lacks label %s of its legend", name, s, l)
					}
					for _, l := range GroupBy(tg.Expr) {
						require.NotEmpty(t, s[model.LabelName(l)], "%s: series %v lacks group-by label %s", name, s, l)
					}
				}
				ck.report = append(ck.report, fmt.Sprintf("%s [%s]: %d series; fed by: %s", name, tg.RefID, len(series), where))
			}
			require.True(t, panelNonZero, "%s: every value was zero in every scenario", name)
		}
	}

}

// counted: the values some panels report equal the counts the test
// drove, read over countWindow ending at countAt.
func (ck *checks) counted(t *testing.T, countAt time.Time) {
	ctx := context.Background()
	w := strconv.Itoa(int(countWindow.Seconds())) + "s"
	wsec := countWindow.Seconds()
	countVars := map[string]string{}
	for k, v := range ck.vars {
		countVars[k] = v
	}
	countVars["__range"], countVars["__rate_interval"] = w, w
	// increase/rate extrapolate a flat counter by at most the window over
	// the sampled span: a window one scrape interval either side.
	within := func(name string, got float64, want int) {
		hi := float64(want) * wsec / (wsec - 2*scrapeInterval.Seconds())
		require.True(t, got >= float64(want)-0.5 && got <= hi+0.5, "%s: got %v, want %d (up to %.2f)", name, got, want, hi)
		ck.report = append(ck.report, fmt.Sprintf("VALUE %s = %.2f (drove %d)", name, got, want))
	}
	findPanel := func(uid, title string) Panel {
		for _, b := range ck.boards {
			if b.UID != uid {
				continue
			}
			for _, pn := range b.Panels {
				if pn.Title == title {
					return pn
				}
			}
		}
		t.Fatalf("no panel %s in %s", title, uid)
		return Panel{}
	}
	evalAt := func(expr string) model.Vector {
		q, err := Substitute(expr, countVars)
		require.NoError(t, err)
		v, _, _, err := ck.p.Query(ctx, q, countAt)
		require.NoError(t, err, q)
		return v.(model.Vector)
	}
	pick := func(vec model.Vector, match map[string]string) float64 {
		var found []float64
	next:
		for _, s := range vec {
			for k, v := range match {
				if string(s.Metric[model.LabelName(k)]) != v {
					continue next
				}
			}
			found = append(found, float64(s.Value))
		}
		require.Len(t, found, 1, "series %v in %v", match, vec)
		return found[0]
	}
	within("Rate limits / Top denied rules {rule=per-client}",
		pick(evalAt(findPanel("edgeguard-ratelimits", "Top denied rules").Targets[0].Expr), map[string]string{"rule": "per-client"}), wantDenied)
	within("Rate limits / Decisions by rule and outcome {rule=shadow-trial, decision=shadow_denied} x window",
		wsec*pick(evalAt(findPanel("edgeguard-ratelimits", "Decisions by rule and outcome").Targets[0].Expr), map[string]string{"rule": "shadow-trial", "decision": "shadow_denied"}), wantShadow)
	within("Rate limits / Escapes by rule {rule=escapes, escape=bypass} x window",
		wsec*pick(evalAt(findPanel("edgeguard-ratelimits", "Escapes by rule").Targets[0].Expr), map[string]string{"rule": "escapes", "escape": "bypass"}), wantBypass)
	within("Shedder tuning / Requests by tier and outcome {tier=critical, outcome=proxied} x window",
		wsec*pick(evalAt(findPanel("edgeguard-shedder", "Requests by tier and outcome").Targets[0].Expr), map[string]string{"tier": "critical", "outcome": "proxied"}), wantCritical)
	within("Regions / Consul watch errors and rejected documents [B] {pop=ams}",
		pick(evalAt(findPanel("edgeguard-regions", "Consul watch errors and rejected documents").Targets[1].Expr), map[string]string{"pop": "ams"}), wantRejected)

}

// annotations: the settings change and the enforcement switch are
// marked at the time each was made (marks: version → made between).
func (ck *checks) annotations(t *testing.T, marks map[string][2]time.Time, newVersion, switchVersion string) {
	ctx := context.Background()
	annotated := map[string]int{}
	for _, b := range ck.boards {
		for _, a := range b.Annotations.List {
			require.True(t, a.UseValueForTime, "%s: %s", b.File, a.Name)
			require.NotNil(t, a.Target)
			require.Equal(t, a.Expr, a.Target.Expr)
			q, err := Substitute(a.Target.Expr, ck.vars)
			require.NoError(t, err)
			v, _, _, err := ck.p.QueryRange(ctx, q, promv1.Range{Start: ck.start, End: ck.end, Step: scrapeInterval})
			require.NoError(t, err, q)
			for _, s := range v.(model.Matrix) {
				version := string(s.Metric["version"])
				window, ok := marks[version]
				if !ok {
					continue
				}
				setBefore, setAfter := window[0], window[1]
				last := s.Values[len(s.Values)-1].Value
				at := time.UnixMilli(int64(last))
				require.False(t, at.Before(setBefore.Add(-time.Millisecond)) || at.After(setAfter), "annotation at %v, set between %v and %v", at, setBefore, setAfter)
				ck.report = append(ck.report, fmt.Sprintf("ANNOTATION %s: %s%s version %s at %s (set between %s and %s)", b.File, a.Name, s.Metric["pop"], version, at.Format(time.RFC3339Nano), setBefore.Format(time.RFC3339Nano), setAfter.Format(time.RFC3339Nano)))
				annotated[version]++
			}
		}
	}
	require.Equal(t, 2, annotated[newVersion], "annotations for the settings change to %s, one per PoP", newVersion)
	require.Equal(t, len(ck.boards), annotated[switchVersion], "one annotation for the enforcement switch %s on every board (max over the region)", switchVersion)

}

// alerts: every rule loads in Prometheus and every expression
// evaluates; alerts hold during the scenario that drives them and only
// then.
func (ck *checks) alerts(t *testing.T) {
	ctx := context.Background()
	rr, err := ck.p.Rules(ctx, nil)
	require.NoError(t, err)
	loaded := 0
	for _, g := range rr.Groups {
		for _, r := range g.Rules {
			switch r := r.(type) {
			case promv1.AlertingRule:
				require.EqualValues(t, promv1.RuleHealthGood, r.Health, "%s: %s", r.Name, r.LastError)
			case promv1.RecordingRule:
				require.EqualValues(t, promv1.RuleHealthGood, r.Health, "%s: %s", r.Name, r.LastError)
			}
			loaded++
		}
	}
	require.Equal(t, len(ck.rules), loaded)
	// Alert expressions (before their `for`) on the real data: those whose
	// condition a scenario drove return series during it, those no scenario
	// drove return nothing all run long.
	firesIn := map[string]string{
		"EdgeguardRulesDocumentRejected":    "counted:",
		"EdgeguardLimiterFallback":          "failures:",
		"EdgeguardLimiterBreakerOpen":       "failures:",
		"EdgeguardRedisCredentialsRejected": "failures:",
		"EdgeguardSustainedShedding":        "overload on fra",
		"EdgeguardConsulUnreachable":        "consul stopped",
	}
	quiet := map[string]bool{"EdgeguardRulesNotConverged": true, "EdgeguardDenialSpike": true, "EdgeguardOriginErrors": true,
		"EdgeguardEdgeDown": true, "EdgeguardEdgesAbsent": true, "EdgeguardMetricAbsent": true,
		"EdgeguardConsulDocumentMissing": true} // Consul stops, never comes back empty
	for _, r := range ck.rules {
		if !r.Alert {
			v, _, _, err := ck.p.Query(ctx, r.Expr, ck.end)
			require.NoError(t, err, r.Name)
			ck.report = append(ck.report, fmt.Sprintf("RULE %s: evaluated, %d series at the end", r.Name, len(v.(model.Vector))))
			continue
		}
		from, to, expect := ck.start, ck.end, "(not asserted)"
		if name, ok := firesIn[r.Name]; ok {
			ph := phaseNamed(t, ck.phases, name)
			from, to, expect = ph.start, ph.end.Add(5*scrapeInterval), "fires in: "+ph.name
		} else if quiet[r.Name] {
			expect = "quiet all run"
		}
		v, _, _, err := ck.p.QueryRange(ctx, r.Expr, promv1.Range{Start: from, End: to, Step: scrapeInterval})
		require.NoError(t, err, r.Name)
		n := len(v.(model.Matrix))
		for _, s := range v.(model.Matrix) {
			for _, l := range GroupBy(r.Expr) {
				require.NotEmpty(t, s.Metric[model.LabelName(l)], "%s: series %v lacks group-by label %s", r.Name, s.Metric, l)
			}
		}
		switch {
		case firesIn[r.Name] != "":
			require.NotZero(t, n, "%s: the condition its scenario drove never held: %s", r.Name, r.Expr)
		case quiet[r.Name]:
			require.Zero(t, n, "%s: held though no scenario drove it: %v", r.Name, v)
		}
		ck.report = append(ck.report, fmt.Sprintf("ALERT %s: %d series; %s", r.Name, n, expect))
	}

}

// exported: every metric a board or rule reads is exported, by the
// edges at edges or the Redis exporter.
func (ck *checks) exported(t *testing.T, edges []string, exporter string) {
	edgeNames := map[string]bool{}
	for _, a := range edges {
		for k := range metricFamilies(t, a) {
			edgeNames[k] = true
		}
	}
	redisNames := metricFamilies(t, exporter)
	var exprs []string
	for _, b := range ck.boards {
		for _, pn := range b.Panels {
			for _, tg := range pn.Targets {
				exprs = append(exprs, tg.Expr)
			}
		}
		for _, a := range b.Annotations.List {
			exprs = append(exprs, a.Expr)
		}
	}
	for _, r := range ck.rules {
		exprs = append(exprs, r.Expr)
	}
	used := map[string]bool{}
	for _, e := range exprs {
		for _, n := range MetricNames(e) {
			used[n] = true
		}
	}
	var names []string
	for n := range used {
		names = append(names, n)
		if strings.HasPrefix(n, "redis_") {
			require.True(t, redisNames[n], "%s is not exported by the Redis exporter", n)
		} else {
			require.True(t, edgeNames[n], "%s is not exported by the edge", n)
		}
	}
	sort.Strings(names)
	ck.report = append(ck.report, "METRICS used and exported: "+strings.Join(names, " "))
}

// simulation is the JSON regionctl shedder simulate prints.
type simulation struct {
	Edges []struct {
		Instance   string             `json:"instance"`
		Samples    int                `json:"samples"`
		Deviation  float64            `json:"max_level_deviation"`
		Reproduced bool               `json:"reproduced"`
		Recorded   map[string]float64 `json:"recorded_shed"`
		Current    struct {
			Shed     map[string]float64 `json:"shed"`
			MaxLevel float64            `json:"max_level"`
		} `json:"current"`
		Candidate struct {
			Shed     map[string]float64 `json:"shed"`
			MaxLevel float64            `json:"max_level"`
		} `json:"candidate"`
	} `json:"edges"`
}

func sum(m map[string]float64) float64 {
	var total float64
	for _, v := range m {
		total += v
	}
	return total
}

func phaseNamed(t *testing.T, phases []phase, prefix string) phase {
	for _, ph := range phases {
		if strings.HasPrefix(ph.name, prefix) {
			return ph
		}
	}
	t.Fatalf("no scenario %q", prefix)
	return phase{}
}

func settingsMap(kv []string) map[string]string {
	m := map[string]string{}
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return m
}
