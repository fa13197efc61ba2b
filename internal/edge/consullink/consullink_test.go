package consullink_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/consullink"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

const (
	regionName = "eu-west"
	rulesV1    = "version: 1\nrules:\n  - {id: per-ip, key: [ip], algorithm: fixed_window, limit: 2, window: 1h}\n"
	rulesV2    = "version: 1\nrules:\n  - {id: per-ip, key: [ip], algorithm: fixed_window, limit: 3, window: 1h}\n"
	// rulesBad does not compile: the link hands ApplySnapshot the error.
	rulesBad = "version: 1\nrules:\n  - {id: per-ip, key: [ip], algorithm: no_such_algorithm, limit: 2, window: 1h}\n"
)

// fakeEdge is the edge's side of Parts: the rules, switch and shedder
// settings in force, and how often each was set.
type fakeEdge struct {
	rules       atomic.Pointer[rules.Snapshot]
	applied     atomic.Int32 // snapshots swapped in
	refused     atomic.Int32 // ApplySnapshot called with an error
	mu          sync.Mutex
	enforcement region.Enforcement
	setEnf      atomic.Int32
	shed        shedder.Config
	updShed     atomic.Int32
	startShed   atomic.Int32
	inRegion    atomic.Int32
	inPoP       atomic.Int32
}

func (e *fakeEdge) parts() consullink.Parts {
	return consullink.Parts{
		Rules: fakeRules{e}, Switch: fakeSwitch{e}, Shedder: fakeShedder{e},
		SetEdges: func(inRegion, inPoP int) {
			e.inRegion.Store(int32(inRegion))
			e.inPoP.Store(int32(inPoP))
		},
	}
}

// fakeRules, fakeSwitch and fakeShedder are the fake edge as the link's
// parts.
type (
	fakeRules   struct{ e *fakeEdge }
	fakeSwitch  struct{ e *fakeEdge }
	fakeShedder struct{ e *fakeEdge }
)

func (r fakeRules) Load() *rules.Snapshot                 { return r.e.rules.Load() }
func (r fakeRules) CompileOptions() []rules.CompileOption { return nil }
func (r fakeRules) Apply(data []byte) error               { return r.ApplySnapshot(rules.Load(data)) }
func (r fakeRules) ApplySnapshot(snap *rules.Snapshot, err error) error {
	if err != nil {
		r.e.refused.Add(1)
		return err
	}
	r.e.rules.Store(snap)
	r.e.applied.Add(1)
	return nil
}

func (s fakeSwitch) Enforcement() (region.Enforcement, bool) { return s.e.switchInForce(), true }
func (s fakeSwitch) SetEnforcement(en region.Enforcement) {
	s.e.mu.Lock()
	s.e.enforcement = en
	s.e.mu.Unlock()
	s.e.setEnf.Add(1)
}

func (s fakeShedder) Update(c shedder.Config) error {
	s.e.mu.Lock()
	s.e.shed = c
	s.e.mu.Unlock()
	s.e.updShed.Add(1)
	return nil
}

func (s fakeShedder) Config() shedder.Config {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return s.e.shed
}

func (s fakeShedder) Start() error { s.e.startShed.Add(1); return nil }

func (e *fakeEdge) switchInForce() region.Enforcement {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.enforcement
}

func (e *fakeEdge) version() string { return e.rules.Load().Version() }

// link is a Link under test with its edge and counters.
type link struct {
	*consullink.Link
	edge        *fakeEdge
	errors      prometheus.Counter
	rulesErrors prometheus.Counter
	missing     *prometheus.GaugeVec
	client      *region.Client
}

func (l *link) missingGauge(doc string) float64 {
	return testutil.ToFloat64(l.missing.WithLabelValues(doc))
}

// newLink links an edge of eu-west/ams to the agent at addr, keeping its
// rules in cache ("" none).
func newLink(t *testing.T, addr, cache string, mod ...func(*consullink.Config)) *link {
	t.Helper()
	l := &link{
		edge:        &fakeEdge{},
		errors:      prometheus.NewCounter(prometheus.CounterOpts{Name: "errors"}),
		rulesErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "rules_errors"}),
		missing:     consullink.NewMissingGauge(),
		client:      regionClient(t, addr),
	}
	cfg := consullink.Config{
		Client: l.client, Region: regionName, PoP: "ams", CachePath: cache,
		Reg: region.Registration{ID: "edge-test", Region: regionName, PoP: "ams", Port: 8080, CheckURL: "http://" + testenv.ClosedAddr(t) + "/readyz"},
		Log: slog.New(slog.DiscardHandler),
		Metrics: consullink.Metrics{
			Errors:      l.errors,
			Panics:      prometheus.NewCounter(prometheus.CounterOpts{Name: "panics"}),
			RulesErrors: l.rulesErrors,
			Missing:     l.missing,
		},
		Parts: l.edge.parts(),
	}
	for _, m := range mod {
		m(&cfg)
	}
	l.Link = consullink.New(cfg)
	return l
}

