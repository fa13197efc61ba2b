package testenv

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter is CounterValue, failing t when g has no such series.
func Counter(t testing.TB, g prometheus.Gatherer, name string, label ...string) float64 {
	t.Helper()
	v, err := CounterValue(g, name, label...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// CounterValue is the value of counter name in g: its first series, or
// with label (a name and a value) the series that has it.
func CounterValue(g prometheus.Gatherer, name string, label ...string) (float64, error) {
	fams, err := g.Gather()
	if err != nil {
		return 0, fmt.Errorf("gathering metrics: %w", err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			has := len(label) < 2
			for _, l := range m.GetLabel() {
				has = has || l.GetName() == label[0] && l.GetValue() == label[1]
			}
			if has {
				return m.GetCounter().GetValue(), nil
			}
		}
	}
	return 0, fmt.Errorf("no metric %s %v", name, label)
}
