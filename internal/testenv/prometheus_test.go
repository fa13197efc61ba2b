package testenv

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// Prometheus scrapes the Redis exporter, which reads a real Redis: the
// series arrive with the job's labels.
func TestPrometheusScrapesRedisExporter(t *testing.T) {
	rd, err := StartStandalone(StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rd.Close() })
	exp, err := StartRedisExporter(rd.Addr, "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = exp.Close() })
	prom, err := StartPrometheus(PrometheusOptions{Jobs: []ScrapeJob{{Name: "redis", Targets: []string{exp.Addr}, Labels: map[string]string{"region": "r1"},
		TargetLabels: map[string]map[string]string{exp.Addr: {"pop": "p1"}}}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = prom.Close() })

	waitForSample(t, prom.URL, `redis_up{job="redis", region="r1", pop="p1"}`, 1)

	require.NoError(t, prom.Close())
	require.NoError(t, prom.Close(), "Close is idempotent")
}

// Uncompressed: Prometheus scrapes the target through a relay that asks
// it for identity; the series keep the target's address as instance. A
// job without it asks the target for gzip (so the relay is what
// changes it).
func TestPrometheusScrapesUncompressed(t *testing.T) {
	for _, tc := range []struct {
		name         string
		uncompressed bool
		gzip         bool // the target is asked for gzip
	}{
		{"uncompressed", true, false},
		{"default", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var scrapes, gzipAsked atomic.Int64
			mux := http.NewServeMux()
			mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
				scrapes.Add(1)
				if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
					gzipAsked.Add(1)
				}
				w.Header().Set("Content-Type", "text/plain; version=0.0.4")
				_, _ = io.WriteString(w, "# TYPE relayed gauge\nrelayed 7\n")
			})
			target := httptest.NewServer(mux)
			t.Cleanup(target.Close)
			addr := strings.TrimPrefix(target.URL, "http://")
			prom, err := StartPrometheus(PrometheusOptions{ScrapeInterval: 200 * time.Millisecond, Jobs: []ScrapeJob{{Name: "j", Targets: []string{addr},
				TargetLabels: map[string]map[string]string{addr: {"pop": "p1"}}, Uncompressed: tc.uncompressed}}})
			require.NoError(t, err)
			t.Cleanup(func() { _ = prom.Close() })

			waitForSample(t, prom.URL, `relayed{job="j", pop="p1", instance="`+addr+`"}`, 7)
			require.Positive(t, scrapes.Load())
			if tc.gzip {
				require.Equal(t, scrapes.Load(), gzipAsked.Load(), "every scrape asked for gzip")
			} else {
				require.Zero(t, gzipAsked.Load(), "a scrape asked the target for gzip")
			}
			require.NoError(t, prom.Close())
			require.NoError(t, prom.Close(), "Close is idempotent")
		})
	}
}

// waitForSample waits until the Prometheus at url answers query with one
// sample of value want.
func waitForSample(t *testing.T, url, query string, want model.SampleValue) {
	t.Helper()
	c, err := api.NewClient(api.Config{Address: url})
	require.NoError(t, err)
	p := promv1.NewAPI(c)
	require.Eventually(t, func() bool {
		v, _, _, err := p.Query(context.Background(), query, time.Now())
		vec, ok := v.(model.Vector)
		return err == nil && ok && len(vec) == 1 && vec[0].Value == want
	}, 20*time.Second, 100*time.Millisecond, "%s never answered %v", query, want)
}
