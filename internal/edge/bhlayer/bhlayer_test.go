package bhlayer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/bhlayer"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/behavior"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// scanRules scores only distinct routes: past 2, one point each; levels
// at 1, 2 and 3 points. A client's 3rd distinct route makes it elevated,
// its 4th suspicious, its 5th blocked (each for its next request).
func scanRules(mode, identity, key string) string {
	return fmt.Sprintf(`version: 1
behaviour:
  mode: %s
  identity: %s
  cooldown: 30s
  weights: {burst: 0, replay: 0, scan: 1, denial: 0}
  signals: {scan_free: 2, scan_span: 1}
  thresholds: {elevated: 1, suspicious: 2, blocked: 3}
  levels:
    elevated: {limit_factor: 0.5}
    suspicious: {limit_factor: 0.1, lowest_tier: true}
    blocked: {block: true}
rules:
  - {id: opted, key: [%s], algorithm: fixed_window, limit: 100, window: 1h, behaviour: true}
  - {id: plain, key: [ip], algorithm: fixed_window, limit: 100, window: 1h}
`, mode, identity, key)
}

// denialRules scores only requests sent before a 429's Retry-After: one
// point each.
const denialRules = `version: 1
behaviour:
  mode: enforce
  weights: {burst: 0, replay: 0, scan: 0, denial: 1}
  signals: {denial_free: 0, denial_span: 1}
  thresholds: {elevated: 1, suspicious: 2, blocked: 3}
rules:
  - {id: opted, key: [ip], algorithm: fixed_window, limit: 100, window: 1h, behaviour: true}
`

const salt = "bhlayer-test-salt"

type fixture struct {
	layer *bhlayer.Layer
	snap  *rules.Snapshot
	reg   *prometheus.Registry
}

func newFixture(t *testing.T, doc string, store *limiter.RedisStore) *fixture {
	t.Helper()
	f := &fixture{reg: prometheus.NewRegistry()}
	var err error
	f.layer, err = bhlayer.New(bhlayer.Config{KeySalt: salt, IPv6Prefix: 64, RedisTimeout: time.Second, Store: store, Log: slog.New(slog.DiscardHandler)}, f.reg)
	require.NoError(t, err)
	f.snap, err = rules.Load([]byte(doc), rules.WithKeySalt([]byte(salt)))
	require.NoError(t, err)
	f.layer.RulesChanged(f.snap)
	return f
}

// client is where a request comes from.
type client struct {
	addr    netip.Addr
	trusted bool
	apiKey  string
}

// result is what the layer made of one request.
type result struct {
	tier    shedder.Tier
	limits  map[string]int64 // the checks' limits by rule, after Apply
	early   bool
	blocked bool
	resp    *fasthttp.Response // the layer's answer when blocked
}

// request sends one GET of path through the layer as the edge does
// (Begin, Tier, Apply, Block or Rider and Done), the limiter answering
// denied (with retry) or not.
func (f *fixture) request(t *testing.T, c client, path string, denied bool, retry time.Duration) result {
	t.Helper()
	header := func(name string) (string, bool) {
		if strings.EqualFold(name, "X-Api-Key") && c.apiKey != "" {
			return c.apiKey, true
		}
		return "", false
	}
	query := func(string) (string, bool) { return "", false }
	var req fasthttp.Request
	req.SetRequestURI("http://shop.test" + path)
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: c.addr.AsSlice(), Port: 40000}, nil)

	ms := f.snap.Match(&rules.Request{Host: "shop.test", Method: "GET", Path: path, ClientIP: c.addr, Header: header, Query: query}, nil)
	require.NotEmpty(t, ms)
	checks := make([]limiter.Check, len(ms))
	for i, m := range ms {
		checks[i] = limiter.Check{Limit: limiter.Limit{Key: m.Key, Algorithm: m.Rule.Algorithm, Limit: m.Rule.Limit, Window: m.Rule.Window}, Cost: 1}
	}
	r := f.layer.Begin(c.addr, c.trusted, header, query, path, nil)
	res := result{tier: f.layer.Tier(&r, shedder.TierRead), limits: map[string]int64{}}
	obs, early, blocked := f.layer.Apply(&ctx, &r, ms, checks)
	res.early, res.blocked = early, blocked
	for i, m := range ms {
		res.limits[m.Rule.ID] = checks[i].Limit.Limit
	}
	if blocked {
		f.layer.Block(&ctx, &r)
		res.resp = &ctx.Response
		return res
	}
	f.layer.Done(&r, obs, early, f.layer.Rider(&r, obs), denied, retry)
	return res
}

