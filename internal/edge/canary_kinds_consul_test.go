package edge

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/regionctl"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// TestShedderCanaryPush runs regionctl shedder set --canary on real
// Consul, two in-process edges of eu-west (PoPs ams and fra, 16 workers
// each) under steady traffic to a slow origin path (a few workers busy at
// every moment) and a real Prometheus scraping them every second: a ramp
// that sheds from 2% utilization is rolled back on ams's shed rate, fra
// never runs it, and the canary key is gone; a harmless change is promoted
// to the region's shedder key (with history), which both PoPs then run.
func TestShedderCanaryPush(t *testing.T) {
	// The four canary tests wait most of their time (a canary's 4 s, Prometheus's
	// scrapes), each on a region of its own: they run side by side.
	heavyWaiting(t)
	v0 := shedder.SettingsVersion(shedder.DefaultConfig())
	settingsOf := func(kv map[string]string) string {
		cfg, err := shedder.ApplySettings(shedder.DefaultConfig(), kv)
		require.NoError(t, err)
		return shedder.SettingsVersion(cfg)
	}
	// Each request held 80ms at the origin (~25 requests/s): about two
	// of 16 workers busy, 12% utilization.
	cr := startCanaryRegion(t, "", "/slow?ms=80", func(e region.Edge) bool { return e.ShedderVersion == v0 }, nil,
		func(c *config.Config) { c.Workers = 16 })
	rc, layout, ams, fra, ctx := cr.rc, cr.rc.Layout(), cr.ams, cr.fra, cr.ctx
	canary := func(t *testing.T, settings ...string) (string, int) {
		return cr.regionctl(t, []string{"shedder", "set"}, settings...)
	}
	noKey := func(t *testing.T) {
		t.Helper()
		v, _, err := rc.Get(ctx, "eu-west", layout.ShedderCanary("eu-west", "ams"))
		require.NoError(t, err)
		require.Nil(t, v, "the canary key was left behind")
	}
	runs := func(t *testing.T, e *running, want string) { t.Helper(); runsVersion(t, e, shedderVersion, want) }

	// The harmless change first: a ramp that shed leaves its shed level
	// behind, which the restored settings bring down at their own pace.
	promoted := settingsOf(map[string]string{"share_window": "11s"})
	t.Run("harmless change promoted", func(t *testing.T) {
		good := promoted
		out, code := canary(t, "share_window=11s")
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "runs shedder settings version "+good)
		require.Contains(t, out, "canary promoted\neu-west: ok: shedder settings updated (share_window=11s)")
		noKey(t)
		runs(t, fra, good)
		runs(t, ams, good)
		hist, err := rc.History(ctx, "eu-west", region.KindShedder)
		require.NoError(t, err)
		require.Len(t, hist, 1, "the promotion is in the history")
	})
	t.Run("shedding ramp rolled back", func(t *testing.T) {
		bad := settingsOf(map[string]string{"share_window": "11s", "good": "0.01", "bad": "0.02", "start_after": "100ms", "full_after": "100ms"})
		// fra is watched all along: it must never run the candidate.
		fraRan := never(fra, shedderVersion, bad)
		out, code := canary(t, "good=0.01", "bad=0.02", "start_after=100ms", "full_after=100ms")
		fraRanBad := fraRan()
		require.Equal(t, regionctl.ExitRolledBack, code, out)
		require.Contains(t, out, "runs shedder settings version "+bad, "ams loaded the candidate before it was judged")
		require.Contains(t, out, "canary rolled back: shed rate")
		require.False(t, fraRanBad, "fra ran the canary's settings")
		noKey(t)
		runs(t, ams, promoted)
		hist, err := rc.History(ctx, "eu-west", region.KindShedder)
		require.NoError(t, err)
		require.Len(t, hist, 1, "nothing was written region-wide")
	})

	require.Positive(t, cr.sent.Load())
}

// canaryRegion is eu-west on real Consul with two in-process edges (PoPs
// ams and fra), a real Prometheus scraping both every second with their
// region and pop as target labels, and steady traffic to both (~25
// requests/s each, GET path with Host host) until the test ends.
type canaryRegion struct {
	eu       *testenv.Consul
	rc       *region.Client
	ams, fra *running
	prom     *testenv.Prometheus
	ctx      context.Context
	sent     atomic.Int64
}

