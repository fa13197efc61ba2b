// Package bhlayer is the behaviour layer on the request path (package
// pkg/behavior has the model). For a request of a client:
//
//  1. before shedding, the client's identity (its address, an IPv6
//     client's /64; with identity: upstream_key and a trusted peer, the API
//     key an opted-in rule counts by; hashed with the key salt) and its
//     level: the higher of this edge's own view and the
//     region's reading from Redis as of the client's previous round trip
//     (one round trip of lag: the signal keys and the limit keys live in
//     different Cluster slots, and the update rides with the limit checks);
//  2. in enforce mode, a level's policy: the shedder's lowest tier, the
//     opted-in rules' limits multiplied, or a 429 of type
//     abnormal-usage-detected with Retry-After = the cool-down;
//  3. the request's signal update rides in the pipeline of the request's
//     limit checks (limiter.Rider); one that could not (denied by the
//     over-limit cache, decided locally, blocked) and every 429 given are
//     flushed in one pipeline at most every flushEvery.
//
// Requests matching no opted-in rule are not observed; the level's shedder
// tier applies to all of a client's requests.
package bhlayer

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/listen"
	"github.com/edgeguard/edgeguard/internal/logevery"
	"github.com/edgeguard/edgeguard/internal/problem"
	"github.com/edgeguard/edgeguard/lua"
	"github.com/edgeguard/edgeguard/pkg/behavior"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

const problemAbnormalUsage = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"

// flushEvery bounds how often an edge sends what did not ride.
const flushEvery = 100 * time.Millisecond

// maxFlush caps one flush; the rest goes with the next.
const maxFlush = 10_000

// bhConfig is the layer's configuration of one rules snapshot.
type bhConfig struct {
	mode     behavior.Mode
	settings *behavior.Settings
	params   behavior.Params
	args     behavior.ScriptArgs
	headers  []string // API-key headers and query parameters opted-in rules count by
	queries  []string
	requests []prometheus.Counter // edgeguard_behaviour_requests_total by level, in this mode
}

// Layer is the behaviour layer of one edge.
type Layer struct {
	cfg     atomic.Pointer[bhConfig] // nil: off
	tracker *behavior.Tracker
	store   *limiter.RedisStore // nil: no Redis, this edge's view only
	script  *limiter.RiderScript
	salt    []byte
	hasher  behavior.Hasher
	v6      int
	timeout time.Duration
	log     *slog.Logger
	m       *bhMetrics
	reload  atomic.Bool // a reply met NOSCRIPT: the flusher loads the script
	// loadWarn keeps a Redis outage from logging a failed load every flush.
	loadWarn logevery.Gate
}

// Config is what the layer needs of the edge's settings.
type Config struct {
	KeySalt      string              // --key-salt: identities are hashed with it
	IPv6Prefix   int                 // --ipv6-prefix: an IPv6 client's identity is its prefix
	RedisTimeout time.Duration       // --redis-timeout, for the flusher's pipelines
	Store        *limiter.RedisStore // nil: no Redis, this edge's view only
	Log          *slog.Logger
}

// Open is New for the edge's settings (--key-salt, --ipv6-prefix,
// --redis-timeout) and store (nil: no Redis).
func Open(cfg config.Config, store *limiter.RedisStore, reg prometheus.Registerer, log *slog.Logger) (*Layer, error) {
	b, err := New(Config{KeySalt: cfg.KeySalt, IPv6Prefix: cfg.IPv6Prefix, RedisTimeout: cfg.RedisTimeout, Store: store, Log: log}, reg)
	if err != nil {
		return nil, fmt.Errorf("building the behaviour layer: %w", err)
	}
	return b, nil
}

// New builds the layer, off until rules with a behaviour section arrive
// (RulesChanged); its metrics register with reg.
func New(cfg Config, reg prometheus.Registerer) (*Layer, error) {
	src, err := lua.Plain(lua.Behaviour)
	if err != nil {
		return nil, err
	}
	b := &Layer{
		store: cfg.Store, script: limiter.NewRiderScript(src), salt: []byte(cfg.KeySalt),
		hasher: behavior.NewHasher([]byte(cfg.KeySalt)), v6: cfg.IPv6Prefix, timeout: cfg.RedisTimeout, log: cfg.Log,
	}
	if b.m, err = newBehaviourMetrics(reg, func() float64 {
		if t := b.tracker; t != nil {
			return float64(t.Len())
		}
		return 0
	}); err != nil {
		return nil, err
	}
	def := behavior.DefaultSettings()
	b.tracker = behavior.NewTracker(behavior.ParamsOf(&def), 0, b.m.evicted.Inc, b.m.dropped.Inc)
	b.m.localOnly.Set(1)
	return b, nil
}