func regionClient(t *testing.T, addr string) *region.Client {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address = addr
	rc, err := region.NewClient(cfg, "")
	require.NoError(t, err)
	t.Cleanup(cfg.Transport.CloseIdleConnections)
	return rc
}

// run runs l's watches until the test ends, and waits for Run to return.
func (l *link) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func startConsul(t *testing.T) *testenv.Consul {
	t.Helper()
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: regionName})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func put(t *testing.T, rc *region.Client, key, value string) {
	t.Helper()
	_, err := rc.API().KV().Put(&api.KVPair{Key: key, Value: []byte(value)}, nil)
	require.NoError(t, err)
}

func del(t *testing.T, rc *region.Client, key string) {
	t.Helper()
	_, err := rc.API().KV().Delete(key, nil)
	require.NoError(t, err)
}

func version(t *testing.T, global string) string {
	t.Helper()
	snap, _, err := rules.Effective([]byte(global), nil)
	require.NoError(t, err)
	return snap.Version()
}

// cachedOr is the version of the rules cached at path, "" while there is
// none (for polling: it never fails the test from the poller).
func cachedOr(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	snap, err := rules.Load(data)
	if err != nil {
		return ""
	}
	return snap.Version()
}

// cachedVersion is the version of the rules cached at path.
func cachedVersion(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	snap, err := rules.Load(data)
	require.NoError(t, err)
	return snap.Version()
}

const wait, tick = 15 * time.Second, 10 * time.Millisecond

// ReadRules applies the rules in Consul and caches them; an edge started
// again without them in Consul runs the cache: reported missing when
// Consul answers with no document, not when Consul is unreachable; with
// no cache and no document there are no rules and nothing is missing.
func TestReadRulesFromConsulOrTheCache(t *testing.T) {
	c := startConsul(t)
	rc := regionClient(t, c.HTTPAddr())
	put(t, rc, rc.Layout().GlobalRules(), rulesV1)
	v1 := version(t, rulesV1)
	cache := filepath.Join(t.TempDir(), "not", "yet", "rules.yaml")

	first := newLink(t, c.HTTPAddr(), cache)
	first.ReadRules(context.Background())
	require.Equal(t, v1, first.edge.version())
	require.Equal(t, v1, cachedVersion(t, cache), "the rules applied are cached")
	require.Empty(t, first.MissingDetail())

	del(t, rc, rc.Layout().GlobalRules())
	require.NotEqual(t, v1, version(t, ""))
	for _, tc := range []struct {
		name        string
		addr        string
		cache       string
		wantVersion string // "" no rules at all
		wantMissing bool
	}{
		{"consul without documents", c.HTTPAddr(), cache, v1, true},
		{"consul unreachable", testenv.ClosedAddr(t), cache, v1, false},
		// Nothing was in force: no document is an empty rule set.
		{"no cache, consul without documents", c.HTTPAddr(), "", version(t, ""), false},
		{"no cache, consul unreachable", testenv.ClosedAddr(t), "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLink(t, tc.addr, tc.cache)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l.ReadRules(ctx)
			if tc.wantVersion == "" {
				require.Nil(t, l.edge.rules.Load())
			} else {
				require.Equal(t, tc.wantVersion, l.edge.version())
			}
			if tc.wantMissing {
				require.Regexp(t, `^documents missing in consul, the last good ones kept: rules \(since [^)]+\)$`, l.MissingDetail())
				require.Equal(t, 1.0, l.missingGauge("rules"))
			} else {
				require.Empty(t, l.MissingDetail())
				require.Zero(t, l.missingGauge("rules"))
			}
		})
	}
}