// metric is the value of the registry's series name{labels}.
func (f *fixture) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	require.NoError(t, err)
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}

// debugClient is /debug/clients?query as the layer serves it.
func (f *fixture) debugClient(t *testing.T, query string) (int, string, bool, string) {
	t.Helper()
	w := httptest.NewRecorder()
	f.layer.DebugClients(w, httptest.NewRequest(http.MethodGet, "/debug/clients?"+query, nil))
	if w.Code == http.StatusBadRequest {
		return w.Code, "", false, ""
	}
	var d struct {
		Mode   string
		Known  bool
		Client *struct{ Level string }
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &d), w.Body.String())
	level := ""
	if d.Client != nil {
		level = d.Client.Level
	}
	return w.Code, d.Mode, d.Known, level
}

var (
	scanner = client{addr: netip.MustParseAddr("192.0.2.1")}
	other   = client{addr: netip.MustParseAddr("192.0.2.2")}
)

// Without a behaviour section, or with mode off, the layer leaves every
// request alone and keeps no client.
func TestOffLeavesRequestsAlone(t *testing.T) {
	for _, tc := range []struct{ name, doc string }{
		{"no section", "version: 1\nrules:\n  - {id: opted, key: [ip], algorithm: fixed_window, limit: 100, window: 1h, behaviour: true}\n"},
		{"mode off", strings.Replace(scanRules("shadow", "address", "ip"), "mode: shadow", "mode: off", 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.doc, nil)
			for i := range 10 {
				res := f.request(t, scanner, fmt.Sprintf("/p/%d", i), true, time.Hour)
				require.Equal(t, shedder.TierRead, res.tier)
				require.False(t, res.blocked)
				require.False(t, res.early)
				require.EqualValues(t, 100, res.limits["opted"])
			}
			code, mode, known, _ := f.debugClient(t, "ip=192.0.2.1")
			require.Equal(t, http.StatusNotFound, code)
			require.Equal(t, "off", mode)
			require.False(t, known, "no client is kept")
			require.Zero(t, f.metric(t, "edgeguard_behaviour_requests_total", nil))
		})
	}
}

// In enforce mode a client's level acts on its next request: elevated
// halves the opted-in rules' limits (not the others'), suspicious cuts
// them to a tenth and demotes the client to the shedder's lowest tier,
// blocked answers 429 abnormal-usage-detected with Retry-After the
// cool-down. Another client is untouched.
func TestEnforceActsOnTheClientsLevel(t *testing.T) {
	f := newFixture(t, scanRules("enforce", "address", "ip"), nil)
	for i, want := range []struct {
		opted   int64
		tier    shedder.Tier
		blocked bool
	}{
		{100, shedder.TierRead, false}, // routes seen before: 0
		{100, shedder.TierRead, false}, // 1
		{100, shedder.TierRead, false}, // 2
		{50, shedder.TierRead, false},  // 3: elevated
		{10, shedder.TierTest, false},  // 4: suspicious
		{0, shedder.TierRead, true},    // 5: blocked
	} {
		res := f.request(t, scanner, fmt.Sprintf("/p/%d", i), false, 0)
		require.Equal(t, want.tier, res.tier, "request %d", i)
		require.Equal(t, want.blocked, res.blocked, "request %d", i)
		if want.blocked {
			require.Equal(t, fasthttp.StatusTooManyRequests, res.resp.StatusCode())
			require.Equal(t, "30", string(res.resp.Header.Peek("Retry-After")), "the cool-down")
			require.Equal(t, "application/problem+json", string(res.resp.Header.ContentType()))
			require.Contains(t, string(res.resp.Body()), "abnormal-usage-detected")
			continue
		}
		require.Equal(t, want.opted, res.limits["opted"], "request %d", i)
		require.EqualValues(t, 100, res.limits["plain"], "a rule that does not opt in keeps its limit")
		res = f.request(t, other, "/p/0", false, 0)
		require.Equal(t, shedder.TierRead, res.tier)
		require.EqualValues(t, 100, res.limits["opted"], "another client is untouched")
	}
	for action, want := range map[string]float64{"tightened": 2, "lowest_tier": 1, "blocked": 1} {
		require.Equal(t, want, f.metric(t, "edgeguard_behaviour_actions_total", map[string]string{"action": action}), action)
	}
	_, mode, known, level := f.debugClient(t, "ip=192.0.2.1")
	require.Equal(t, []any{"enforce", true, "blocked"}, []any{mode, known, level})
}