// RulesChanged takes the behaviour section of new rules: live, like the
// rest of the rules.
func (b *Layer) RulesChanged(snap *rules.Snapshot) {
	s := snap.Behaviour()
	if s == nil || s.Mode == behavior.ModeOff {
		if b.cfg.Swap(nil) != nil {
			b.log.Info("behaviour layer off")
		}
		return
	}
	c := &bhConfig{mode: s.Mode, settings: s, params: behavior.ParamsOf(s)}
	c.args = behavior.NewScriptArgs(&c.params)
	for _, lv := range behavior.AllLevels() {
		c.requests = append(c.requests, b.m.requests.WithLabelValues(lv.String(), string(c.mode)))
	}
	opted := 0
	for _, r := range snap.Rules() {
		if !r.Behaviour {
			continue
		}
		opted++
		for _, k := range r.Key {
			if name, ok := strings.CutPrefix(k, "header:"); ok && !contains(c.headers, name) {
				c.headers = append(c.headers, name)
			}
			if name, ok := strings.CutPrefix(k, "query:"); ok && !contains(c.queries, name) {
				c.queries = append(c.queries, name)
			}
		}
	}
	b.tracker.SetParams(c.params)
	b.cfg.Store(c)
	if opted == 0 {
		b.log.Warn("behaviour section present but no rule opts in (behaviour: true): levels are computed for no request", "mode", s.Mode)
		return
	}
	b.log.Info("behaviour layer on", "mode", s.Mode, "rules", opted, "horizon", s.Horizon.D(), "cooldown", s.Cooldown.D())
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Request is one request's part in the layer; the zero value is off.
type Request struct {
	cfg   *bhConfig
	id    string
	level behavior.Level
	path  string
	route [1]uint64
}

// Begin identifies the client and judges its level (step 1); nil cfg: off.
// A key is the identity only when the settings say keys are authenticated
// upstream and the request comes from a trusted peer (internal/edge/trust); a TLS
// fingerprint only when they say ja4 and the connection has one.
func (b *Layer) Begin(client netip.Addr, trusted bool, header, query func(string) (string, bool), path string, conn net.Conn) Request {
	c := b.cfg.Load()
	if c == nil {
		return Request{}
	}
	r := Request{cfg: c, id: b.identity(c, client, trusted, header, query, conn)}
	if r.id == "" {
		return Request{}
	}
	lv, was := b.tracker.Judge(r.id, time.Now().UnixMilli())
	r.level = lv
	if lv != was {
		b.m.changes.WithLabelValues(was.String(), lv.String(), string(c.mode)).Inc()
		b.log.Info("client level changed", "client", r.id, "from", was.String(), "to", lv.String(), "mode", string(c.mode))
	}
	r.path = path
	return r
}

// identity is the client's hashed identity: its TLS fingerprint, its API
// key or its address, as the settings say; "" when it has none.
func (b *Layer) identity(c *bhConfig, client netip.Addr, trusted bool, header, query func(string) (string, bool), conn net.Conn) string {
	id := ""
	if c.settings.Identity == behavior.IdentityJA4 {
		if fp := listen.JA4Of(conn); fp != "" {
			id = behavior.Identity(b.salt, behavior.KindJA4, fp)
		}
	}
	if trusted && c.settings.Identity == behavior.IdentityUpstreamKey {
		if key := upstreamKey(c, header, query); key != "" {
			id = behavior.Identity(b.salt, behavior.KindAPIKey, key)
		}
	}
	if id == "" {
		if key := rules.ClientKey(client, b.v6); key != "" {
			id = behavior.Identity(b.salt, behavior.KindIP, key)
		}
	}
	return id
}

// upstreamKey is the first API key the opted-in rules count by that the
// request carries: headers first, then query parameters.
func upstreamKey(c *bhConfig, header, query func(string) (string, bool)) string {
	for _, name := range c.headers {
		if v, ok := header(name); ok && v != "" {
			return v
		}
	}
	for _, name := range c.queries {
		if v, ok := query(name); ok && v != "" {
			return v
		}
	}
	return ""
}

// enforcing reports whether the request's level acts.
func (r *Request) enforcing() bool { return r.cfg != nil && r.cfg.mode == behavior.ModeEnforce }

// Tier demotes a client whose level says so to the shedder's lowest tier.
func (b *Layer) Tier(r *Request, t shedder.Tier) shedder.Tier {
	if r.enforcing() && r.cfg.settings.Policy(r.level).LowestTier && t != shedder.TierTest {
		b.m.actions.WithLabelValues("lowest_tier").Inc()
		return shedder.TierTest
	}
	return t
}

// opted reports whether any matched rule opted in, and the burst signal's
// scale: the least that the opted-in rules admit within the burst window
// (a rule's quota, times the windows that fit in the burst window when
// its window is shorter).
func opted(ms []rules.Match, burst time.Duration) (bool, int64) {
	var q int64
	ok := false
	for _, m := range ms {
		if m.Rule.Behaviour {
			v := quota(m.Rule)
			if w := m.Rule.Window; !m.Rule.Algorithm.Spec().Held && w > 0 && w < burst {
				v *= int64((burst + w - 1) / w)
			}
			if !ok || v < q {
				q = v
			}
			ok = true
		}
	}
	return ok, q
}

// Apply observes the request and applies its level to the checks (step 2);
// it returns the observation and whether the request is blocked.
func (b *Layer) Apply(ctx *fasthttp.RequestCtx, r *Request, ms []rules.Match, checks []limiter.Check) (obs behavior.Obs, early bool, blocked bool) {
	if r.cfg == nil {
		return obs, false, false
	}
	ok, q := opted(ms, r.cfg.settings.BurstWindow.D())
	if !ok {
		r.cfg = nil // nothing further for this request
		return obs, false, false
	}
	r.cfg.requests[r.level].Inc()
	r.route[0] = b.hasher.Route(r.path)
	var body []byte
	if !ctx.Request.IsBodyStream() {
		if bb := ctx.Request.Body(); len(bb) <= behavior.MaxBodyFingerprint {
			body = bb
		}
	}
	fp := b.hasher.Fingerprint(b2s(ctx.Method()), r.path, b2s(ctx.URI().QueryString()), body)
	obs = behavior.Obs{N: 1, Judge: 1, Q: q, Routes: r.route[:], FP: fp}
	pol := r.cfg.settings.Policy(r.level)
	now := time.Now().UnixMilli()
	if r.enforcing() && pol.Block {
		obs.RetryMs = r.cfg.params.CooldownMs
		early = b.tracker.Observe(r.id, obs, now)
		b.pend(r, obs, early, now)
		b.m.actions.WithLabelValues("blocked").Inc()
		return obs, early, true
	}
	early = b.tracker.Observe(r.id, obs, now)
	if r.enforcing() && pol.LimitFactor < 1 {
		tightened := false
		for i, m := range ms {
			if m.Rule.Behaviour {
				checks[i].Limit = scaled(checks[i].Limit, pol.LimitFactor)
				tightened = true
			}
		}
		if tightened {
			b.m.actions.WithLabelValues("tightened").Inc()
		}
	}
	return obs, early, false
}

// scaled is l with its limit and burst multiplied by f (at least 1).
func scaled(l limiter.Limit, f float64) limiter.Limit {
	l.Limit = max(1, int64(float64(l.Limit)*f))
	if l.Burst > 0 {
		l.Burst = max(1, int64(float64(l.Burst)*f))
	}
	return l
}

// Rider is the request's signal update, to ride with its limit checks;
// nil without Redis.
func (b *Layer) Rider(r *Request, obs behavior.Obs) *limiter.Rider {
	if b.store == nil || r.cfg == nil {
		return nil
	}
	return b.newRider(r.cfg, r.id, obs, viaRide)
}

// newRider is client id's signal update obs, its reply read as sent via.
func (b *Layer) newRider(c *bhConfig, id string, obs behavior.Obs, via int) *limiter.Rider {
	return &limiter.Rider{
		Script: b.script,
		Keys:   behavior.Keys(limiter.DefaultKeyPrefix, id),
		Args:   c.args.Args(obs, 0),
		Reply:  func(rep limiter.RiderReply) { b.reply(id, rep, via) },
	}
}

// Done settles the request after the limit checks (step 3): an update that
// did not ride goes to the next flush, and so does a 429 of the limiter
// (denied, its longest Retry-After retry).
func (b *Layer) Done(r *Request, obs behavior.Obs, early bool, rd *limiter.Rider, denied bool, retry time.Duration) {
	if r.cfg == nil {
		return
	}
	now := time.Now().UnixMilli()
	if rd == nil || !rd.Sent() {
		b.pend(r, obs, early, now)
	}
	if !denied { // admitted, or the limiter failed
		return
	}
	retryMs := max(seconds(retry), 1) * 1000 // as Retry-After says it
	deny := behavior.Obs{RetryMs: retryMs}
	b.tracker.Observe(r.id, deny, now)
	if b.store != nil {
		b.tracker.Pend(r.id, deny, now)
	}
}

// pend queues requests that did not reach Redis, judged by this edge.
func (b *Layer) pend(r *Request, obs behavior.Obs, early bool, now int64) {
	if b.store == nil {
		return
	}
	obs.Judge, obs.FP, obs.Early = 0, 0, 0
	if early {
		obs.Early = obs.N
	}
	b.tracker.Pend(r.id, obs, now)
}

// How a signal update went: with a limit check (ride) or in a flush.
const (
	viaRide = iota
	viaFlush
)

// reply takes the region's reading of a client from a script reply.
func (b *Layer) reply(id string, rep limiter.RiderReply, via int) {
	vals, err := rep.Int64Slice()
	var v behavior.Verdict
	if err == nil {
		v, err = behavior.ParseReply(vals)
	}
	if err != nil {
		b.m.updated[via][1].Inc()
		b.m.localOnly.Set(1)
		if limiter.IsNoScript(err) {
			b.reload.Store(true)
		}
		return
	}
	b.m.updated[via][0].Inc()
	b.m.localOnly.Set(0)
	b.tracker.Remote(id, v, time.Now().UnixMilli(), 1000)
}

// loadScript loads the script on every node (at start, and after a reply
// met NOSCRIPT: a node restarted or failed over).
func (b *Layer) loadScript() {
	ctx, cancel := context.WithTimeout(context.Background(), max(b.timeout, time.Second))
	defer cancel()
	if err := b.script.Load(ctx, b.store.Client()); err != nil {
		if ok, suppressed := b.loadWarn.Allow(time.Now()); ok {
			b.log.Warn("behaviour script not loaded; levels come from this edge's view until it is", "err", err, "suppressed", suppressed)
		}
		b.reload.Store(true)
	}
}

// Run flushes what did not ride every flushEvery until ctx is done.
func (b *Layer) Run(ctx context.Context) {
	if b.store == nil {
		return
	}
	// Loaded while the layer is on: a rules document without a behaviour
	// section needs no script (and a Redis outage then logs nothing about it).
	if b.cfg.Load() != nil {
		b.loadScript()
	} else {
		b.reload.Store(true)
	}
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if b.cfg.Load() != nil && b.reload.Swap(false) {
				b.loadScript()
			}
			b.flush()
		}
	}
}

