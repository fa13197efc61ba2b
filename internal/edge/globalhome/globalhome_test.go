package globalhome_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/globalhome"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/region"
)

const local, away = "eu-west", "us-east"

// home is a Regions under test with what it told the edge.
type home struct {
	*globalhome.Regions
	lim     *limiter.Limiter
	reg     *prometheus.Registry
	mu      sync.Mutex
	missing []bool // SetMissing's arguments, in order
	refused atomic.Int32
	changed atomic.Int32 // ReachabilityChanged
}

func newHome(t *testing.T) *home {
	t.Helper()
	h := &home{reg: prometheus.NewRegistry()}
	lim, err := limiter.New(limiter.NewMemoryStore(), limiter.Config{StoreName: "memory"}, nil, nil)
	require.NoError(t, err)
	h.lim = lim
	h.Regions, err = globalhome.New(lim, globalhome.Options{
		Region: local, Log: slog.New(slog.DiscardHandler),
		SetMissing: func(missing bool) bool {
			h.mu.Lock()
			defer h.mu.Unlock()
			news := len(h.missing) == 0 || h.missing[len(h.missing)-1] != missing
			h.missing = append(h.missing, missing)
			return news
		},
		Refused:             func() { h.refused.Add(1) },
		ReachabilityChanged: func() { h.changed.Add(1) },
	}, h.reg)
	require.NoError(t, err)
	t.Cleanup(func() {
		h.Close() // before the limiter
		lim.Close()
	})
	return h
}

// lastMissing is what SetMissing was last told (false before any call).
func (h *home) lastMissing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.missing) > 0 && h.missing[len(h.missing)-1]
}