// Run's watch applies each rules document pushed; one ApplySnapshot
// refuses keeps the rules in force and the cache; the document deleted
// keeps them too and counts as missing until one is pushed again.
func TestWatchAppliesPushedRulesAndKeepsTheLastGood(t *testing.T) {
	c := startConsul(t)
	rc := regionClient(t, c.HTTPAddr())
	cache := filepath.Join(t.TempDir(), "rules.yaml")
	l := newLink(t, c.HTTPAddr(), cache)
	l.run(t)
	key := rc.Layout().GlobalRules()

	v1 := version(t, rulesV1)
	put(t, rc, key, rulesV1)
	require.Eventually(t, func() bool { return l.edge.version() == v1 }, wait, tick, "the pushed document reaches ApplySnapshot")
	// The cache is written after the rules are applied: wait for it.
	require.Eventually(t, func() bool { return cachedOr(cache) == v1 }, wait, tick, "the applied rules are cached")

	put(t, rc, key, rulesBad)
	require.Eventually(t, func() bool { return l.edge.refused.Load() == 1 }, wait, tick, "ApplySnapshot gets the document's error")
	require.Equal(t, v1, l.edge.version(), "the rules in force stay")
	require.Equal(t, v1, cachedVersion(t, cache), "a refused document is never cached")

	applied := l.edge.applied.Load()
	del(t, rc, key)
	require.Eventually(t, func() bool { return l.missingGauge("rules") == 1 }, wait, tick)
	require.Contains(t, l.MissingDetail(), "rules (since ")
	require.Equal(t, applied, l.edge.applied.Load(), "an absent document is no clear")
	require.Equal(t, v1, l.edge.version())

	v2 := version(t, rulesV2)
	put(t, rc, key, rulesV2)
	require.Eventually(t, func() bool { return l.edge.version() == v2 }, wait, tick)
	require.Zero(t, l.missingGauge("rules"))
	require.Empty(t, l.MissingDetail())
	// The cache is written after the rules are applied: wait for it.
	require.Eventually(t, func() bool { return cachedOr(cache) == v2 }, wait, tick)
}

// The enforcement switch and the shedder settings from Consul: a valid
// document is applied; an invalid one is counted in RulesErrors and the
// one in force stays; the document deleted keeps it, counted missing (the
// shedder is not sent back to its start settings).
func TestWatchRefusesBadSwitchAndShedderSettings(t *testing.T) {
	c := startConsul(t)
	layout := region.NewLayout("")
	for _, tc := range []struct {
		doc       string
		key       string
		good, bad string
		applied   func(e *fakeEdge) int32
		inForce   func(e *fakeEdge) any
		want      any
	}{
		{
			doc: "enforcement", key: layout.Enforcement(regionName),
			good: `{"mode":"shadow"}`, bad: `{"mode":"sometimes"}`,
			applied: func(e *fakeEdge) int32 { return e.setEnf.Load() },
			inForce: func(e *fakeEdge) any { return e.switchInForce() },
			want:    region.Enforcement{Mode: "shadow", Percent: 100},
		},
		{
			doc: "shedder", key: layout.Shedder(regionName),
			good: "good: 0.65\n", bad: "goodness: 0.65\n",
			applied: func(e *fakeEdge) int32 { return e.updShed.Load() },
			inForce: func(e *fakeEdge) any { e.mu.Lock(); defer e.mu.Unlock(); return e.shed.Good },
			want:    0.65,
		},
	} {
		t.Run(tc.doc, func(t *testing.T) {
			rc := regionClient(t, c.HTTPAddr())
			l := newLink(t, c.HTTPAddr(), filepath.Join(t.TempDir(), "rules.yaml"))
			l.run(t)
			put(t, rc, tc.key, tc.good)
			require.Eventually(t, func() bool { return tc.inForce(l.edge) == tc.want }, wait, tick)
			// Before it, the watch may have seen no document: the start
			// settings, applied as such. The shedder watch has read once
			// (in the enforcement case, its first read may come later).
			require.Eventually(t, func() bool { return l.edge.startShed.Load()+l.edge.updShed.Load() > 0 }, wait, tick)
			applied, starts := tc.applied(l.edge), l.edge.startShed.Load()

			put(t, rc, tc.key, tc.bad)
			require.Eventually(t, func() bool { return testutil.ToFloat64(l.rulesErrors) == 1 }, wait, tick, "the refused document is counted")
			require.Equal(t, applied, tc.applied(l.edge))
			require.Equal(t, tc.want, tc.inForce(l.edge), "the one in force stays")

			del(t, rc, tc.key)
			require.Eventually(t, func() bool { return l.missingGauge(tc.doc) == 1 }, wait, tick)
			require.Contains(t, l.MissingDetail(), tc.doc+" (since ")
			require.Equal(t, tc.want, tc.inForce(l.edge))
			require.Equal(t, applied, tc.applied(l.edge))
			require.Equal(t, starts, l.edge.startShed.Load(), "no return to the start settings")
			require.Equal(t, 1.0, testutil.ToFloat64(l.rulesErrors))
		})
	}
}

