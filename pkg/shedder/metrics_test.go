package shedder

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/require"
)

// prometheus/testutil is not usable here: it pulls in a module absent from
// go.sum. Gathering and reading the families directly is just as exact.

var metricNames = []string{
	"edgeguard_shedder_utilization",
	"edgeguard_shedder_level",
	"edgeguard_shedder_cutoff_tier",
	"edgeguard_shedder_threshold",
	"edgeguard_shedder_requests_total",
	"edgeguard_shedder_shed_total",
	"edgeguard_shedder_rejected_total",
	"edgeguard_shedder_settings_info",
	"edgeguard_shedder_settings_loaded_timestamp_seconds",
	"edgeguard_shedder_queue_wait_seconds",
	"edgeguard_shedder_workers_busy",
	"edgeguard_shedder_workers_capacity",
	"edgeguard_shedder_enabled",
	"edgeguard_shedder_runtime_lag_seconds",
	"edgeguard_shedder_adaptive_enabled",
	"edgeguard_shedder_adaptive_floor",
	"edgeguard_shedder_adaptive_gradient",
	"edgeguard_shedder_adaptive_in_flight",
	"edgeguard_shedder_adaptive_limit",
	"edgeguard_shedder_adaptive_min_rtt_seconds",
	"edgeguard_shedder_adaptive_sample_rtt_seconds",
	"edgeguard_shedder_adaptive_share",
	"edgeguard_shedder_host_active",
	"edgeguard_shedder_host_in_flight",
	"edgeguard_shedder_host_queued",
	"edgeguard_shedder_host_queue_waits_total",
	"edgeguard_shedder_host_rate_share",
	"edgeguard_shedder_host_share",
}

// scrape returns every sample as "name{label=value,...}" -> value; for
// histograms the value is the sample count.
func scrape(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(labels)
			key := mf.GetName()
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	s, err := New(rawConfig(), reg, seeded())
	require.NoError(t, err)
	w := NewWorkers(1, 0, 0)
	s.AttachWorkers(w)

	mfs, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	require.ElementsMatch(t, metricNames, names)
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	require.NoError(t, err)
	require.Empty(t, problems)

	got := scrape(t, reg)
	require.Equal(t, 0.7, got["edgeguard_shedder_threshold{threshold=good}"])
	require.Equal(t, 0.8, got["edgeguard_shedder_threshold{threshold=bad}"])
	require.Equal(t, 1.0, got["edgeguard_shedder_enabled"])
	require.Equal(t, -28.0/120, got["edgeguard_shedder_level"])
	require.Equal(t, -1.0, got["edgeguard_shedder_cutoff_tier"])
	require.Zero(t, got["edgeguard_shedder_requests_total{tier=read}"])

	// Drive overload: level, utilization and the cut-off move.
	for i := 0; i <= 130; i++ {
		now := at(time.Duration(i) * time.Second)
		s.ObserveUtilization(now, 1)
		s.Admit(now, TierTest)
		s.Admit(now, TierRead)
		s.Admit(now, TierCritical)
	}
	got = scrape(t, reg)
	require.Equal(t, 1.0, got["edgeguard_shedder_utilization"])
	require.InDelta(t, (130.0-28)/120, got["edgeguard_shedder_level"], 1e-9)
	require.Equal(t, float64(TierRead), got["edgeguard_shedder_cutoff_tier"])
	require.Equal(t, 131.0, got["edgeguard_shedder_requests_total{tier=read}"])
	require.Equal(t, 131.0, got["edgeguard_shedder_requests_total{tier=critical}"])
	require.Zero(t, got["edgeguard_shedder_requests_total{tier=write}"])
	require.Positive(t, got["edgeguard_shedder_shed_total{tier=test}"])
	require.Positive(t, got["edgeguard_shedder_shed_total{tier=read}"])
	require.Zero(t, got["edgeguard_shedder_shed_total{tier=critical}"])
	for _, tier := range []string{"test", "read", "critical"} {
		require.Equal(t, got["edgeguard_shedder_shed_total{tier="+tier+"}"], got["edgeguard_shedder_rejected_total{reason=ramp,tier="+tier+"}"], "ramp rejections are the ramp's sheds")
	}

	cfg := s.Config()
	cfg.Good, cfg.Enabled = 0.75, false
	cfg.QueueSize, cfg.QueueTimeout = 1, time.Millisecond
	require.NoError(t, s.Update(cfg))
	got = scrape(t, reg)
	require.Equal(t, 0.75, got["edgeguard_shedder_threshold{threshold=good}"])
	require.Equal(t, 0.0, got["edgeguard_shedder_enabled"])

	// Workers: busy/capacity read at scrape time, queue waits observed.
	release, err := w.Acquire(context.Background(), TierRead)
	require.NoError(t, err)
	got = scrape(t, reg)
	require.Equal(t, 1.0, got["edgeguard_shedder_workers_busy"])
	require.Equal(t, 1.0, got["edgeguard_shedder_workers_capacity"])
	require.Zero(t, got["edgeguard_shedder_queue_wait_seconds{tier=read}"], "immediate acquires are not queue waits")
	_, err = w.Acquire(context.Background(), TierRead)
	require.ErrorIs(t, err, ErrQueueTimeout, "the attached workers follow queue settings from Update")
	release()
	got = scrape(t, reg)
	require.Equal(t, 1.0, got["edgeguard_shedder_queue_wait_seconds{tier=read}"])
	require.Zero(t, got["edgeguard_shedder_queue_wait_seconds{tier=critical}"], "waits are counted by the waiter's tier")
	require.Equal(t, 0.0, got["edgeguard_shedder_workers_busy"])
	require.Equal(t, 1.0, got["edgeguard_shedder_rejected_total{reason=queue_timeout,tier=read}"])
	require.Zero(t, got["edgeguard_shedder_rejected_total{reason=queue_full,tier=read}"])
}

