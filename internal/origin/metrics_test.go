package origin

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// syncBuilder lets a test read what the proxy's goroutines logged.
type syncBuilder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuilder) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuilder) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newTestLogger(w *syncBuilder) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// gathered indexes a registry's samples by "name{labels}".
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName() + "{"
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetName() + "=" + l.GetValue()
			}
			key += "}"
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

func TestMetrics(t *testing.T) {
	release := make(chan struct{})
	ok := startOrigin(t, func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/missing":
			ctx.SetStatusCode(fasthttp.StatusNotFound)
		case "/slow":
			<-release // an origin that answers only after the edge gave up
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the origin stops (last in, first out)
	reg := prometheus.NewPedanticRegistry()
	cfg := DefaultConfig()
	cfg.URLs = []string{ok.url(), "http://" + closedAddr(t)}
	cfg.HealthCheckInterval = 0
	cfg.UnhealthyAfter = 1
	cfg.HeaderTimeout = 100 * time.Millisecond
	p, err := New(cfg, reg, nil)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	before := gathered(t, reg)
	require.Equal(t, 2.0, before["edgeguard_origin_healthy{pool=default}"])

	for range 4 {
		require.Equal(t, fasthttp.StatusOK, get(t, edge, "/").StatusCode())
	}
	require.Equal(t, fasthttp.StatusNotFound, get(t, edge, "/missing").StatusCode())
	require.Equal(t, fasthttp.StatusGatewayTimeout, get(t, edge, "/slow").StatusCode())

	got := gathered(t, reg)
	require.Equal(t, 4.0, got["edgeguard_origin_responses_total{code=2xx,pool=default}"])
	require.Equal(t, 1.0, got["edgeguard_origin_responses_total{code=4xx,pool=default}"])
	require.Equal(t, 0.0, got["edgeguard_origin_responses_total{code=5xx,pool=default}"], "the edge's own 504 is not an origin response")
	require.Equal(t, 1.0, got["edgeguard_origin_errors_total{pool=default,reason=connect}"], "the dead origin is tried once, then leaves rotation")
	require.Equal(t, 1.0, got["edgeguard_origin_errors_total{pool=default,reason=timeout}"])
	require.Equal(t, 0.0, got["edgeguard_origin_errors_total{pool=default,reason=other}"])
	require.Equal(t, 5.0, got["edgeguard_origin_request_duration_seconds{outcome=ok,pool=default}"])
	require.Equal(t, 1.0, got["edgeguard_origin_request_duration_seconds{outcome=timeout,pool=default}"])
	require.Equal(t, 0.0, got["edgeguard_origin_request_duration_seconds{outcome=error,pool=default}"])
	// The timeout counts against the live origin too: UnhealthyAfter is 1.
	require.Equal(t, 0.0, got["edgeguard_origin_healthy{pool=default}"])
}

func TestNewMetricsRegistration(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	_, err = NewMetrics(reg)
	require.Error(t, err, "a second set of metrics on one registry clashes")
	cfg := DefaultConfig()
	cfg.URLs, cfg.HealthCheckInterval = []string{"http://" + closedAddr(t)}, 0
	p, err := NewPool(cfg, m, nil)
	require.NoError(t, err)
	t.Cleanup(p.Close)

	families, err := reg.Gather()
	require.NoError(t, err)
	require.NotEmpty(t, families, "a failed registration leaves the first set in place")

	_, err = NewMetrics(nil)
	require.NoError(t, err)
}
