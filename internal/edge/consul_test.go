package edge

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/buildinfo"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/regionctl"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// tightGlobal admits a client 2 requests an hour. A sliding log, not a
// fixed window: a fixed window of an hour starts again on the hour, and a
// test that ran across it (a document refused after tens of seconds on a
// busy machine) saw its third request admitted.
const tightGlobal = `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_log
    limit: 2
    window: 1h
`

// startConsulEdge starts an in-process edge of region whose rules come from
// the Consul agent at addr; opts change its configuration further.
func startConsulEdge(t *testing.T, regionName, pop, addr, cache string, opts ...func(*config.Config)) *running {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Origins = []string{testOrigin(t)}
	cfg.DrainDelay = 0
	cfg.Region, cfg.PoP = regionName, pop
	cfg.AdminToken = testAdminToken
	cfg.Consul, cfg.RulesCache = addr, cache
	for _, o := range opts {
		o(&cfg)
	}
	e, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Edge: e, done: make(chan error, 1)}
	go func() { r.done <- e.Run(ctx) }()
	stopped := false
	r.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			r.stopErr = <-r.done
		}
	}
	t.Cleanup(r.stop)
	return r
}

// regionctlRun runs the operator CLI in-process.
func regionctlRun(t *testing.T, args ...string) (string, int) {
	var out bytes.Buffer
	code := regionctl.Main(args, func(string) string { return "" }, &out, &out)
	return out.String(), code
}

func regionClient(t *testing.T, c *testenv.Consul) *region.Client {
	cfg := api.DefaultConfig()
	cfg.Address = c.HTTPAddr()
	rc, err := region.NewClient(cfg, "")
	require.NoError(t, err)
	return rc
}

// push writes a document with check-and-set, as regionctl does.
func push(t *testing.T, rc *region.Client, regionName, key, doc string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, idx, err := rc.Get(ctx, regionName, key)
	require.NoError(t, err)
	_, err = rc.Push(ctx, regionName, key, []byte(doc), idx, region.Entry{Kind: region.KindGlobalRules, Author: "test", Message: "test push"})
	require.NoError(t, err)
}

// waitVersion waits until r runs version want and returns how long after
// since that was.
func waitVersion(t *testing.T, r *running, want string, since time.Time) time.Duration {
	t.Helper()
	what := fmt.Sprintf("edge %s/%s to run version %s", r.cfg.Region, r.cfg.PoP, want)
	err := proc.PollEvery(testenv.Within(t, 10*time.Second), 10*time.Millisecond, what, func(context.Context) error {
		if v := r.rules.Load().Version(); v != want {
			return fmt.Errorf("it runs %s", v)
		}
		return nil
	})
	require.NoError(t, err)
	return time.Since(since)
}

func effectiveVersion(t *testing.T, global, regional string) string {
	parse := func(s string) *rules.Document {
		if s == "" {
			return nil
		}
		d, err := rules.Parse([]byte(s))
		require.NoError(t, err)
		return d
	}
	doc, err := rules.Merge(parse(global), parse(regional))
	require.NoError(t, err)
	return rules.Version(doc)
}

