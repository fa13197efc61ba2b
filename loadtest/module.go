package edgeguard

import (
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	"go.k6.io/k6/js/common"
	"go.k6.io/k6/js/modules"
	"go.k6.io/k6/metrics"

	"github.com/edgeguard/edgeguard/loadtest/internal/population"
	"github.com/edgeguard/edgeguard/loadtest/internal/serverstats"
)

// ImportPath is the name scripts import.
const ImportPath = "k6/x/edgeguard"

func init() {
	modules.Register(ImportPath, New())
}

// RootModule is the process-wide part of the extension: one per k6 run,
// shared by every VU.
type RootModule struct {
	mu          sync.Mutex
	populations map[string]*population.Population // by options (JSON)
	checkers    map[string]*sharedChecker         // by rules source
	snapshots   map[string]*serverstats.Snapshot  // by name
	report      *serverstats.Report
	series      map[string][]point
	dns         map[string]dnsEntry
	marks       map[string]time.Time
}

type point struct {
	t time.Time
	v float64
}

type dnsEntry struct {
	addrs   []string
	expires time.Time
}

var (
	_ modules.Module   = &RootModule{}
	_ modules.Instance = &ModuleInstance{}
)

// New returns the root module.
func New() *RootModule {
	return &RootModule{
		populations: map[string]*population.Population{},
		checkers:    map[string]*sharedChecker{},
		snapshots:   map[string]*serverstats.Snapshot{},
		series:      map[string][]point{},
		dns:         map[string]dnsEntry{},
	}
}

// ModuleInstance is one VU's view of the extension.
type ModuleInstance struct {
	vu      modules.VU
	root    *RootModule
	metrics *instanceMetrics
	rls     map[string]*grpc.ClientConn // rls(): this VU's connection per target
}

type instanceMetrics struct {
	malformed     *metrics.Metric
	overAdmission *metrics.Metric
	falseDenial   *metrics.Metric
	leasedDenial  *metrics.Metric
	brokenPromise *metrics.Metric
	leasedPromise *metrics.Metric
	checked       *metrics.Metric
	late          *metrics.Metric
	mismatch      *metrics.Metric
	server        *metrics.Metric
	rlsCalls      *metrics.Metric
	rlsDuration   *metrics.Metric
}

// Metric names (k6 metrics, so thresholds can be set on them).
const (
	MetricMalformed     = "edgeguard_ratelimit_malformed"
	MetricOverAdmission = "edgeguard_over_admissions"
	MetricFalseDenial   = "edgeguard_false_denials"
	// MetricLeasedFalseDenial counts the false denials of leased and
	// global rules, which their design allows a few of (a key's
	// allowance held on another edge or region): reported, and held to a
	// rate of the judged decisions by whoever reads the summary, not to 0.
	MetricLeasedFalseDenial = "edgeguard_leased_false_denials"
	MetricBrokenPromise     = "edgeguard_broken_retry_promises"
	// MetricLeasedBrokenPromise counts the broken retry promises of leased
	// and global rules: a denial while an edge refills its allowance says
	// Retry-After from an estimate (whether the refill brings units is
	// not known yet), so a few are allowed, as for false denials.
	MetricLeasedBrokenPromise = "edgeguard_leased_broken_retry_promises"
	MetricChecked             = "edgeguard_checked_responses"
	MetricLate                = "edgeguard_checker_late_events"
	MetricMismatch            = "edgeguard_policy_mismatches"
	MetricServer              = "edgeguard_server"
	MetricRLSCalls            = "edgeguard_rls_calls"
	MetricRLSDuration         = "edgeguard_rls_call_duration"
)

func newMetrics(reg *metrics.Registry) (*instanceMetrics, error) {
	m := &instanceMetrics{}
	for _, d := range []struct {
		dst  **metrics.Metric
		name string
		typ  metrics.MetricType
		vt   []metrics.ValueType
	}{
		{&m.malformed, MetricMalformed, metrics.Counter, nil},
		{&m.overAdmission, MetricOverAdmission, metrics.Counter, nil},
		{&m.falseDenial, MetricFalseDenial, metrics.Counter, nil},
		{&m.leasedDenial, MetricLeasedFalseDenial, metrics.Counter, nil},
		{&m.brokenPromise, MetricBrokenPromise, metrics.Counter, nil},
		{&m.leasedPromise, MetricLeasedBrokenPromise, metrics.Counter, nil},
		{&m.checked, MetricChecked, metrics.Counter, nil},
		{&m.late, MetricLate, metrics.Counter, nil},
		{&m.mismatch, MetricMismatch, metrics.Counter, nil},
		{&m.server, MetricServer, metrics.Gauge, nil},
		{&m.rlsCalls, MetricRLSCalls, metrics.Counter, nil},
		{&m.rlsDuration, MetricRLSDuration, metrics.Trend, []metrics.ValueType{metrics.Time}},
	} {
		mt, err := reg.NewMetric(d.name, d.typ, d.vt...)
		if err != nil {
			return nil, fmt.Errorf("registering metric %s: %w", d.name, err)
		}
		*d.dst = mt
	}
	return m, nil
}

// NewModuleInstance is called once per VU (in its init context).
func (r *RootModule) NewModuleInstance(vu modules.VU) modules.Instance {
	mi := &ModuleInstance{vu: vu, root: r}
	if env := vu.InitEnv(); env != nil {
		m, err := newMetrics(env.Registry)
		if err != nil {
			common.Throw(vu.Runtime(), err)
		}
		mi.metrics = m
	}
	return mi
}

// Exports lists what scripts can import.
func (mi *ModuleInstance) Exports() modules.Exports {
	named := map[string]any{
		"parseRateLimit": mi.ParseRateLimit,
		"population":     mi.Population,
		"checker":        mi.Checker,
		"now":            Now,
		"resolve":        mi.Resolve,
		"scrape":         mi.Scrape,
		"serverDelta":    mi.ServerDelta,
		"serverReport":   mi.ServerReport,
		"scrapeValues":   mi.ScrapeValues,
		"observe":        mi.Observe,
		"quantile":       mi.Quantile,
		"slope":          mi.Slope,
		"gauge":          mi.Gauge,
		"mean":           mi.Mean,
		"writeResult":    mi.WriteResult,
		"print":          Print,
		"mark":           mi.Mark,
		"markAt":         mi.MarkAt,
		"marks":          mi.Marks,
		"run":            mi.Run,
		"rls":            mi.RLS,
	}
	return modules.Exports{Default: named, Named: named}
}

// Now is the wall clock in milliseconds since the epoch with microsecond
// precision (Date.now() has whole milliseconds only).
func Now() float64 { return float64(time.Now().UnixMicro()) / 1000 }

func fromMillis(ms float64) time.Time { return time.UnixMicro(int64(ms * 1000)) }