func (b *Layer) flush() {
	c := b.cfg.Load()
	items := b.tracker.Drain()
	if c == nil || len(items) == 0 {
		return
	}
	for len(items) > 0 {
		n := min(len(items), maxFlush)
		riders := make([]*limiter.Rider, n)
		for i, it := range items[:n] {
			riders[i] = b.newRider(c, it.ID, it.Obs, viaFlush)
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(b.timeout, 100*time.Millisecond))
		_ = b.store.RunRiders(ctx, riders) // each reply says how it went
		cancel()
		b.m.flushes.Inc()
		items = items[n:]
	}
}

// Block answers a request Apply blocked: 429, Retry-After the client's
// cool-down.
func (b *Layer) Block(ctx *fasthttp.RequestCtx, r *Request) { blocked(ctx, r.cfg.params.Cooldown()) }

// blocked answers a blocked client: 429, Retry-After the cool-down. The
// level itself is never disclosed.
func blocked(ctx *fasthttp.RequestCtx, cooldown time.Duration) {
	problem.Write(ctx, problem.Problem{
		Type:   problemAbnormalUsage,
		Title:  "Too Many Requests",
		Status: fasthttp.StatusTooManyRequests,
		Detail: "abnormal usage detected; retry after the time in Retry-After",
	}, seconds(cooldown))
}

