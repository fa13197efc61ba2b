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
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/regionctl"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

const canaryGlobal = `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: fixed_window
    limit: 1000000
    window: 1h
`

// A region document that keeps the edges' behaviour: a looser limit.
const canaryGood = `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: fixed_window
    limit: 2000000
    window: 1h
`

// A region document a slip could produce: a rule of one request per hour
// per path, so nearly every request is denied.
const canaryBad = `
version: 1
rules:
  - id: slip
    key: [path]
    algorithm: sliding_window
    limit: 1
    window: 1h
`

// TestCanaryPush runs regionctl rules push --canary on real Consul, two
// in-process edges of eu-west (PoPs ams and fra) under steady traffic and
// a real Prometheus scraping them every second with their region and pop
// as target labels: a good region document is promoted (region-wide, with
// history); a bad one (its deny rate jumps) is rolled back, and fra never
// runs it.
func TestCanaryPush(t *testing.T) {
	eu, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer eu.Close()
	rc := regionClient(t, eu)
	layout := rc.Layout()
	push(t, rc, "eu-west", layout.GlobalRules(), canaryGlobal)
	cache := t.TempDir()
	ams := startConsulEdge(t, "eu-west", "ams", eu.HTTPAddr(), filepath.Join(cache, "ams.yaml"))
	fra := startConsulEdge(t, "eu-west", "fra", eu.HTTPAddr(), filepath.Join(cache, "fra.yaml"))
	v0 := effectiveVersion(t, canaryGlobal, "")
	waitVersion(t, ams, v0, time.Now())
	waitVersion(t, fra, v0, time.Now())

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

	// Both edges healthy in the catalog: the canary compares ams with fra.
	err = proc.PollEvery(testenv.Within(t, 20*time.Second), 100*time.Millisecond, "both edges healthy in the catalog", func(ctx context.Context) error {
		edges, _, err := rc.Edges(ctx, "eu-west", 0, 0)
		if err != nil {
			return err
		}
		healthy := 0
		for _, e := range edges {
			if e.Healthy {
				healthy++
			}
		}
		if healthy != 2 {
			return fmt.Errorf("%d of %d healthy", healthy, len(edges))
		}
		return nil
	})
	require.NoError(t, err)

	// Steady traffic to both PoPs until the test ends, ~50 requests/s each.
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
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.Addr()+"/", nil)
				if resp, err := c.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					sent.Add(1)
				}
			}
		})
	}

	// Prometheus holds both PoPs' traffic before any canary is judged.
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

	canary := func(t *testing.T, doc string) (string, int) {
		file := filepath.Join(t.TempDir(), "region.yaml")
		require.NoError(t, os.WriteFile(file, []byte(doc), 0o600))
		var out bytes.Buffer
		code := regionctl.Main([]string{"--consul", eu.HTTPAddr(), "rules", "push", "--region", "eu-west",
			"--canary", "ams", "--for", "4s", "--canary-load-timeout", "20s", "--canary-min-requests", "20",
			"--prometheus", prom.URL, file}, func(string) string { return "" }, &out, &out)
		t.Logf("regionctl exited %d:\n%s", code, out.String())
		return out.String(), code
	}

	t.Run("bad document rolled back", func(t *testing.T) {
		bad := effectiveVersion(t, canaryGlobal, canaryBad)
		// fra is watched all along: it must never run the candidate.
		var fraRanBad atomic.Bool
		watchCtx, watchStop := context.WithCancel(context.Background())
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			_ = proc.PollEvery(watchCtx, 5*time.Millisecond, "fra never runs the candidate", func(context.Context) error {
				if fra.rules.Load().Version() == bad {
					fraRanBad.Store(true)
				}
				return fmt.Errorf("watching")
			})
		}()
		out, code := canary(t, canaryBad)
		watchStop()
		<-watched
		require.Equal(t, regionctl.ExitRolledBack, code, out)
		require.Contains(t, out, "runs rules version "+bad, "ams loaded the candidate before it was judged")
		require.Contains(t, out, "canary rolled back: deny rate")
		require.False(t, fraRanBad.Load(), "fra ran the canary's document")
		// The key is gone and ams runs the region's document again.
		v, _, err := rc.Get(ctx, "eu-west", layout.RulesCanary("eu-west", "ams"))
		require.NoError(t, err)
		require.Nil(t, v)
		waitVersion(t, ams, v0, time.Now())
		// And serves again: the keys the candidate denied are let through
		// (the prefilter forgets them), before the next canary is judged.
		err = proc.PollEvery(testenv.Within(t, 20*time.Second), 50*time.Millisecond, "ams to let requests through again", func(ctx context.Context) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ams.Addr()+"/", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("ams answered %d", resp.StatusCode)
			}
			return nil
		})
		require.NoError(t, err)
		region, _, err := rc.Get(ctx, "eu-west", layout.RegionRules("eu-west"))
		require.NoError(t, err)
		require.Nil(t, region, "nothing was pushed region-wide")
	})

	t.Run("good document promoted", func(t *testing.T) {
		good := effectiveVersion(t, canaryGlobal, canaryGood)
		out, code := canary(t, canaryGood)
		if code != 0 {
			q := `sum by (pop, reason, decision) (increase(edgeguard_edge_decisions_total[6s]))`
			resp, err := http.Get(prom.URL + "/api/v1/query?query=" + url.QueryEscape(q))
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Logf("decisions: %s", b)
			}
		}
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "runs rules version "+good)
		require.Contains(t, out, "canary promoted")
		waitVersion(t, fra, good, time.Now())
		waitVersion(t, ams, good, time.Now())
		v, _, err := rc.Get(ctx, "eu-west", layout.RulesCanary("eu-west", "ams"))
		require.NoError(t, err)
		require.Nil(t, v)
		hist, err := rc.History(ctx, "eu-west", "rules/region")
		require.NoError(t, err)
		require.Len(t, hist, 1, "the promotion is in the history, so rules rollback restores the previous document")
		require.Equal(t, strings.TrimSpace(canaryGood), strings.TrimSpace(hist[0].Document))
	})
	require.Positive(t, sent.Load())
}