// The switch from Consul is kept beside the rules cache, and ReadEnforcement
// of an edge started again runs it: from the cache when Consul is
// unreachable, and when Consul answers without a switch (then it counts
// as missing), never the default of enforcing every key.
func TestEnforcementSwitchCachedBesideTheRules(t *testing.T) {
	c := startConsul(t)
	rc := regionClient(t, c.HTTPAddr())
	cache := filepath.Join(t.TempDir(), "rules.yaml")
	shadow := region.Enforcement{Mode: "shadow", Percent: 100}
	key := rc.Layout().Enforcement(regionName)
	put(t, rc, key, `{"mode":"shadow"}`)

	first := newLink(t, c.HTTPAddr(), cache)
	require.Equal(t, cache+".enforcement", first.Beside(".enforcement"))
	first.ReadEnforcement(context.Background())
	require.Equal(t, shadow, first.edge.switchInForce())
	data, err := os.ReadFile(first.Beside(".enforcement"))
	require.NoError(t, err)
	require.JSONEq(t, `{"mode":"shadow"}`, string(data))

	del(t, rc, key)
	for _, tc := range []struct {
		name        string
		addr        string
		wantMissing bool
	}{
		{"consul unreachable", testenv.ClosedAddr(t), false},
		{"consul without the switch", c.HTTPAddr(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLink(t, tc.addr, cache)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l.ReadEnforcement(ctx)
			require.Equal(t, shadow, l.edge.switchInForce(), "the cached switch")
			require.Equal(t, tc.wantMissing, strings.Contains(l.MissingDetail(), "enforcement (since "), l.MissingDetail())
		})
	}

	t.Run("no rules cache", func(t *testing.T) {
		l := newLink(t, testenv.ClosedAddr(t), "")
		require.Empty(t, l.Beside(".enforcement"))
		l.ReadEnforcement(context.Background())
		require.Zero(t, l.edge.setEnf.Load(), "nothing to apply")
	})
}

// WriteFileAtomic creates the directories, replaces the file whole, and
// leaves no temporary file behind, also when the rename fails.
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a", "b", "rules.yaml")
	require.NoError(t, consullink.WriteFileAtomic(path, []byte("one\n")))
	require.NoError(t, consullink.WriteFileAtomic(path, []byte("two\n")))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "two\n", string(data))
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, entries, 1, "only the file itself")

	// A directory in the way: the rename fails, the error says so, and
	// the temporary file is gone.
	blocked := filepath.Join(dir, "taken")
	require.NoError(t, os.MkdirAll(filepath.Join(blocked, "child"), 0o755))
	require.Error(t, consullink.WriteFileAtomic(blocked, []byte("three\n")))
	entries, err = os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, []string{"a", "taken"}, names, "no temporary file left")
}

// Run registers the edge with the version of the rules in force, again
// once RulesChanged says they changed; counts the region's healthy edges
// for SetEdges; and Deregister takes the edge out of the catalog.
func TestRegistersTheEdgeWithItsRulesVersion(t *testing.T) {
	c := startConsul(t)
	rc := regionClient(t, c.HTTPAddr())
	ready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ready\n")) }))
	defer ready.Close()
	l := newLink(t, c.HTTPAddr(), "", func(cfg *consullink.Config) {
		cfg.Reg.CheckURL = ready.URL + "/readyz"
		cfg.Reg.CheckInterval = 200 * time.Millisecond
	})
	v1 := version(t, rulesV1)
	snap, err := rules.Load([]byte(rulesV1))
	require.NoError(t, err)
	l.edge.rules.Store(snap)
	l.run(t)

	registered := func() (region.Edge, bool) {
		edges, _, err := rc.Edges(context.Background(), regionName, 0, 0)
		if err != nil {
			return region.Edge{}, false
		}
		for _, e := range edges {
			if e.ID == "edge-test" {
				return e, true
			}
		}
		return region.Edge{}, false
	}
	require.Eventually(t, func() bool { e, ok := registered(); return ok && e.RulesVersion == v1 && e.Healthy }, wait, tick)
	require.Eventually(t, func() bool { return l.edge.inRegion.Load() == 1 && l.edge.inPoP.Load() == 1 }, wait, tick, "SetEdges counts the healthy edge")

	v2 := version(t, rulesV2)
	snap, err = rules.Load([]byte(rulesV2))
	require.NoError(t, err)
	l.edge.rules.Store(snap)
	l.RulesChanged()
	require.Eventually(t, func() bool { e, ok := registered(); return ok && e.RulesVersion == v2 }, wait, tick, "registered again with the new version")

	l.Deregister()
	require.Eventually(t, func() bool { _, ok := registered(); return !ok }, wait, tick, "deregistered")
	require.Zero(t, testutil.ToFloat64(l.errors))
}

