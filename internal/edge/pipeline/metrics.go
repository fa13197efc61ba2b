package pipeline

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/accesslog"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// metrics are the pipeline's: what requests did. Labels are bounded: rule ids come from the
// operator's rules, every other label from a fixed set; never a client key,
// address or raw host. region and pop are constant labels of the registry.
type metrics struct {
	// The per-request series, looked up once: requests are made for every
	// outcome and tier up front, durations and decisions on first use.
	// Requests and durations are found by the outcome's place in outcomes
	// and the tier, not by hashing their label strings.
	byRequest     [len(outcomes)][tierSlots]prometheus.Counter
	byDuration    [len(outcomes)]lazyObserver
	byDecision    series[decisionKey, prometheus.Counter]
	byEscape      series[escapeKey, prometheus.Counter]
	requests      *prometheus.CounterVec // outcome, tier
	decisions     *prometheus.CounterVec // rule, decision, reason
	escapes       *prometheus.CounterVec // rule, escape
	penaltyErrors prometheus.Counter
	countsDropped prometheus.Counter
	duration      *prometheus.HistogramVec // outcome
	limiterError  prometheus.Counter
	refused       map[string]prometheus.Counter
	enforce       *enforcementMetrics
}

// Request outcomes (the outcome label).
const (
	outcomeProxied     = "proxied"
	outcomeDenied      = "denied"
	outcomeShed        = "shed"
	outcomeNoWorker    = "no_worker"
	outcomeUnavailable = "unavailable"
	outcomeRefused     = "refused"
	outcomeAbandoned   = "abandoned"
	outcomeHostShare   = "host_share"
	outcomePoolLimit   = "pool_limit"
)

// outcomes are the outcome label's values; their places index the series.
var outcomes = [...]string{outcomeProxied, outcomeDenied, outcomeShed, outcomeNoWorker, outcomeUnavailable, outcomeRefused, outcomeAbandoned, outcomeHostShare, outcomePoolLimit}

// outcomeIndex is o's place in outcomes, -1 for a string not there. The
// outcomes a request ends with are these constants, so each comparison
// that fails does so on the length or at once.
func outcomeIndex(o string) int {
	for i := range outcomes {
		if outcomes[i] == o {
			return i
		}
	}
	return -1
}

// tierSlots are the tiers' places in byRequest: TierNone first.
const tierSlots = int(shedder.TierCritical) + 2

// lazyObserver is one outcome's duration series, made on first use.
type lazyObserver struct {
	once sync.Once
	o    prometheus.Observer
}

