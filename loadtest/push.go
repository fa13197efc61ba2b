package edgeguard

import (
	"errors"
	"time"

	"go.k6.io/k6/metrics"
)

var errInitContext = errors.New("only callable while a test runs (setup, default, teardown), not in the init context")

// push emits one sample with the VU's current tags plus extra ones.
func (mi *ModuleInstance) push(m *metrics.Metric, value float64, extra map[string]string) error {
	state := mi.vu.State()
	if state == nil || mi.metrics == nil {
		return errInitContext
	}
	cur := state.Tags.GetCurrentValues()
	tags := cur.Tags
	for k, v := range extra {
		if v != "" {
			tags = tags.With(k, v)
		}
	}
	metrics.PushIfNotDone(mi.vu.Context(), state.Samples, metrics.Sample{
		TimeSeries: metrics.TimeSeries{Metric: m, Tags: tags},
		Time:       time.Now(),
		Metadata:   cur.Metadata,
		Value:      value,
	})
	return nil
}