// A shedder canary of the link's PoP is applied and registered as the
// settings version in force; another PoP's is never applied; deleting the
// canary, with no region settings stored, returns the edge to its start
// settings (the canary was not the region's document: nothing is missing).
func TestShedderCanaryIsNotTheRegions(t *testing.T) {
	c := startConsul(t)
	rc := regionClient(t, c.HTTPAddr())
	layout := rc.Layout()
	l := newLink(t, c.HTTPAddr(), "")
	l.run(t)
	require.Eventually(t, func() bool { return l.edge.startShed.Load() == 1 }, wait, tick, "no settings stored: the start settings")

	put(t, rc, layout.ShedderCanary(regionName, "fra"), "good: 0.5\n")
	put(t, rc, layout.ShedderCanary(regionName, "ams"), "good: 0.65\n")
	inForce := func() float64 { l.edge.mu.Lock(); defer l.edge.mu.Unlock(); return l.edge.shed.Good }
	require.Eventually(t, func() bool { return inForce() == 0.65 }, wait, tick)
	require.Equal(t, int32(1), l.edge.updShed.Load(), "fra's canary is never applied")
	cfg, err := shedder.ParseConfig([]byte("good: 0.65\n"))
	require.NoError(t, err)
	want := shedder.SettingsVersion(cfg)
	require.Eventually(t, func() bool {
		edges, _, err := rc.Edges(context.Background(), regionName, 0, 0)
		return err == nil && len(edges) == 1 && edges[0].ShedderVersion == want
	}, wait, tick, "the canary's settings version is registered")

	del(t, rc, layout.ShedderCanary(regionName, "ams"))
	require.Eventually(t, func() bool { return l.edge.startShed.Load() == 2 }, wait, tick, "back to the start settings")
	require.Zero(t, l.missingGauge("shedder"))
}

// A global canary of the link's PoP is applied in place of rules/global,
// under the region document; another PoP's is never applied; deleting it,
// with no rules/global stored, returns the edge to the region's rules (the
// canary was not the region's document: nothing is missing).
func TestGlobalCanaryIsNotTheRegions(t *testing.T) {
	c := startConsul(t)
	rc := regionClient(t, c.HTTPAddr())
	layout := rc.Layout()
	effective := func(global, regional string) string {
		t.Helper()
		snap, _, err := rules.Effective([]byte(global), []byte(regional))
		require.NoError(t, err)
		return snap.Version()
	}
	put(t, rc, layout.RegionRules(regionName), rulesV1)
	l := newLink(t, c.HTTPAddr(), "")
	l.run(t)
	v0 := effective("", rulesV1)
	require.Eventually(t, func() bool { return l.edge.version() == v0 }, wait, tick, "the region's rules")

	put(t, rc, layout.GlobalCanary(regionName, "fra"), rulesBad)
	const extra = "version: 1\nrules:\n  - {id: per-user, key: [header:X-User], algorithm: fixed_window, limit: 5, window: 1m}\n"
	put(t, rc, layout.GlobalCanary(regionName, "ams"), extra)
	candidate := effective(extra, rulesV1)
	require.NotEqual(t, v0, candidate)
	require.Eventually(t, func() bool { return l.edge.version() == candidate }, wait, tick, "the canary under the region document")
	require.Zero(t, l.edge.refused.Load(), "fra's canary is never applied")

	del(t, rc, layout.GlobalCanary(regionName, "ams"))
	require.Eventually(t, func() bool { return l.edge.version() == v0 }, wait, tick, "back to the region's rules")
	require.Zero(t, l.missingGauge("rules"))
}