func newMetrics(reg prometheus.Registerer, framingReasons []string) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_edge_requests_total",
			Help: "Requests by outcome: proxied, denied (429), shed (503), no_worker (503), unavailable (503 in fail-closed), refused (400/405/408/413/431/501/505: a request the edge answered itself and did not pass on; edgeguard_edge_requests_refused_total says why), abandoned (its client left while it waited for a worker: never proxied), host_share (503: its host was at its fair share of the workers); and shedder tier (none: answered before classification).",
		}, []string{"outcome", "tier"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_edge_decisions_total",
			Help: "Rule decisions by rule (its ID for a rule with metrics: true, else _other), decision (allowed, denied, shadow_denied, bypass) and reason (where decided: the store, prefilter, fallback, open; penalty for a key serving a penalty; rules for a bypass).",
		}, []string{"rule", "decision", "reason"}),
		escapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_edge_escapes_total",
			Help: "Requests an operator's escape applied to, by rule (as in decisions) and escape: bypass (not counted), override (the key's own limit), limit_header (a trusted peer's limit), limit_header_ignored (sent by an untrusted peer, or invalid), penalised (denied by a penalty, not counted), penalty_start (a denial that started a penalty), response_counted (a response counted by a count_if or cost_header rule), response_blocked (denied: the key is over such a rule's limit), cost_header_error (a cost header that was not a valid cost, or above max_cost: bounded).",
		}, []string{"rule", "escape"}),
		countsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_edge_response_counts_dropped_total",
			Help: "Responses a count_if or cost_header rule should have counted but did not: 4,096 counts were already waiting for Redis.",
		}),
		penaltyErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_edge_penalty_errors_total",
			Help: "Penalty lookups and starts that Redis did not answer in time (the request went on as though its key served no penalty).",
		}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "edgeguard_edge_request_duration_seconds",
			Help:    "Time from request start to response ready, by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}, []string{"outcome"}),
		limiterError: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_edge_limiter_errors_total",
			Help: "Requests admitted unchecked because the limiter returned an error (a bug: see logs).",
		}),
	}
	refused := newRefusedCounter()
	m.refused = refusedByReason(refused, refusalReasons(framingReasons))
	m.enforce = newEnforcementMetrics()
	m.byRequest[outcomeIndex(outcomeRefused)][shedder.TierNone+1] = m.requests.WithLabelValues(outcomeRefused, shedder.TierNone.String())
	for i, o := range outcomes {
		for _, t := range []shedder.Tier{shedder.TierTest, shedder.TierRead, shedder.TierWrite, shedder.TierCritical} {
			m.byRequest[i][t+1] = m.requests.WithLabelValues(o, t.String())
		}
	}
	for _, esc := range []string{escapeBypass, escapeOverride, escapeLimitHeader, escapeHeaderIgnored, escapePenalised, escapePenaltyStart, escapeResponseCounted, escapeResponseBlocked, escapeCostHeaderError} {
		m.escape(otherRules, esc) // every escape's series exists from the start
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.decisions, m.escapes, m.penaltyErrors, m.countsDropped, m.duration, m.limiterError, refused} {
		errs = append(errs, reg.Register(c))
	}
	for _, c := range m.enforce.collectors() {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}

// accessLog exports the access log's written and dropped lines.
func (m *metrics) accessLog(reg prometheus.Registerer, l *accesslog.Log) error {
	return errors.Join(
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgeguard_edge_access_log_lines_total",
			Help: "Access-log lines written.",
		}, func() float64 { return float64(l.Written()) })),
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgeguard_edge_access_log_dropped_total",
			Help: "Access-log lines dropped because the writer could not keep up (its queue holds 8,192 lines); requests are never held back for the log.",
		}, func() float64 { return float64(l.Dropped()) })),
	)
}

type decisionKey struct{ rule, decision, reason string }

type escapeKey struct{ rule, escape string }

// escape is the escapes counter of a rule and escape.
func (m *metrics) escape(rule, escape string) prometheus.Counter {
	return m.byEscape.get(escapeKey{rule, escape}, func() prometheus.Counter {
		return m.escapes.WithLabelValues(rule, escape)
	})
}

// request is the requests counter of an outcome and tier.
func (m *metrics) request(outcome string, tier shedder.Tier) prometheus.Counter {
	if i := outcomeIndex(outcome); i >= 0 && tier >= shedder.TierNone && int(tier) < tierSlots-1 {
		if c := m.byRequest[i][tier+1]; c != nil {
			return c
		}
	}
	return m.requests.WithLabelValues(outcome, tier.String())
}

// durationOf is the duration histogram of an outcome; it is made on first
// use (an outcome's series appears once a request has it, as before).
func (m *metrics) durationOf(outcome string) prometheus.Observer {
	i := outcomeIndex(outcome)
	if i < 0 {
		return m.duration.WithLabelValues(outcome)
	}
	d := &m.byDuration[i]
	d.once.Do(func() { d.o = m.duration.WithLabelValues(outcome) })
	return d.o
}

// otherRules is the rule label of every rule without metrics: true.
const otherRules = "_other"

// ruleLabel is a rule's value of the rule label: its ID when the rule opted
// in (metrics: true), else "_other", so the series stay bounded however many
// rules a document holds.
func ruleLabel(r *rules.CompiledRule) string {
	if r.Metrics {
		return r.ID
	}
	return otherRules
}

// decision is the decisions counter of a rule, decision and reason.
func (m *metrics) decision(rule, decision, reason string) prometheus.Counter {
	return m.byDecision.get(decisionKey{rule, decision, reason}, func() prometheus.Counter {
		return m.decisions.WithLabelValues(rule, decision, reason)
	})
}