// DebugClients serves /debug/clients?key=ID (the hashed identity logs
// show), or ?ip=ADDR, ?api_key=KEY or ?ja4=FINGERPRINT, which it hashes the
// same way.
func (b *Layer) DebugClients(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	id := q.Get("key")
	switch {
	case id != "":
	case q.Get("api_key") != "":
		id = behavior.Identity(b.salt, behavior.KindAPIKey, q.Get("api_key"))
	case q.Get("ja4") != "":
		id = behavior.Identity(b.salt, behavior.KindJA4, q.Get("ja4"))
	case q.Get("ip") != "":
		a, err := netip.ParseAddr(q.Get("ip"))
		if err != nil {
			http.Error(w, "ip: not an address", http.StatusBadRequest)
			return
		}
		id = behavior.Identity(b.salt, behavior.KindIP, rules.ClientKey(a, b.v6))
	default:
		http.Error(w, "want ?key=<client id>, ?ip=<address>, ?api_key=<key> or ?ja4=<fingerprint>", http.StatusBadRequest)
		return
	}
	mode := string(behavior.ModeOff)
	if c := b.cfg.Load(); c != nil {
		mode = string(c.mode)
	}
	cl, ok := b.tracker.Lookup(id, time.Now().UnixMilli())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !ok {
		w.WriteHeader(http.StatusNotFound)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(struct {
		Mode   string           `json:"mode"`
		Known  bool             `json:"known"`
		Client *behavior.Client `json:"client,omitempty"`
	}{mode, ok, clientOrNil(cl, ok)})
}

func clientOrNil(c behavior.Client, ok bool) *behavior.Client {
	if !ok {
		return nil
	}
	return &c
}

type bhMetrics struct {
	changes   *prometheus.CounterVec   // from, to, mode
	requests  *prometheus.CounterVec   // level, mode
	actions   *prometheus.CounterVec   // action
	updates   *prometheus.CounterVec   // path, result
	updated   [2][2]prometheus.Counter // updates by via (ride, flush) and result (ok, error)
	flushes   prometheus.Counter
	localOnly prometheus.Gauge
	evicted   prometheus.Counter
	dropped   prometheus.Counter
}

func newBehaviourMetrics(reg prometheus.Registerer, clients func() float64) (*bhMetrics, error) {
	m := &bhMetrics{
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_behaviour_level_changes_total",
			Help: "Changes of the level this edge judges a client's requests by, by from and to level and mode (shadow changes count too).",
		}, []string{"from", "to", "mode"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_behaviour_requests_total",
			Help: "Requests of opted-in rules, by the client's level and the mode.",
		}, []string{"level", "mode"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_behaviour_actions_total",
			Help: "Requests a level acted on in enforce mode: tightened (limits multiplied), lowest_tier (shedder tier), blocked (429 abnormal-usage-detected).",
		}, []string{"action"}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_behaviour_updates_total",
			Help: "Signal updates sent to Redis, by path (ride: in a limit check's pipeline; flush: batched every 100 ms) and result (ok, error).",
		}, []string{"path", "result"}),
		flushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_behaviour_flushes_total",
			Help: "Pipelines of signal updates that could not ride with a limit check.",
		}),
		localOnly: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_behaviour_local_only",
			Help: "1 while levels come from this edge's own view only (no Redis, or its last signal update failed); 0 while the region's readings arrive.",
		}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_behaviour_evicted_total",
			Help: "Clients this edge forgot to stay within its memory bound.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_behaviour_dropped_updates_total",
			Help: "Signal updates dropped because too many waited for one flush.",
		}),
	}
	cs := []prometheus.Collector{m.changes, m.requests, m.actions, m.updates, m.flushes, m.localOnly, m.evicted, m.dropped,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgeguard_behaviour_clients",
			Help: "Clients this edge keeps signals of.",
		}, clients)}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, a := range []string{"tightened", "lowest_tier", "blocked"} {
		m.actions.WithLabelValues(a)
	}
	for i, p := range []string{"ride", "flush"} {
		for j, r := range []string{"ok", "error"} {
			m.updated[i][j] = m.updates.WithLabelValues(p, r)
		}
	}
	return m, nil
}

// quota is a rule's capacity, as the RateLimit fields' q= says it.
func quota(r *rules.CompiledRule) int64 {
	return limiter.Limit{Algorithm: r.Algorithm, Limit: r.Limit, Window: r.Window, Burst: r.Burst, MinInterval: r.MinInterval}.Capacity()
}

// seconds is d in whole seconds, rounded up, as Retry-After says it.
func seconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

// b2s views bytes as a string for lookups that do not keep it.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
