package liverules

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

const oneRule = `version: 1
rules:
  - {id: per-ip, key: [ip], algorithm: fixed_window, limit: 10, window: 1s}
`

func newRules(t *testing.T, check func(*rules.Snapshot) error) (*Rules, Metrics, *[]string) {
	t.Helper()
	m := Metrics{
		Info:   prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "info"}, []string{"version"}),
		Loaded: prometheus.NewGauge(prometheus.GaugeOpts{Name: "loaded"}),
		Errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "errors"}),
	}
	var calls []string
	r := New(Config{
		CompileOptions: func() []rules.CompileOption { return nil },
		Check:          check,
		Changed:        func(s *rules.Snapshot) { calls = append(calls, "changed "+s.Version()) },
		Announced:      func() { calls = append(calls, "announced") },
		Metrics:        m,
		Log:            slog.New(slog.DiscardHandler),
	})
	return r, m, &calls
}

// A good document is swapped in, told, and counted in the info gauge
// (the old version's series gone); a bad one, or one the check refuses,
// is counted and the rules in force stay.
func TestApplyKeepsTheLastGood(t *testing.T) {
	refuse := false
	r, m, calls := newRules(t, func(*rules.Snapshot) error {
		if refuse {
			return errors.New("refused by the settings")
		}
		return nil
	})
	snap, at := r.InForce()
	require.Nil(t, snap)
	require.True(t, at.IsZero())

	require.NoError(t, r.LoadFile("")) // no file: no rules
	empty := r.Load().Version()
	require.NoError(t, r.Apply([]byte(oneRule)))
	v := r.Load().Version()
	require.NotEqual(t, empty, v)
	require.Same(t, r.Load(), r.Pointer().Load())
	require.Equal(t, []string{"changed " + empty, "announced", "changed " + v, "announced"}, *calls)
	require.Equal(t, 1, testutil.CollectAndCount(m.Info), "only the version running")
	require.Equal(t, 1.0, testutil.ToFloat64(m.Info.WithLabelValues(v)))
	require.Positive(t, testutil.ToFloat64(m.Loaded))

	require.Error(t, r.Apply([]byte("version: 1\nrules: [{id: x, limit: nonsense}]\n")))
	refuse = true
	require.ErrorContains(t, r.Apply([]byte(oneRule+"  - {id: other, key: [ip], algorithm: fixed_window, limit: 1, window: 1s}\n")), "refused by the settings")
	require.Equal(t, 2.0, testutil.ToFloat64(m.Errors))
	require.Equal(t, v, r.Load().Version(), "the rules in force stay")
	require.Len(t, *calls, 4, "nothing told")
	_, at = r.InForce()
	require.False(t, at.IsZero())
}

// A rules file that cannot be read or compiled is refused, naming the
// file; the rules in force stay.
func TestLoadFileRefusesWhatItCannotUse(t *testing.T) {
	r, _, _ := newRules(t, func(*rules.Snapshot) error { return nil })
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	require.NoError(t, os.WriteFile(good, []byte(oneRule), 0o600))
	require.NoError(t, r.LoadFile(good))
	v := r.Load().Version()

	require.ErrorContains(t, r.LoadFile(filepath.Join(dir, "absent.yaml")), "reading rules")
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("version: 1\nrules: [{"), 0o600))
	require.ErrorContains(t, r.LoadFile(bad), "rules file "+bad)
	require.Equal(t, v, r.Load().Version())
}
