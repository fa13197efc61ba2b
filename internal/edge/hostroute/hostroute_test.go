package hostroute

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/pkg/pathsem"
)

// newRouter is a router over a default pool at an address nothing is
// asked of (For only picks pools; no request is sent).
func newRouter(t testing.TB) (*Router, *origin.Proxy, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	om, err := origin.NewMetrics(reg)
	require.NoError(t, err)
	base := origin.DefaultConfig()
	base.URLs, base.HealthCheckInterval = []string{"http://127.0.0.1:9"}, 0
	def, err := origin.NewPool(base, om, nil)
	require.NoError(t, err)
	t.Cleanup(def.Close)
	r, err := New(def, base, hosts.PathPolicy{}, om, reg, nil)
	require.NoError(t, err)
	t.Cleanup(r.Close)
	return r, def, reg
}

func table(t testing.TB, doc string) *hosts.Table {
	t.Helper()
	tab, err := hosts.Parse([]byte(doc))
	require.NoError(t, err)
	return tab
}

const twoPools = `version: 1
pools:
  a: {urls: ["http://127.0.0.1:10"], health_check_interval: 0s}
  b: {urls: ["http://127.0.0.1:11"], health_check_interval: 0s}
hosts:
  a.example: {pool: a}
  "*.b.example": {pool: b}
  d.example: {pool: default}
`

func TestRouterPicksPools(t *testing.T) {
	r, def, reg := newRouter(t)
	require.Same(t, def, r.For("a.example"), "no table: the default pool")
	require.NoError(t, r.Apply(table(t, twoPools)))
	a, b := r.For("a.example"), r.For("x.b.example")
	require.Equal(t, "a", a.Name())
	require.Equal(t, "b", b.Name())
	require.Same(t, b, r.For("y.x.b.example"))
	require.Same(t, def, r.For("d.example"))
	require.Same(t, def, r.For("b.example"))
	require.Same(t, def, r.For(""))
	require.Equal(t, 1.0, testutil.ToFloat64(r.m.loads.WithLabelValues("ok")))
	require.Equal(t, 2.0, testutil.ToFloat64(r.m.pools))
	require.Equal(t, 3.0, testutil.ToFloat64(r.m.hosts))

	// The same table again changes nothing (a watch's first answer).
	require.NoError(t, r.Apply(table(t, twoPools)))
	require.Same(t, a, r.For("a.example"))

	// b changes (its URL), a does not: a is kept, b rebuilt.
	require.NoError(t, r.Apply(table(t, strings.Replace(twoPools, "127.0.0.1:11", "127.0.0.1:12", 1))))
	require.Same(t, a, r.For("a.example"), "an unchanged pool is kept, its connections and health with it")
	require.NotSame(t, b, r.For("x.b.example"))

	// Refused: counted, nothing changes.
	require.Error(t, r.Load([]byte("version: 1\nhosts:\n  a.example: {pool: nowhere}\n")))
	require.Equal(t, 1.0, testutil.ToFloat64(r.m.loads.WithLabelValues("error")))
	require.Same(t, a, r.For("a.example"))

	// Cleared: every host to the default pool.
	r.Clear()
	require.Same(t, def, r.For("a.example"))
	require.Equal(t, "", r.Version())
	_ = reg
}

// For allocates nothing, with a table or without.
func TestRouterForAllocatesNothing(t *testing.T) {
	r, _, _ := newRouter(t)
	require.NoError(t, r.Apply(table(t, twoPools)))
	for _, h := range []string{"a.example", "x.b.example", "nowhere.example", ""} {
		require.Zero(t, testing.AllocsPerRun(100, func() { r.For(h) }), h)
	}
}

// BenchmarkFor is the router's cost per request with 10 host names in the
// table and with the most a table takes (hosts.MaxHosts; half exact, half
// wildcards), looking up an exact name, a wildcard's name and a name the
// table does not have. internal/hosts's BenchmarkLookup takes the index to
// 100,000.
func BenchmarkFor(b *testing.B) {
	for _, n := range []int{10, hosts.MaxHosts} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r, _, _ := newRouter(b)
			tab := &hosts.Table{Schema: 1, Pools: map[string]hosts.Pool{"p": {URLs: []string{"http://127.0.0.1:10"}}}, Hosts: map[string]hosts.Host{}}
			for i := range n {
				pattern := fmt.Sprintf("h%d.example.com", i)
				if i%2 == 1 {
					pattern = fmt.Sprintf("*.w%d.example.com", i)
				}
				tab.Hosts[pattern] = hosts.Host{Pool: "p"}
			}
			require.NoError(b, r.apply(tab))
			names := []string{"h8.example.com", "a.b.w7.example.com", "nowhere.example.org"}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r.For(names[i%3])
			}
		})
	}
}

// Route gives each host its pool and path policy: the flags' policy with
// no table, the table's defaults over them for a host it does not name,
// the host's own over both; and allocates nothing.
func TestRouterPathPolicies(t *testing.T) {
	r, def, _ := newRouter(t)
	r.paths = hosts.PathPolicy{Semantics: pathsem.Windows}
	p, paths := r.Route("a.example")
	require.Same(t, def, p)
	require.Equal(t, hosts.PathPolicy{Semantics: pathsem.Windows}, paths, "no table: the flags")

	require.NoError(t, r.Apply(table(t, twoPools+"  s.example: {pool: b, path_semantics: servlet, forward_normalized_path: true}\n")))
	p, paths = r.Route("s.example")
	require.Equal(t, "b", p.Name())
	require.Equal(t, hosts.PathPolicy{Semantics: pathsem.Servlet, ForwardNormalized: true}, paths)
	_, paths = r.Route("a.example")
	require.Equal(t, hosts.PathPolicy{Semantics: pathsem.Windows}, paths, "a host that sets nothing: the flags")

	require.NoError(t, r.Apply(table(t, twoPools+"defaults: {path_semantics: case-insensitive, refuse_ambiguous_paths: true}\n")))
	for _, h := range []string{"a.example", "nowhere.example"} {
		_, paths = r.Route(h)
		require.Equal(t, hosts.PathPolicy{Semantics: pathsem.CaseInsensitive, RefuseAmbiguous: true}, paths, h)
		require.Zero(t, testing.AllocsPerRun(100, func() { r.Route(h) }), h)
	}
}

// BenchmarkRoute is For with the host's path policy: what the request
// path calls once per request.
func BenchmarkRoute(b *testing.B) {
	r, _, _ := newRouter(b)
	require.NoError(b, r.Apply(table(b, twoPools+"defaults: {path_semantics: servlet}\n")))
	names := []string{"a.example", "y.x.b.example", "nowhere.example.org"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r.Route(names[i%3])
		i++
	}
}