// In shadow mode the levels are judged and counted the same, and no
// request is treated differently.
func TestShadowJudgesButNeverActs(t *testing.T) {
	f := newFixture(t, scanRules("shadow", "address", "ip"), nil)
	for i := range 8 {
		res := f.request(t, scanner, fmt.Sprintf("/p/%d", i), false, 0)
		require.Equal(t, shedder.TierRead, res.tier, "request %d", i)
		require.False(t, res.blocked, "request %d", i)
		require.EqualValues(t, 100, res.limits["opted"], "request %d", i)
	}
	_, mode, known, level := f.debugClient(t, "ip=192.0.2.1")
	require.Equal(t, []any{"shadow", true, "blocked"}, []any{mode, known, level})
	require.Equal(t, 1.0, f.metric(t, "edgeguard_behaviour_level_changes_total", map[string]string{"from": "suspicious", "to": "blocked", "mode": "shadow"}))
	require.Zero(t, f.metric(t, "edgeguard_behaviour_actions_total", nil))
}

// A 429 of the limiter, handed to Done, makes the client's requests
// before its Retry-After early, and they raise its level; a request the
// limiter admitted does not.
func TestLimiterDenialsMakeRequestsEarly(t *testing.T) {
	for _, tc := range []struct {
		denied    bool
		wantEarly bool
		wantLimit int64 // of the request after the early one
	}{
		{false, false, 100},
		{true, true, 50},
	} {
		t.Run(fmt.Sprintf("denied=%t", tc.denied), func(t *testing.T) {
			f := newFixture(t, denialRules, nil)
			first := f.request(t, scanner, "/a", tc.denied, time.Hour)
			require.False(t, first.early)
			second := f.request(t, scanner, "/a", false, 0)
			require.Equal(t, tc.wantEarly, second.early)
			third := f.request(t, scanner, "/a", false, 0)
			require.Equal(t, tc.wantLimit, third.limits["opted"])
		})
	}
}

// With identity upstream_key, a key is the identity only on requests from
// a trusted peer: a client rotating addresses with one key keeps one
// score then, and otherwise each address is its own client.
func TestUpstreamKeyIsTheIdentityOnlyFromTrustedPeers(t *testing.T) {
	for _, tc := range []struct {
		trusted   bool
		wantLimit int64 // of the 4th route, from a 4th address
	}{
		{true, 50},
		{false, 100},
	} {
		t.Run(fmt.Sprintf("trusted=%t", tc.trusted), func(t *testing.T) {
			f := newFixture(t, scanRules("enforce", "upstream_key", "header:X-Api-Key"), nil)
			var res result
			for i := range 4 {
				c := client{addr: netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}), trusted: tc.trusted, apiKey: "key-1"}
				res = f.request(t, c, fmt.Sprintf("/p/%d", i), false, 0)
			}
			require.Equal(t, tc.wantLimit, res.limits["opted"])
			code, _, known, _ := f.debugClient(t, "api_key=key-1")
			require.Equal(t, tc.trusted, known, "code %d", code)
		})
	}
}

// With Redis, an update that did not ride with a limit check is flushed
// by Run, and the region's reading comes back: the client's state is in
// Redis and levels no longer come from this edge alone.
func TestUpdatesThatDidNotRideAreFlushed(t *testing.T) {
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rd.Close() })
	rc, err := limiter.NewRedisClient(rd.URL(), limiter.ModeStandalone)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rc.Close() })
	store, err := limiter.NewRedisStore(limiter.Conn(rc), "")
	require.NoError(t, err)

	f := newFixture(t, scanRules("enforce", "address", "ip"), store)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.layer.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	require.Equal(t, 1.0, f.metric(t, "edgeguard_behaviour_local_only", nil))

	c := client{addr: netip.MustParseAddr("203.0.113.9")}
	f.request(t, c, "/p/0", false, 0) // its rider was never sent
	require.Eventually(t, func() bool {
		return f.metric(t, "edgeguard_behaviour_updates_total", map[string]string{"path": "flush", "result": "ok"}) == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.Zero(t, f.metric(t, "edgeguard_behaviour_local_only", nil))
	require.Positive(t, f.metric(t, "edgeguard_behaviour_flushes_total", nil))
	require.Zero(t, f.metric(t, "edgeguard_behaviour_updates_total", map[string]string{"path": "ride"}))

	id := behavior.Identity([]byte(salt), behavior.KindIP, rules.ClientKey(c.addr, 64))
	rdb := redis.NewClient(&redis.Options{Addr: rd.Addr})
	defer rdb.Close()
	n, err := rdb.Exists(context.Background(), behavior.Keys(limiter.DefaultKeyPrefix, id)[0]).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the client's state is in Redis")
}
