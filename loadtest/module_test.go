package edgeguard

import (
	"testing"

	"github.com/grafana/sobek"
	"github.com/stretchr/testify/require"
	"go.k6.io/k6/js/modulestest"
	"go.k6.io/k6/lib"
	"go.k6.io/k6/metrics"
)

const testRules = `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_log
    limit: 2
    window: 10s
`

type vu struct {
	rt      *modulestest.Runtime
	samples chan metrics.SampleContainer
}

// newVU runs init code for one VU of root, then moves it to the VU context.
func newVU(t *testing.T, root *RootModule, id uint64, initCode string) *vu {
	t.Helper()
	return newVURules(t, root, id, testRules, initCode)
}

// newVURules is newVU with the rules document doc as RULES.
func newVURules(t *testing.T, root *RootModule, id uint64, doc, initCode string) *vu {
	t.Helper()
	rt := modulestest.NewRuntime(t)
	mi := root.NewModuleInstance(rt.VU)
	require.NoError(t, rt.VU.Runtime().Set("eg", mi.Exports().Default))
	require.NoError(t, rt.VU.Runtime().Set("RULES", doc))
	_, err := rt.VU.Runtime().RunString(initCode)
	require.NoError(t, err)
	samples := make(chan metrics.SampleContainer, 1000)
	registry := metrics.NewRegistry()
	rt.MoveToVUContext(&lib.State{
		Samples:    samples,
		Tags:       lib.NewVUStateTags(registry.RootTagSet()),
		VUIDGlobal: id,
	})
	return &vu{rt: rt, samples: samples}
}

func (v *vu) run(t *testing.T, code string) sobek.Value {
	t.Helper()
	val, err := v.rt.VU.Runtime().RunString(code)
	require.NoError(t, err)
	return val
}

// sums adds the samples per metric name and "region/policy" tag pair.
func (v *vu) sums() map[string]float64 {
	out := map[string]float64{}
	for {
		select {
		case sc := <-v.samples:
			for _, s := range sc.GetSamples() {
				tags := s.Tags.Map()
				out[s.Metric.Name+" "+tags["region"]+"/"+tags["policy"]+tags["field"]] += s.Value
			}
		default:
			return out
		}
	}
}

const initCode = `
var checker = eg.checker({ rules: RULES, settle: '1s' });
var pop = eg.population({ size: 10, seed: 7 });
function res(status, policy, limit, body) {
  return { status: status, headers: { 'Ratelimit-Policy': policy, 'Ratelimit': limit, 'Retry-After': '3' }, body: body };
}
`

func TestCheckerThroughTheModule(t *testing.T) {
	root := New()
	a := newVU(t, root, 1, initCode)
	b := newVU(t, root, 2, initCode)
	require.Len(t, root.checkers, 1, "VUs asking for the same rules share one checker")
	require.Len(t, root.populations, 1)

	// Three admissions of client 4 within 300 ms, from two VUs: q is 2.
	a.run(t, `
var t0 = eg.now();
checker.record(4, res(200, '"per-ip";q=2;w=10', '"per-ip";r=1;t=10', 'ok'), { sent: t0, received: t0 + 5, region: 'eu-west', pop: 'ams' });
checker.record(4, res(200, '"per-ip";q=2;w=10', '"per-ip";r=0;t=10', 'ok'), { sent: t0 + 100, received: t0 + 105, region: 'eu-west', pop: 'fra' });
`)
	b.run(t, `
var t0 = eg.now();
checker.record(4, res(200, '"per-ip";q=2;w=10', '"per-ip";r=0;t=10', 'ok'), { sent: t0 + 200, received: t0 + 205, region: 'eu-west', pop: 'ams' });
// Another client, denied at once: a false denial.
checker.record(5, res(429, '"per-ip";q=2;w=10', '"per-ip";r=0;t=3', '{"violated-policies":["per-ip"]}'), { sent: t0, received: t0 + 3, region: 'us-east', pop: 'iad' });
`)
	summary := b.run(t, `JSON.stringify(checker.finish())`).String()
	require.Contains(t, summary, `"over_admission":1`)
	require.Contains(t, summary, `"false_denial":1`)
	require.Contains(t, summary, `"checks":["over_admission","false_denial","broken_promise"]`)

	got := a.sums()
	for k, v := range b.sums() {
		got[k] += v
	}
	require.Equal(t, 1.0, got[MetricOverAdmission+" eu-west/per-ip"], "%v", got)
	require.Equal(t, 1.0, got[MetricFalseDenial+" us-east/per-ip"], "%v", got)
	require.Equal(t, 4.0, got[MetricChecked+" eu-west/"]+got[MetricChecked+" us-east/"])
	require.Zero(t, got[MetricMismatch+" eu-west/per-ip"])
	require.Contains(t, got, MetricBrokenPromise+" eu-west/", "finish emits a zero for every metric and region seen")
}

