package promtext

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
)

// A registry served by promhttp over loopback, scraped and summed: label
// pairs select series, a histogram counts its observations, and _sum and
// _count read its sum and count.
func TestScrapeAndSum(t *testing.T) {
	reg := prometheus.NewRegistry()
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reqs_total", Help: "h"}, []string{"outcome", "tier"})
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lat_seconds", Help: "h"}, []string{"tier"})
	reg.MustRegister(reqs, lat)
	reqs.WithLabelValues("proxied", "read").Add(3)
	reqs.WithLabelValues("denied", "read").Add(2)
	reqs.WithLabelValues("denied", "critical").Add(5)
	lat.WithLabelValues("read").Observe(0.25)
	lat.WithLabelValues("read").Observe(0.5)
	lat.WithLabelValues("critical").Observe(2)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)

	f, err := Scrape(context.Background(), srv.Client(), srv.URL)
	require.NoError(t, err)
	require.EqualValues(t, 10, Sum(f, "reqs_total"))
	require.EqualValues(t, 7, Sum(f, "reqs_total", "outcome", "denied"))
	require.EqualValues(t, 2, Sum(f, "reqs_total", "outcome", "denied", "tier", "read"))
	require.Zero(t, Sum(f, "reqs_total", "outcome", "shed"))
	require.Zero(t, Sum(f, "absent_total"))
	require.EqualValues(t, 3, Sum(f, "lat_seconds"), "a histogram counts its observations")
	require.EqualValues(t, 2, Sum(f, "lat_seconds_count", "tier", "read"))
	require.InDelta(t, 2.75, Sum(f, "lat_seconds_sum"), 1e-9)

	_, err = Scrape(context.Background(), srv.Client(), srv.URL+"/missing\x7f")
	require.Error(t, err, "a URL that does not parse")
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", http.StatusServiceUnavailable) }))
	t.Cleanup(bad.Close)
	_, err = Scrape(context.Background(), bad.Client(), bad.URL)
	require.ErrorContains(t, err, "503")
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("reqs_total{ 1\n")) }))
	t.Cleanup(garbage.Close)
	_, err = Scrape(context.Background(), garbage.Client(), garbage.URL)
	require.ErrorContains(t, err, "parsing metrics")
}