// startCanaryRegion starts it once both edges are healthy in the catalog
// and ready(edge) holds for both, and returns once Prometheus has both
// PoPs' requests.
func startCanaryRegion(t *testing.T, host, path string, ready func(region.Edge) bool, setup func(*region.Client), opts ...func(*config.Config)) *canaryRegion {
	t.Helper()
	eu, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = eu.Close() })
	cr := &canaryRegion{eu: eu, rc: regionClient(t, eu)}
	push(t, cr.rc, "eu-west", cr.rc.Layout().GlobalRules(), canaryGlobal)
	if setup != nil {
		setup(cr.rc)
	}
	cache := t.TempDir()
	cr.ams = startConsulEdge(t, "eu-west", "ams", eu.HTTPAddr(), filepath.Join(cache, "ams.yaml"), opts...)
	cr.fra = startConsulEdge(t, "eu-west", "fra", eu.HTTPAddr(), filepath.Join(cache, "fra.yaml"), opts...)
	// Uncompressed: the edges run in this race-instrumented process,
	// where gzip is most of a scrape's cost (about 5 times the rest);
	// on a busy machine gzipped scrapes ran past the 1 s timeout, and a
	// canary window without samples gave no verdict.
	cr.prom, err = testenv.StartPrometheus(testenv.PrometheusOptions{ScrapeInterval: time.Second, Jobs: []testenv.ScrapeJob{{
		Name:    "edges",
		Targets: []string{cr.ams.AdminAddr(), cr.fra.AdminAddr()},
		TargetLabels: map[string]map[string]string{
			cr.ams.AdminAddr(): {"region": "eu-west", "pop": "ams"},
			cr.fra.AdminAddr(): {"region": "eu-west", "pop": "fra"},
		},
		Uncompressed: true,
	}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cr.prom.Close() })

	waitHealthyInCatalog(t, eu, cr.rc, "eu-west", "both edges healthy and ready in the catalog", healthy(2, ready), cr.ams, cr.fra)

	ctx, stop := context.WithCancel(context.Background())
	cr.ctx = ctx
	var wg sync.WaitGroup
	var transports []*http.Transport
	t.Cleanup(func() {
		stop()
		wg.Wait()
		for _, tr := range transports {
			tr.CloseIdleConnections()
		}
	})
	// ~25 requests/s at each PoP: 100 in a canary's 4 s, five times the
	// --canary-min-requests the tests judge with (fewer when scrapes are
	// missing: down to 25 seen at 20 requests/s). The edges, their origin
	// and this client share this race-instrumented process, which a busy
	// machine starves: at 50 requests/s each, four regions' traffic
	// delayed their scrapes past Prometheus's 1 s timeout.
	for _, e := range []*running{cr.ams, cr.fra} {
		// Connections kept for the requests in flight (the default
		// transport keeps 2 idle per host and dials the rest anew).
		tr := &http.Transport{MaxIdleConnsPerHost: 16}
		transports = append(transports, tr)
		wg.Go(func() {
			c := &http.Client{Timeout: 2 * time.Second, Transport: tr}
			tick := time.NewTicker(40 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				wg.Go(func() {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.Addr()+path, nil)
					req.Host = host
					if resp, err := c.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						cr.sent.Add(1)
					}
				})
			}
		})
	}
	err = proc.PollEvery(testenv.Within(t, 30*time.Second), 200*time.Millisecond, "prometheus to see both PoPs' requests", func(ctx context.Context) error {
		q := `count by (pop) (rate(edgeguard_edge_requests_total{region="eu-west"}[5s]) > 0)`
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cr.prom.URL+"/api/v1/query?query="+url.QueryEscape(q), nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if !strings.Contains(string(body), `"pop":"ams"`) || !strings.Contains(string(body), `"pop":"fra"`) {
			return fmt.Errorf("prometheus answered %s", body)
		}
		return nil
	})
	require.NoError(t, err)
	return cr
}

// regionctl runs regionctl against the region with the canary at ams,
// then args.
func (cr *canaryRegion) regionctl(t *testing.T, cmd []string, args ...string) (string, int) {
	return cr.run(t, cmd, append([]string{"--region", "eu-west", "--canary", "ams"}, args...)...)
}

// run runs regionctl's cmd against the region with the canary flags the
// tests share (4s, 20s to load, 20 requests, the Prometheus), then args
// (which pick the region and the PoP).
func (cr *canaryRegion) run(t *testing.T, cmd []string, args ...string) (string, int) {
	var out bytes.Buffer
	all := append(append([]string{"--consul", cr.eu.HTTPAddr()}, cmd...),
		"--for", "4s", "--canary-load-timeout", "20s", "--canary-min-requests", "20", "--prometheus", cr.prom.URL)
	code := regionctl.Main(append(all, args...), func(string) string { return "" }, &out, &out)
	t.Logf("regionctl exited %d:\n%s", code, out.String())
	if strings.Contains(out.String(), "no verdict") {
		// Too few samples in the window: say how the scrapes went.
		for _, q := range []string{`sum_over_time(up{job="edges"}[30s])`, `count_over_time(up{job="edges"}[30s])`, `max_over_time(scrape_duration_seconds{job="edges"}[30s])`} {
			t.Logf("%s: %s", q, cr.query(q))
		}
	}
	return out.String(), code
}

