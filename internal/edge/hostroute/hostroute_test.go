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
	"github.com/edgeguard/edgeguard/pkg/shedder"
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
	r, err := makeRouter(def, base, hosts.PathPolicy{}, om, reg, nil)
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
	p, paths, _ := r.Route("a.example")
	require.Same(t, def, p)
	require.Equal(t, hosts.PathPolicy{Semantics: pathsem.Windows}, paths, "no table: the flags")

	require.NoError(t, r.Apply(table(t, twoPools+"  s.example: {pool: b, path_semantics: servlet, forward_normalized_path: true}\n")))
	p, paths, _ = r.Route("s.example")
	require.Equal(t, "b", p.Name())
	require.Equal(t, hosts.PathPolicy{Semantics: pathsem.Servlet, ForwardNormalized: true}, paths)
	_, paths, _ = r.Route("a.example")
	require.Equal(t, hosts.PathPolicy{Semantics: pathsem.Windows}, paths, "a host that sets nothing: the flags")

	require.NoError(t, r.Apply(table(t, twoPools+"defaults: {path_semantics: case-insensitive, refuse_ambiguous_paths: true}\n")))
	for _, h := range []string{"a.example", "nowhere.example"} {
		_, paths, _ = r.Route(h)
		require.Equal(t, hosts.PathPolicy{Semantics: pathsem.CaseInsensitive, RefuseAmbiguous: true}, paths, h)
		require.Zero(t, testing.AllocsPerRun(100, func() { r.Route(h) }), h)
	}
}

// Route names each host's tenant, the share of the workers it is kept
// under: itself with no table or one listing no host; with a table that
// lists hosts, an exact entry's name, a wildcard entry's pattern for every
// name under it, and the pooled rest for every name it does not list, so
// that a client sending many names takes one share. It allocates nothing.
func TestRouterTenants(t *testing.T) {
	r, _, _ := newRouter(t)
	tenant := func(host string) string {
		t.Helper()
		_, _, got := r.Route(host)
		return got
	}
	require.Equal(t, "a.example", tenant("a.example"), "no table")
	require.Equal(t, "sprayed-1.example", tenant("sprayed-1.example"), "no table")

	require.NoError(t, r.Apply(table(t, "version: 1\ndefaults: {path_semantics: servlet}\n")))
	require.Equal(t, "sprayed-1.example", tenant("sprayed-1.example"), "a table listing no host")

	require.NoError(t, r.Apply(table(t, twoPools+`  "*.w.example": {pool: default}`+"\n")))
	for host, want := range map[string]string{
		"a.example":         "a.example",
		"d.example":         "d.example", // the default pool, but listed
		"x.b.example":       "*.b.example",
		"y.x.b.example":     "*.b.example",
		"x.w.example":       "*.w.example",     // the default pool, under a listed wildcard
		"b.example":         shedder.OtherHost, // not under *.b.example
		"sprayed-1.example": shedder.OtherHost,
		"sprayed-2.example": shedder.OtherHost,
		"":                  shedder.OtherHost,
		"_other":            shedder.OtherHost,
	} {
		require.Equal(t, want, tenant(host), host)
		require.Zero(t, testing.AllocsPerRun(100, func() { r.Route(host) }), host)
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