// Worker-cap refusals are counted by tier and reason beside the ramp's.
func TestMetricsRejectedByWorkers(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	cfg := rawConfig()
	cfg.QueueSize, cfg.QueueTimeout = 1, MaxCriticalQueueTimeout
	s, err := New(cfg, reg, seeded())
	require.NoError(t, err)
	w := NewWorkers(1, 0, 0)
	s.AttachWorkers(w)

	release, err := w.Acquire(context.Background(), TierCritical)
	require.NoError(t, err)
	// A read waits in the one queue place; a test request finds it full
	// and a write turns the read away: two queue_full, by tier.
	readErr := make(chan error, 1)
	go func() {
		_, err := w.Acquire(context.Background(), TierRead)
		readErr <- err
	}()
	require.Eventually(t, func() bool { return w.queued() == 1 }, 5*time.Second, time.Millisecond)
	_, err = w.Acquire(context.Background(), TierTest)
	require.ErrorIs(t, err, ErrQueueFull)
	write := make(chan error, 1)
	go func() {
		rel, err := w.Acquire(context.Background(), TierWrite)
		if err == nil {
			rel()
		}
		write <- err
	}()
	require.ErrorIs(t, <-readErr, ErrQueueFull, "evicted for a higher tier")
	release()
	require.NoError(t, <-write)

	got := scrape(t, reg)
	for key, want := range map[string]float64{
		"edgeguard_shedder_rejected_total{reason=queue_full,tier=test}":        1,
		"edgeguard_shedder_rejected_total{reason=queue_full,tier=read}":        1,
		"edgeguard_shedder_rejected_total{reason=queue_full,tier=critical}":    0,
		"edgeguard_shedder_rejected_total{reason=queue_timeout,tier=critical}": 0,
		"edgeguard_shedder_rejected_total{reason=ramp,tier=test}":              0,
	} {
		require.Equal(t, want, got[key], key)
	}
}

// The settings version is a hash of the settings; its load time moves only
// when the version does.
func TestMetricsSettingsVersion(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	now := at(0)
	s, err := New(rawConfig(), reg, WithClock(func() time.Time { return now }))
	require.NoError(t, err)
	v0 := SettingsVersion(rawConfig())
	require.Len(t, v0, 12)
	got := scrape(t, reg)
	require.Equal(t, 1.0, got["edgeguard_shedder_settings_info{version="+v0+"}"])
	require.Equal(t, float64(at(0).Unix()), got["edgeguard_shedder_settings_loaded_timestamp_seconds"])

	now = at(time.Minute)
	require.NoError(t, s.Update(rawConfig()))
	got = scrape(t, reg)
	require.Equal(t, float64(at(0).Unix()), got["edgeguard_shedder_settings_loaded_timestamp_seconds"], "same settings: not a change")

	cfg := rawConfig()
	cfg.Good = 0.65
	v1 := SettingsVersion(cfg)
	require.NotEqual(t, v0, v1)
	now = at(2 * time.Minute)
	require.NoError(t, s.Update(cfg))
	got = scrape(t, reg)
	require.Equal(t, 1.0, got["edgeguard_shedder_settings_info{version="+v1+"}"])
	require.NotContains(t, got, "edgeguard_shedder_settings_info{version="+v0+"}", "one version at a time")
	require.Equal(t, float64(at(2*time.Minute).Unix()), got["edgeguard_shedder_settings_loaded_timestamp_seconds"])

	cfg.Good = 2
	require.Error(t, s.Update(cfg))
	require.Contains(t, scrape(t, reg), "edgeguard_shedder_settings_info{version="+v1+"}", "a refused update changes nothing")
}

func TestMetricsRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, err := New(DefaultConfig(), reg)
	require.NoError(t, err)
	_, err = New(DefaultConfig(), reg)
	require.ErrorContains(t, err, "register metrics")
	// The clash left the first shedder's metrics in place.
	require.Contains(t, scrape(t, reg), "edgeguard_shedder_level")
	require.Contains(t, scrape(t, reg), "edgeguard_shedder_requests_total{tier=test}")

	// No registry: metrics still update, nothing is exported.
	s, err := New(DefaultConfig(), nil)
	require.NoError(t, err)
	s.Admit(at(0), TierRead)
	require.Equal(t, uint64(1), s.m.requests[TierRead].Load())
}
