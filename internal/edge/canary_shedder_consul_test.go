package edge

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
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
	eu, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer eu.Close()
	rc := regionClient(t, eu)
	layout := rc.Layout()
	push(t, rc, "eu-west", layout.GlobalRules(), canaryGlobal)
	cache := t.TempDir()
	workers := func(c *config.Config) { c.Workers = 16 }
	ams := startConsulEdge(t, "eu-west", "ams", eu.HTTPAddr(), filepath.Join(cache, "ams.yaml"), workers)
	fra := startConsulEdge(t, "eu-west", "fra", eu.HTTPAddr(), filepath.Join(cache, "fra.yaml"), workers)
	v0 := shedder.SettingsVersion(shedder.DefaultConfig())
	settingsOf := func(kv map[string]string) string {
		cfg, err := shedder.ApplySettings(shedder.DefaultConfig(), kv)
		require.NoError(t, err)
		return shedder.SettingsVersion(cfg)
	}

	prom, err := testenv.StartPrometheus(testenv.PrometheusOptions{ScrapeInterval: time.Second, Jobs: []testenv.ScrapeJob{{
		Name:    "edges",
		Targets: []string{ams.AdminAddr(), fra.AdminAddr()},
		TargetLabels: map[string]map[string]string{
			ams.AdminAddr(): {"region": "eu-west", "pop": "ams"},
			fra.AdminAddr(): {"region": "eu-west", "pop": "fra"},
		},
	}}})
	require.NoError(t, err)
	defer prom.Close()

	// Both edges healthy in the catalog, reporting the starting settings.
	err = proc.PollEvery(testenv.Within(t, 20*time.Second), 100*time.Millisecond, "both edges healthy with the default shedder settings", func(ctx context.Context) error {
		edges, _, err := rc.Edges(ctx, "eu-west", 0, 0)
		if err != nil {
			return err
		}
		ok := 0
		for _, e := range edges {
			if e.Healthy && e.ShedderVersion == v0 {
				ok++
			}
		}
		if ok != 2 {
			return fmt.Errorf("%d of %v", ok, edges)
		}
		return nil
	})
	require.NoError(t, err)

	// Steady traffic to both PoPs, ~50 requests/s each, each held 40ms
	// at the origin: about two of 16 workers busy, 12% utilization.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	var sent atomic.Int64
	for _, e := range []*running{ams, fra} {
		wg.Go(func() {
			c := &http.Client{Timeout: 2 * time.Second}
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				wg.Go(func() {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.Addr()+"/slow?ms=40", nil)
					if resp, err := c.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						sent.Add(1)
					}
				})
			}
		})
	}
	err = proc.PollEvery(testenv.Within(t, 30*time.Second), 200*time.Millisecond, "prometheus to see both PoPs' requests", func(ctx context.Context) error {
		q := `count by (pop) (rate(edgeguard_edge_requests_total{region="eu-west"}[5s]) > 0)`
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, prom.URL+"/api/v1/query?query="+url.QueryEscape(q), nil)
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

	canary := func(t *testing.T, settings ...string) (string, int) {
		var out bytes.Buffer
		args := append([]string{"--consul", eu.HTTPAddr(), "shedder", "set", "--region", "eu-west",
			"--canary", "ams", "--for", "4s", "--canary-load-timeout", "20s", "--canary-min-requests", "20",
			"--prometheus", prom.URL}, settings...)
		code := regionctl.Main(args, func(string) string { return "" }, &out, &out)
		t.Logf("regionctl exited %d:\n%s", code, out.String())
		return out.String(), code
	}
	noKey := func(t *testing.T) {
		t.Helper()
		v, _, err := rc.Get(ctx, "eu-west", layout.ShedderCanary("eu-west", "ams"))
		require.NoError(t, err)
		require.Nil(t, v, "the canary key was left behind")
	}
	runs := func(t *testing.T, e *running, want string) {
		t.Helper()
		err := proc.PollEvery(testenv.Within(t, 10*time.Second), 10*time.Millisecond, e.cfg.PoP+" to run shedder settings "+want, func(context.Context) error {
			if v := shedder.SettingsVersion(e.shed.Config()); v != want {
				return fmt.Errorf("it runs %s", v)
			}
			return nil
		})
		require.NoError(t, err)
	}

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
		var fraRanBad atomic.Bool
		watchCtx, watchStop := context.WithCancel(context.Background())
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			_ = proc.PollEvery(watchCtx, 5*time.Millisecond, "fra never runs the candidate", func(context.Context) error {
				if shedder.SettingsVersion(fra.shed.Config()) == bad {
					fraRanBad.Store(true)
				}
				return fmt.Errorf("watching")
			})
		}()
		out, code := canary(t, "good=0.01", "bad=0.02", "start_after=100ms", "full_after=100ms")
		watchStop()
		<-watched
		require.Equal(t, regionctl.ExitRolledBack, code, out)
		require.Contains(t, out, "runs shedder settings version "+bad, "ams loaded the candidate before it was judged")
		require.Contains(t, out, "canary rolled back: shed rate")
		require.False(t, fraRanBad.Load(), "fra ran the canary's settings")
		noKey(t)
		runs(t, ams, promoted)
		hist, err := rc.History(ctx, "eu-west", region.KindShedder)
		require.NoError(t, err)
		require.Len(t, hist, 1, "nothing was written region-wide")
	})

	require.Positive(t, sent.Load())
}