// homes are the other regions the Global has (a fallback-share series
// each).
func (h *home) homes(t *testing.T) []string {
	t.Helper()
	mfs, err := h.reg.Gather()
	require.NoError(t, err)
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "edgeguard_limiter_global_fallback_share" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "home" {
					out = append(out, l.GetValue())
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// decisions is edgeguard_limiter_global_decisions_total{home, from}.
func (h *home) decisions(t *testing.T, homeName, from string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "edgeguard_limiter_global_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["home"] == homeName && labels["from"] == from {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// decide decides one global check of key.
func (h *home) decide(t *testing.T, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := h.lim.Decide(ctx, []limiter.Check{{
		Limit:     limiter.Limit{Key: key, Algorithm: limit.FixedWindow, Limit: 1000, Window: time.Hour},
		Cost:      1,
		Tolerance: 0.2,
		Global:    true,
	}})
	require.NoError(t, err)
}

// keyHomedIn is a key whose home among eu-west and us-east is want.
func keyHomedIn(t *testing.T, want string) string {
	t.Helper()
	for i := range 1000 {
		key := fmt.Sprintf("%s:key-%d", t.Name(), i)
		if limiter.Home([]string{local, away}, key) == want {
			return key
		}
	}
	t.Fatalf("no key homed in %s", want)
	return ""
}

func catalog(redisOfAway string) []byte {
	return fmt.Appendf(nil, `{"regions":[{"name":%q,"redis":"redis://127.0.0.1:1"},{"name":%q,"redis":%q}]}`, local, away, redisOfAway)
}

// Until a catalog arrives the edge's region is every key's home: the
// limiter's global checks are decided here, and no home is unreachable.
func TestThisRegionAloneUntilACatalog(t *testing.T) {
	h := newHome(t)
	require.Empty(t, h.homes(t))
	h.decide(t, keyHomedIn(t, away))
	h.decide(t, keyHomedIn(t, local))
	require.Equal(t, 2.0, h.decisions(t, local, "home"), "the limiter decides global checks through the Regions' Global")
	require.Empty(t, h.Unreachable())
	var none *globalhome.Regions
	require.Nil(t, none.Unreachable())
}

// Apply, document by document: a catalog adds the other regions; one not
// listing this region, or malformed, is refused and the regions in force
// stay; none (nil) after a catalog keeps them, said missing; none before
// any is this region alone.
func TestApplyKeepsTheRegionsInForce(t *testing.T) {
	h := newHome(t)
	for _, step := range []struct {
		name        string
		doc         []byte
		wantErr     string
		wantHomes   []string
		wantMissing bool
	}{
		{"none yet", nil, "", nil, false},
		{"two regions", catalog("redis://127.0.0.1:2"), "", []string{away}, false},
		{"without this region", []byte(`{"regions":[{"name":"us-east","redis":"redis://127.0.0.1:2"}]}`), `this edge's region "eu-west" is not listed`, []string{away}, false},
		{"malformed", []byte(`{"regions":`), "region catalog", []string{away}, false},
		{"gone", nil, "", []string{away}, true},
		{"this region alone", []byte(`{"regions":[{"name":"eu-west","redis":"redis://127.0.0.1:1"}]}`), "", nil, false},
		{"gone again", nil, "", nil, true},
	} {
		err := h.Apply(step.doc)
		if step.wantErr != "" {
			require.ErrorContains(t, err, step.wantErr, step.name)
		} else {
			require.NoError(t, err, step.name)
		}
		require.Equal(t, step.wantHomes, h.homes(t), step.name)
		require.Equal(t, step.wantMissing, h.lastMissing(), step.name)
	}
}

// Unreachable lists a home region whose Redis does not answer once the
// edge has tried to lease from it (and the edge is told to register
// again), and its keys are decided from the static share; a home that
// answers is not listed and its keys are leased.
func TestUnreachableHomes(t *testing.T) {
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rd.Close() })
	for _, tc := range []struct {
		name      string
		redis     string
		reachable bool
	}{
		{"reachable", rd.URL(), true},
		{"unreachable", "redis://" + testenv.ClosedAddr(t), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHome(t)
			require.NoError(t, h.Apply(catalog(tc.redis)))
			key := keyHomedIn(t, away)
			if tc.reachable {
				require.Eventually(t, func() bool {
					h.decide(t, key)
					return h.decisions(t, away, "allowance") > 0
				}, 10*time.Second, 20*time.Millisecond, "units leased from the home")
				require.Empty(t, h.Unreachable(), "a lease just succeeded")
				return
			}
			require.Eventually(t, func() bool {
				h.decide(t, key)
				return slices.Equal(h.Unreachable(), []string{away})
			}, 10*time.Second, 20*time.Millisecond)
			// The home is marked down, then ReachabilityChanged is called:
			// Unreachable can name it a moment before the call.
			require.Eventually(t, func() bool { return h.changed.Load() > 0 }, 10*time.Second, time.Millisecond, "ReachabilityChanged")
			h.decide(t, key)
			require.Positive(t, h.decisions(t, away, "share"), "decided from the static share")
		})
	}
}

// Watch follows the catalog in the region's Consul: a catalog pushed is
// applied, one refused is counted (Refused) and the regions stay, the
// key deleted is a missing document.
func TestWatchFollowsTheCatalogInConsul(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: local})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	cfg := api.DefaultConfig()
	cfg.Address = c.HTTPAddr()
	rc, err := region.NewClient(cfg, "")
	require.NoError(t, err)
	t.Cleanup(cfg.Transport.CloseIdleConnections)
	h := newHome(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Watch(ctx, rc, func(err error) { t.Logf("watch: %v", err) })
	}()
	t.Cleanup(func() { cancel(); <-done })

	kv := rc.API().KV()
	key := rc.Layout().Catalog()
	_, err = kv.Put(&api.KVPair{Key: key, Value: catalog("redis://127.0.0.1:2")}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return slices.Equal(h.homes(t), []string{away}) }, 15*time.Second, 10*time.Millisecond)

	_, err = kv.Put(&api.KVPair{Key: key, Value: []byte(`{"regions":[{"name":"us-east","redis":"redis://127.0.0.1:2"}]}`)}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return h.refused.Load() == 1 }, 15*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{away}, h.homes(t))

	_, err = kv.Delete(key, nil)
	require.NoError(t, err)
	require.Eventually(t, h.lastMissing, 15*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{away}, h.homes(t))
	require.Equal(t, int32(1), h.refused.Load())
}
