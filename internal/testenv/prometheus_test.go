package testenv

import (
	"context"
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

	c, err := api.NewClient(api.Config{Address: prom.URL})
	require.NoError(t, err)
	p := promv1.NewAPI(c)
	require.Eventually(t, func() bool {
		v, _, _, err := p.Query(context.Background(), `redis_up{job="redis", region="r1", pop="p1"}`, time.Now())
		vec, ok := v.(model.Vector)
		return err == nil && ok && len(vec) == 1 && vec[0].Value == 1
	}, 20*time.Second, 100*time.Millisecond)

	require.NoError(t, prom.Close())
	require.NoError(t, prom.Close(), "Close is idempotent")
}
