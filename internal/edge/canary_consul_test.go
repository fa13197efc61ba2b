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
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/regionctl"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
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
	// The four canary tests wait most of their time (a canary's 4 s, Prometheus's
	// scrapes), each on a region of its own: they run side by side.
	heavyWaiting(t)
	v0 := effectiveVersion(t, canaryGlobal, "")
	cr := startCanaryRegion(t, "", "/", func(e region.Edge) bool { return e.RulesVersion == v0 }, nil)
	rc, layout, ams, fra, ctx, prom := cr.rc, cr.rc.Layout(), cr.ams, cr.fra, cr.ctx, cr.prom
	canary := func(t *testing.T, doc string) (string, int) {
		file := filepath.Join(t.TempDir(), "region.yaml")
		require.NoError(t, os.WriteFile(file, []byte(doc), 0o600))
		return cr.regionctl(t, []string{"rules", "push"}, file)
	}

	t.Run("bad document rolled back", func(t *testing.T) {
		bad := effectiveVersion(t, canaryGlobal, canaryBad)
		// fra is watched all along: it must never run the candidate.
		fraRan := never(fra, rulesVersion, bad)
		out, code := canary(t, canaryBad)
		fraRanBad := fraRan()
		require.Equal(t, regionctl.ExitRolledBack, code, out)
		require.Contains(t, out, "runs rules version "+bad, "ams loaded the candidate before it was judged")
		require.Contains(t, out, "canary rolled back: deny rate")
		require.False(t, fraRanBad, "fra ran the canary's document")
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
		stored, _, err := rc.Get(ctx, "eu-west", layout.RegionRules("eu-west"))
		require.NoError(t, err)
		require.Nil(t, stored, "nothing was pushed region-wide")
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
		// Judged on figures that reach the window's end: Prometheus
		// held scrapes of both PoPs since it ended.
		require.Contains(t, out, "scraped_to_end=true")
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
	require.Positive(t, cr.sent.Load())
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
	fra := startConsulEdge(t, "eu-west", "fra", eu.HTTPAddr(), filepath.Join(cache, "fra.yaml"))
	v0 := effectiveVersion(t, canaryGlobal, "")
	waitVersion(t, ams, v0, time.Now())
	waitHealthyInCatalog(t, eu, rc, "eu-west", "both edges healthy in the catalog", healthy(2, nil), ams, fra)
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