func TestRulesFromConsulAcrossRegions(t *testing.T) {
	eu, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer eu.Close()
	us, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "us-east"})
	require.NoError(t, err)
	defer us.Close()
	require.NoError(t, eu.JoinWAN(us))
	rc := regionClient(t, eu) // one agent writes both regions over the WAN
	layout := rc.Layout()
	cacheDir := t.TempDir()

	a := startConsulEdge(t, "eu-west", "ams", eu.HTTPAddr(), filepath.Join(cacheDir, "a.yaml"))
	a2 := startConsulEdge(t, "eu-west", "fra", eu.HTTPAddr(), filepath.Join(cacheDir, "a2.yaml"))
	b := startConsulEdge(t, "us-east", "iad", us.HTTPAddr(), filepath.Join(cacheDir, "b.yaml"))

	// regionctl pushes to every region; every edge picks it up, live.
	v1 := effectiveVersion(t, tightGlobal, "")
	rulesFile := filepath.Join(t.TempDir(), "global.yaml")
	require.NoError(t, os.WriteFile(rulesFile, []byte(tightGlobal), 0o600))
	pushed := time.Now()
	out, code := regionctlRun(t, "--consul", eu.HTTPAddr(), "rules", "push", "--all", "--message", "tight per-ip", rulesFile)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "one by one")
	for _, r := range []*running{a, a2, b} {
		took := waitVersion(t, r, v1, pushed)
		t.Logf("%s/%s converged on %s %s after the push began (regions are written one by one)", r.cfg.Region, r.cfg.PoP, v1, took.Round(time.Millisecond))
		require.Equal(t, []int{200, 200, 429}, codes(t, r, 3, "/"))
	}

	// The catalog: both eu-west edges registered with the version they run,
	// and they divide the fallback's limits between them.
	waitHealthyInCatalog(t, eu, rc, "eu-west", "both eu-west edges healthy on "+v1+" in the catalog", healthy(2, func(e region.Edge) bool { return e.RulesVersion == v1 }), a, a2)
	// Each with its release and the document schemas it reads, for
	// regionctl's check that a push is readable by every edge.
	edges, _, err := rc.Edges(context.Background(), "eu-west", 0, 0)
	require.NoError(t, err)
	require.Len(t, edges, 2)
	for _, e := range edges {
		require.Equal(t, buildinfo.Get().Version, e.Version, e.ID)
		require.Equal(t, region.DocumentSchemas.Reads(), e.Schemas, e.ID)
	}
	require.Eventually(t, func() bool { return a.nodesRegion.Load() == 2 && a.nodesPoP.Load() == 1 }, 10*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		out, code := regionctlRun(t, "--consul", eu.HTTPAddr(), "regions", "status")
		return code == 0 && !strings.Contains(out, "NOT CONVERGED")
	}, 15*time.Second, 200*time.Millisecond, "regionctl regions status sees every edge converged")

	// A region document overrides the global one in its region only.
	off := "version: 1\nrules:\n  - id: per-ip\n    disabled: true\n"
	push(t, rc, "eu-west", layout.RegionRules("eu-west"), off)
	waitVersion(t, a, effectiveVersion(t, tightGlobal, off), time.Now())
	require.Equal(t, []int{200, 200, 200}, codes(t, a, 3, "/"))
	require.Equal(t, []int{429}, codes(t, b, 1, "/"), "us-east still enforces")

	// A hand-written invalid document is refused; the edge keeps its rules.
	before := a.rules.Load().Version()
	kv := rc.API().KV()
	_, err = kv.Put(&api.KVPair{Key: layout.RegionRules("eu-west"), Value: []byte("version: 1\nrules:\n  - id: per-ip\n    limit: -5\n")}, &api.WriteOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return metricValue(t, a, "edgeguard_edge_rules_rejected_total") >= 1
	}, 5*time.Second, 20*time.Millisecond)
	require.Equal(t, before, a.rules.Load().Version())

	// Shedder settings change live.
	_, err = kv.Put(&api.KVPair{Key: layout.Shedder("eu-west"), Value: []byte(`{"good": 0.65, "bad": 0.85, "adaptive": {"enabled": true, "max_limit": 300}}`)}, &api.WriteOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return a.shed.Config().Good == 0.65 }, 5*time.Second, 20*time.Millisecond)
	require.True(t, a.shed.Adaptive().State().Enabled, "the adaptive origin limit is switched on live")
	require.Equal(t, 300, a.shed.Config().Adaptive.MaxLimit)
	require.Equal(t, 0.7, b.shed.Config().Good, "other regions keep theirs")
	require.False(t, b.shed.Adaptive().State().Enabled)

	// Consul down: the edges keep enforcing what they run.
	// The witness that it noticed: its watches report the failure.
	failed := metricValue(t, b, "edgeguard_edge_consul_errors_total")
	require.NoError(t, us.Stop())
	require.Eventually(t, func() bool { return metricValue(t, b, "edgeguard_edge_consul_errors_total") > failed },
		10*time.Second, 20*time.Millisecond, "the edge notices consul is gone")
	require.Equal(t, v1, b.rules.Load().Version())
	require.Equal(t, []int{429}, codes(t, b, 1, "/"))
	resp, err := http.Get("http://" + b.AdminAddr() + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)

	// An edge restarted while Consul is down enforces the cached rules.
	b.stop()
	b2 := startConsulEdge(t, "us-east", "iad", us.HTTPAddr(), filepath.Join(cacheDir, "b.yaml"))
	require.Equal(t, v1, b2.rules.Load().Version())
	require.Equal(t, []int{200, 200, 429}, codes(t, b2, 3, "/"))
}