// query answers Prometheus's instant query q as JSON (or why not).
func (cr *canaryRegion) query(q string) string {
	resp, err := http.Get(cr.prom.URL + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// never watches e until the returned stop is called, and then says
// whether version(e) ever was v.
func never(e *running, version func(*running) string, v string) (stop func() bool) {
	var seen atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = proc.PollEvery(ctx, 5*time.Millisecond, "watching", func(context.Context) error {
			if version(e) == v {
				seen.Store(true)
			}
			return fmt.Errorf("watching")
		})
	}()
	return func() bool { cancel(); <-done; return seen.Load() }
}

// runsVersion waits until version(e) is want.
func runsVersion(t *testing.T, e *running, version func(*running) string, want string) {
	t.Helper()
	err := proc.PollEvery(testenv.Within(t, 10*time.Second), 10*time.Millisecond, e.cfg.PoP+" to run "+want, func(context.Context) error {
		if v := version(e); v != want {
			return fmt.Errorf("it runs %s", v)
		}
		return nil
	})
	require.NoError(t, err)
}

func shedderVersion(e *running) string { return shedder.SettingsVersion(e.shed.Config()) }

// canaryHosts is a host table sending app.example to the pool app at
// origin, and other.example (extra) to the default pool.
func canaryHosts(origin string, extra bool) string {
	doc := fmt.Sprintf("version: 1\npools:\n  app:\n    urls: [%q]\nhosts:\n  app.example: {pool: app}\n", origin)
	if extra {
		doc += "  other.example: {pool: default}\n"
	}
	return doc
}

// TestHostsCanaryPush runs regionctl hosts push --canary on real Consul,
// two in-process edges of eu-west (PoPs ams and fra) under steady traffic
// for app.example and a real Prometheus: a table pointing app.example's
// pool at a dead origin is rolled back on ams's 5xx rate (the edge's own
// 502s), fra never runs it, the canary key is gone and ams is back on the
// region's table; a good table is promoted to the region's key, which both
// PoPs then run.
func TestHostsCanaryPush(t *testing.T) {
	// The four canary tests wait most of their time (a canary's 4 s, Prometheus's
	// scrapes), each on a region of its own: they run side by side.
	heavyWaiting(t)
	origin := testOrigin(t)
	current := canaryHosts(origin, false)
	version := func(doc string) string {
		tb, err := hosts.Parse([]byte(doc))
		require.NoError(t, err)
		return tb.Version()
	}
	v1 := version(current)
	cr := startCanaryRegion(t, "app.example", "/", func(e region.Edge) bool { return e.HostsVersion == v1 }, func(rc *region.Client) {
		_, err := rc.Push(context.Background(), "eu-west", rc.Layout().Hosts("eu-west"), []byte(current), 0,
			region.Entry{Kind: region.KindHosts, Version: v1, Author: "test", Message: "first table"})
		require.NoError(t, err)
	})
	rc, layout, ams, fra, ctx := cr.rc, cr.rc.Layout(), cr.ams, cr.fra, cr.ctx
	hostsVersion := func(e *running) string { return e.origins.Router.Version() }
	canary := func(t *testing.T, doc string) (string, int) {
		file := filepath.Join(t.TempDir(), "hosts.yaml")
		require.NoError(t, os.WriteFile(file, []byte(doc), 0o600))
		return cr.regionctl(t, []string{"hosts", "push"}, "--yes", file)
	}
	noKey := func(t *testing.T) {
		t.Helper()
		v, _, err := rc.Get(ctx, "eu-west", layout.HostsCanary("eu-west", "ams"))
		require.NoError(t, err)
		require.Nil(t, v, "the canary key was left behind")
	}

	t.Run("dead origin rolled back", func(t *testing.T) {
		dead := canaryHosts("http://"+testenv.ClosedAddr(t), false)
		bad := version(dead)
		fraRan := never(fra, hostsVersion, bad)
		out, code := canary(t, dead)
		fraRanBad := fraRan()
		require.Equal(t, regionctl.ExitRolledBack, code, out)
		require.Contains(t, out, "runs host table version "+bad, "ams loaded the candidate before it was judged")
		require.Contains(t, out, "canary rolled back: 5xx rate")
		require.False(t, fraRanBad, "fra ran the canary's table")
		noKey(t)
		runsVersion(t, ams, hostsVersion, v1)
		stored, _, err := rc.Get(ctx, "eu-west", layout.Hosts("eu-west"))
		require.NoError(t, err)
		require.Equal(t, current, string(stored), "nothing was written region-wide")
	})

	t.Run("good table promoted", func(t *testing.T) {
		next := canaryHosts(origin, true)
		good := version(next)
		out, code := canary(t, next)
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "runs host table version "+good)
		require.Contains(t, out, "canary promoted\neu-west: ok: pushed ")
		noKey(t)
		runsVersion(t, fra, hostsVersion, good)
		runsVersion(t, ams, hostsVersion, good)
		stored, _, err := rc.Get(ctx, "eu-west", layout.Hosts("eu-west"))
		require.NoError(t, err)
		require.Equal(t, next, string(stored))
	})
	require.Positive(t, cr.sent.Load())
}
