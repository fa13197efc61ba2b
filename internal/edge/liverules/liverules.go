// Package liverules holds the rules in force: the compiled snapshot every
// request reads, swapped whole when a new document is applied (from the
// file, Consul or its cache), and when that happened. An invalid document
// is refused and counted; the rules in force stay.
package liverules

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

// Metrics are the series the rules in force set.
type Metrics struct {
	Info   *prometheus.GaugeVec // version: 1 for the one running
	Loaded prometheus.Gauge     // when it was loaded (Unix time)
	Errors prometheus.Counter   // documents refused
}

// NewMetrics registers the rules' series with reg.
func NewMetrics(reg prometheus.Registerer) (Metrics, error) {
	m := Metrics{
		Info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edgeguard_edge_rules_info",
			Help: "The rules version running (value 1).",
		}, []string{"version"}),
		Loaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_edge_rules_loaded_timestamp_seconds",
			Help: "When the running rules were loaded (Unix time).",
		}),
		Errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_edge_rules_rejected_total",
			Help: "Rule documents refused as invalid (the last good rules stay).",
		}),
	}
	return m, errors.Join(reg.Register(m.Info), reg.Register(m.Loaded), reg.Register(m.Errors))
}

// Config is what the rules in force are checked with and whom a change
// tells.
type Config struct {
	CompileOptions func() []rules.CompileOption
	Check          func(*rules.Snapshot) error // beyond compiling: what the edge's settings refuse
	// Changed runs on every swap, before the metrics change; Announced
	// after them (the Consul registration says the version).
	Changed   func(*rules.Snapshot)
	Announced func()
	Metrics   Metrics
	Log       *slog.Logger
}

// Rules are the rules in force.
type Rules struct {
	snap atomic.Pointer[rules.Snapshot]
	at   atomic.Pointer[time.Time]
	c    Config
}

// New holds no rules until one is applied.
func New(c Config) *Rules { return &Rules{c: c} }

// Load is the snapshot in force (nil: none yet).
func (r *Rules) Load() *rules.Snapshot { return r.snap.Load() }

// CompileOptions are how rules documents compile on this edge.
func (r *Rules) CompileOptions() []rules.CompileOption { return r.c.CompileOptions() }

// Pointer is what the request path reads the snapshot from.
func (r *Rules) Pointer() *atomic.Pointer[rules.Snapshot] { return &r.snap }

// InForce is the snapshot in force and when it was loaded.
func (r *Rules) InForce() (*rules.Snapshot, time.Time) {
	var loaded time.Time
	if at := r.at.Load(); at != nil {
		loaded = *at
	}
	return r.snap.Load(), loaded
}

// LoadFile reads and applies the rules file; no file ("") means no rules.
func (r *Rules) LoadFile(path string) error {
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return fmt.Errorf("reading rules: %w", err)
		}
	} else {
		r.c.Log.Warn("no --rules given: nothing is rate limited")
		data = []byte("version: 1\nrules: []\n")
	}
	if err := r.Apply(data); err != nil {
		return fmt.Errorf("rules file %s: %w", path, err)
	}
	return nil
}

// ReloadFile is LoadFile again (SIGHUP), when there is a file: an invalid
// one is logged, and the rules in force stay.
func (r *Rules) ReloadFile(path string) {
	if path == "" {
		return
	}
	if err := r.LoadFile(path); err != nil {
		r.c.Log.Error("rules reload refused; keeping the rules in force", "err", err, "version", r.Load().Version())
	}
}

// Apply parses, validates and compiles a rules document and swaps it in.
// An invalid document is refused (counted, and the error names the rule and
// field); the rules in force stay.
func (r *Rules) Apply(data []byte) error {
	return r.ApplySnapshot(rules.Load(data, r.c.CompileOptions()...))
}

// ApplySnapshot swaps snap in, or counts err (or what Check finds) and
// keeps the rules in force.
func (r *Rules) ApplySnapshot(snap *rules.Snapshot, err error) error {
	if err == nil {
		err = r.c.Check(snap)
	}
	if err != nil {
		r.c.Metrics.Errors.Inc()
		return err
	}
	r.Set(snap)
	return nil
}

// Set swaps the rules snapshot atomically; requests in flight finish
// with the one they started with.
func (r *Rules) Set(snap *rules.Snapshot) {
	old := r.snap.Swap(snap)
	now := time.Now()
	r.at.Store(&now)
	r.c.Changed(snap)
	if old != nil {
		r.c.Metrics.Info.DeleteLabelValues(old.Version())
	}
	r.c.Metrics.Info.WithLabelValues(snap.Version()).Set(1)
	r.c.Announced()
	r.c.Metrics.Loaded.Set(float64(now.Unix()))
	r.c.Log.Info("rules loaded", "version", snap.Version(), "rules", len(snap.Rules()))
}