// lockedBuffer is an output both regionctl (writing) and the test (reading
// as it runs) use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A canary that cannot be judged (Prometheus unreachable) or is
// interrupted (SIGINT, as Ctrl-C sends) leaves no canary key behind: the
// PoP returns to the region's rules, and regionctl says why it stopped.
func TestCanaryNeverLeftBehind(t *testing.T) {
	eu, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer eu.Close()
	rc := regionClient(t, eu)
	layout := rc.Layout()
	push(t, rc, "eu-west", layout.GlobalRules(), canaryGlobal)
	cache := t.TempDir()
	ams := startConsulEdge(t, "eu-west", "ams", eu.HTTPAddr(), filepath.Join(cache, "ams.yaml"))
	startConsulEdge(t, "eu-west", "fra", eu.HTTPAddr(), filepath.Join(cache, "fra.yaml"))
	v0 := effectiveVersion(t, canaryGlobal, "")
	waitVersion(t, ams, v0, time.Now())
	err = proc.PollEvery(testenv.Within(t, 20*time.Second), 100*time.Millisecond, "both edges healthy in the catalog", func(ctx context.Context) error {
		edges, _, err := rc.Edges(ctx, "eu-west", 0, 0)
		if err != nil {
			return err
		}
		inRegion := 0
		for _, e := range edges {
			if e.Healthy {
				inRegion++
			}
		}
		if inRegion != 2 {
			return fmt.Errorf("%d healthy", inRegion)
		}
		return nil
	})
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "region.yaml")
	require.NoError(t, os.WriteFile(file, []byte(canaryGood), 0o600))
	good := effectiveVersion(t, canaryGlobal, canaryGood)
	args := func(prom, dur string) []string {
		return []string{"--consul", eu.HTTPAddr(), "rules", "push", "--region", "eu-west",
			"--canary", "ams", "--for", dur, "--canary-load-timeout", "20s", "--prometheus", prom, file}
	}
	noCanary := func(t *testing.T) {
		t.Helper()
		v, _, err := rc.Get(context.Background(), "eu-west", layout.RulesCanary("eu-west", "ams"))
		require.NoError(t, err)
		require.Nil(t, v, "the canary key was left behind")
		waitVersion(t, ams, v0, time.Now())
		region, _, err := rc.Get(context.Background(), "eu-west", layout.RegionRules("eu-west"))
		require.NoError(t, err)
		require.Nil(t, region, "nothing was promoted")
	}

	t.Run("prometheus unreachable", func(t *testing.T) {
		var out bytes.Buffer
		code := regionctl.Main(args("http://"+testenv.ClosedAddr(t), "1s"), func(string) string { return "" }, &out, &out)
		require.Equal(t, regionctl.ExitError, code, out.String())
		require.Contains(t, out.String(), "runs rules version "+good)
		require.Contains(t, out.String(), "judging the canary of eu-west at PoP ams")
		require.Contains(t, out.String(), `msg="canary key deleted"`)
		noCanary(t)
	})

	t.Run("interrupted", func(t *testing.T) {
		out := &lockedBuffer{}
		done := make(chan int, 1)
		go func() {
			done <- regionctl.Main(args("http://"+testenv.ClosedAddr(t), "1m"), func(string) string { return "" }, out, out)
		}()
		err := proc.PollEvery(testenv.Within(t, 30*time.Second), 20*time.Millisecond, "the canary to be judged", func(context.Context) error {
			if !strings.Contains(out.String(), "judging it for 1m") {
				return fmt.Errorf("regionctl printed %q", out.String())
			}
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, good, ams.rules.Load().Version(), "ams runs the candidate")
		require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGINT))
		select {
		case code := <-done:
			require.Equal(t, regionctl.ExitError, code, out.String())
		case <-time.After(20 * time.Second):
			t.Fatalf("regionctl did not stop on SIGINT:\n%s", out.String())
		}
		require.Contains(t, out.String(), "interrupted during the canary of eu-west at PoP ams")
		noCanary(t)
	})
}