// A leased or global rule's false denials and broken retry promises, which
// its design allows a few of, are counted apart from the exact rules' (held
// to 0 by thresholds).
func TestLeasedFalseDenialsCountedApart(t *testing.T) {
	v := newVURules(t, New(), 1, testRules+`  - id: leased
    match:
      path_prefix: ["/leased"]
    key: [ip]
    algorithm: fixed_window
    limit: 2
    window: 10s
    accuracy: leased
    tolerance: 0.5
`, initCode)
	v.run(t, `
var t0 = eg.now();
checker.record(5, res(429, '"leased";q=2;w=10', '"leased";r=0;t=3', '{"violated-policies":["leased"]}'), { sent: t0, received: t0 + 3, region: 'us-east', pop: 'iad' });
checker.record(6, res(429, '"per-ip";q=2;w=10', '"per-ip";r=0;t=3', '{"violated-policies":["per-ip"]}'), { sent: t0, received: t0 + 3, region: 'us-east', pop: 'iad' });
// Denied again 3.5 s later, past the first 429's Retry-After of 3 s.
checker.record(5, res(429, '"leased";q=2;w=10', '"leased";r=0;t=3', '{"violated-policies":["leased"]}'), { sent: t0 + 3500, received: t0 + 3503, region: 'us-east', pop: 'iad' });
checker.record(6, res(429, '"per-ip";q=2;w=10', '"per-ip";r=0;t=3', '{"violated-policies":["per-ip"]}'), { sent: t0 + 3500, received: t0 + 3503, region: 'us-east', pop: 'iad' });
`)
	summary := v.run(t, `JSON.stringify(checker.finish())`).String()
	// Each client was denied twice with no admission: two false denials each.
	require.Contains(t, summary, `"false_denial":4`)
	require.Contains(t, summary, `"broken_promise":2`)
	got := v.sums()
	require.Equal(t, 2.0, got[MetricLeasedFalseDenial+" us-east/leased"], "%v", got)
	require.Zero(t, got[MetricFalseDenial+" us-east/leased"], "%v", got)
	require.Equal(t, 2.0, got[MetricFalseDenial+" us-east/per-ip"], "%v", got)
	require.Zero(t, got[MetricLeasedFalseDenial+" us-east/per-ip"], "%v", got)
	require.Equal(t, 1.0, got[MetricLeasedBrokenPromise+" us-east/leased"], "%v", got)
	require.Zero(t, got[MetricBrokenPromise+" us-east/leased"], "%v", got)
	require.Equal(t, 1.0, got[MetricBrokenPromise+" us-east/per-ip"], "%v", got)
}

func TestParseRateLimitCountsMalformedFields(t *testing.T) {
	v := newVU(t, New(), 1, initCode)
	out := v.run(t, `var f = eg.parseRateLimit(res(429, '"per-ip";q=2;w=10, "bad";q=x', 'garbage(', ''));
JSON.stringify([f.policies, f.limits, f.retryAfter, f.malformed.map(function (m) { return m.field; })])`).String()
	require.JSONEq(t, `[[{"name":"per-ip","q":2,"w":10}], null, 3, ["RateLimit-Policy", "RateLimit"]]`, out)
	got := v.sums()
	require.Equal(t, 1.0, got[MetricMalformed+" /RateLimit-Policy"], "%v", got)
	require.Equal(t, 1.0, got[MetricMalformed+" /RateLimit"], "%v", got)
}

func TestPopulationThroughTheModule(t *testing.T) {
	root := New()
	a := newVU(t, root, 1, initCode)
	b := newVU(t, root, 2, initCode)
	same := `var c = pop.get(3); c.id + ' ' + c.apiKey + ' ' + c.ipv6`
	require.Equal(t, a.run(t, same).String(), b.run(t, same).String(), "one population for every VU")
	picked := a.run(t, `var p = pop.pick(); p.headers['X-Forwarded-For'] === p.ip && p.headers['X-API-Key'] === p.apiKey && p.id < 10`)
	require.True(t, picked.ToBoolean())
	_, err := a.rt.VU.Runtime().RunString(`eg.population({ size: 10, sede: 1 })`)
	require.ErrorContains(t, err, `unknown field "sede"`, "a misspelt option is an error, not ignored")
}

// Marks are shared by every VU; the first of a name wins, whether taken
// now (mark) or at a time a drill tool reported (markAt).
func TestMarksThroughTheModule(t *testing.T) {
	root := New()
	a := newVU(t, root, 1, initCode)
	b := newVU(t, root, 2, initCode)
	a.run(t, `eg.markAt('drill_witnessed', 1700000000123.5)`)
	require.Equal(t, 1700000000123.5, b.run(t, `eg.markAt('drill_witnessed', 1800000000000)`).ToFloat(), "the first mark of a name wins")
	require.Equal(t, 1700000000123.5, b.run(t, `eg.marks().drill_witnessed`).ToFloat())
	started := a.run(t, `eg.mark('drill_start')`).ToFloat()
	require.Equal(t, started, b.run(t, `eg.marks().drill_start`).ToFloat())
	for _, bad := range []string{`eg.markAt('', 1)`, `eg.markAt('x', 0)`, `eg.markAt('x', NaN)`} {
		_, err := b.rt.VU.Runtime().RunString(bad)
		require.ErrorContains(t, err, "markAt: want a name and a time", bad)
	}
}
