package serverstats

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
)

// edge is a fake edge admin endpoint exporting two of the real families.
type edge struct {
	srv      *httptest.Server
	requests *prometheus.CounterVec
	calls    prometheus.Counter
}

func newEdge(t *testing.T, pop string) *edge {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"region": "eu-west", "pop": pop}
	e := &edge{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edgeguard_edge_requests_total", Help: "h", ConstLabels: labels}, []string{"outcome"}),
		calls:    prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeguard_limiter_store_calls_total", Help: "h", ConstLabels: labels}),
	}
	reg.MustRegister(e.requests, e.calls)
	e.srv = httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(e.srv.Close)
	return e
}

func TestScrapeAndDelta(t *testing.T) {
	ams, fra := newEdge(t, "ams"), newEdge(t, "fra")
	ams.requests.WithLabelValues("proxied").Add(100)
	fra.requests.WithLabelValues("denied").Add(7)
	urls := []string{ams.srv.URL + "/metrics", fra.srv.URL + "/metrics"}
	ctx := context.Background()

	before, err := Scrape(ctx, http.DefaultClient, urls)
	require.NoError(t, err)
	ams.requests.WithLabelValues("proxied").Add(30)
	fra.requests.WithLabelValues("proxied").Add(10)
	fra.requests.WithLabelValues("denied").Add(10)
	ams.calls.Add(20)
	after, err := Scrape(ctx, http.DefaultClient, urls)
	require.NoError(t, err)

	r := Delta(before, after, DefaultFigures())
	require.Equal(t, map[string]float64{"outcome=proxied": 40, "outcome=denied": 10}, r.Deltas["requests"])
	require.Equal(t, map[string]float64{"": 20}, r.Deltas["script_calls"])
	require.InDelta(t, 0.4, r.ScriptCallsPerRequest, 1e-9)
	require.Contains(t, r.Missing, "fallback", "a family no edge exports is reported missing, not zero")
	require.NotContains(t, r.Missing, "requests")
	require.Empty(t, r.Resets)
}

func TestDeltaAfterRestartCountsFromZero(t *testing.T) {
	first := newEdge(t, "ams")
	first.calls.Add(50)
	before, err := Scrape(context.Background(), http.DefaultClient, []string{first.srv.URL})
	require.NoError(t, err)
	restarted := newEdge(t, "ams")
	restarted.calls.Add(5)
	after, err := Scrape(context.Background(), http.DefaultClient, []string{restarted.srv.URL})
	require.NoError(t, err)
	// Same URL key: pretend the edge restarted behind it.
	after.Targets[first.srv.URL] = after.Targets[restarted.srv.URL]
	delete(after.Targets, restarted.srv.URL)
	r := Delta(before, after, DefaultFigures())
	require.Equal(t, map[string]float64{"": 5}, r.Deltas["script_calls"])
	require.Equal(t, []string{first.srv.URL}, r.Resets)
}

func TestScrapeReportsEveryFailedTarget(t *testing.T) {
	ok := newEdge(t, "ams")
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "nope", http.StatusServiceUnavailable)
	}))
	t.Cleanup(bad.Close)
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("this is { not metrics\n"))
	}))
	t.Cleanup(garbage.Close)
	s, err := Scrape(context.Background(), http.DefaultClient, []string{ok.srv.URL, bad.URL, garbage.URL, "http://127.0.0.1:1/metrics"})
	require.Error(t, err)
	require.ErrorContains(t, err, "503")
	require.ErrorContains(t, err, "parsing metrics")
	require.ErrorContains(t, err, "127.0.0.1:1")
	require.Len(t, s.Targets, 1, "the good target is still returned")
}