// badManifest is the document of issue 24: a rules manifest whose size is
// -1, which once panicked the parts reader (makeslice) in every edge of the
// region and again at every restart.
const badManifest = `{"kind":"edgeguard-rules-parts/v1","version":"0123456789ab","size": -1,` +
	`"sha256":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",` +
	`"parts":[{"key":"edgeguard/parts/e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","size":10,` +
	`"sha256":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}]}`

// A bad manifest in Consul is refused: the running edge keeps its rules and
// keeps serving, and an edge restarted with that document in Consul starts
// with the rules cached on disk.
func TestBadManifestKeepsRules(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	rc := regionClient(t, c)
	cache := filepath.Join(t.TempDir(), "rules.yaml")
	push(t, rc, "eu-west", rc.Layout().GlobalRules(), tightGlobal)
	v1 := effectiveVersion(t, tightGlobal, "")

	a := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), cache)
	waitVersion(t, a, v1, time.Now())
	require.Equal(t, []int{200, 200, 429}, codes(t, a, 3, "/"))

	_, err = rc.API().KV().Put(&api.KVPair{Key: rc.Layout().GlobalRules(), Value: []byte(badManifest)}, &api.WriteOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return metricValue(t, a, "edgeguard_edge_rules_rejected_total") >= 1
	}, 10*time.Second, 20*time.Millisecond, "the bad manifest is refused")
	require.Equal(t, v1, a.rules.Load().Version())
	require.Equal(t, []int{429}, codes(t, a, 1, "/"), "the rules in force stay")
	require.Zero(t, metricValue(t, a, "edgeguard_edge_consul_panics_total"))
	a.stop()
	require.NoError(t, a.stopErr)

	// A restart reads the same document at start: refused, the cache serves.
	b := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), cache)
	require.Equal(t, v1, b.rules.Load().Version())
	require.Equal(t, []int{200, 200, 429}, codes(t, b, 3, "/"))
	resp, err := http.Get("http://" + b.AdminAddr() + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
}

// Without --rules-cache the last good rules go to the service's state
// directory, else /var/lib/edgeguard, else the user cache dir: never the
// temporary directory.
func TestRulesCacheDefault(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	rc := regionClient(t, c)
	push(t, rc, "eu-west", rc.Layout().GlobalRules(), tightGlobal)
	v1 := effectiveVersion(t, tightGlobal, "")

	notADir := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(notADir, nil, 0o600))
	for _, tc := range []struct {
		name                     string
		stateDirectory, stateDir string // "" unset; stateDir "-" not writable
		userCache                bool
		want                     string // under which dir ("state", "varlib", "cache", "" none)
	}{
		{"systemd's state directory", "state", "-", true, "state"},
		{"/var/lib/edgeguard when writable", "", "varlib", true, "varlib"},
		{"the user cache dir", "", "-", true, "cache"},
		{"no cache rather than the temporary directory", "", "-", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dirs := map[string]string{"state": t.TempDir(), "varlib": t.TempDir(), "cache": t.TempDir()}
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			t.Setenv("STATE_DIRECTORY", "")
			if tc.stateDirectory != "" {
				t.Setenv("STATE_DIRECTORY", dirs[tc.stateDirectory]+":"+t.TempDir())
			}
			saved := stateDir
			t.Cleanup(func() { stateDir = saved })
			stateDir = filepath.Join(notADir, "edgeguard")
			if tc.stateDir == "varlib" {
				stateDir = dirs["varlib"]
			}
			t.Setenv("HOME", "")
			t.Setenv("XDG_CACHE_HOME", "")
			if tc.userCache {
				t.Setenv("XDG_CACHE_HOME", dirs["cache"])
			}

			a := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), "")
			waitVersion(t, a, v1, time.Now())
			a.stop()
			want := map[string]string{
				"state":  filepath.Join(dirs["state"], "rules-eu-west.yaml"),
				"varlib": filepath.Join(dirs["varlib"], "rules-eu-west.yaml"),
				"cache":  filepath.Join(dirs["cache"], "edgeguard", "rules-eu-west.yaml"),
			}
			for name, path := range want {
				_, err := os.Stat(path)
				if name == tc.want {
					require.NoError(t, err, "the rules are cached in %s", path)
				} else {
					require.ErrorIs(t, err, os.ErrNotExist, "nothing cached in %s", path)
				}
			}
			left, err := os.ReadDir(tmp)
			require.NoError(t, err)
			require.Empty(t, left, "nothing cached in the temporary directory")
		})
	}
}
