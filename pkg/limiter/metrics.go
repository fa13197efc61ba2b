package limiter

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Limiter's; labels are bounded (reason, outcome), never a key.
type metrics struct {
	checks        [numSources]prometheus.Counter
	prefilterHits prometheus.Counter
	coalesced     prometheus.Counter
	storeDecided  prometheus.Counter // decisions asked of the store
	storeSeconds  *prometheus.HistogramVec
	storeOK       prometheus.Observer // storeSeconds' children, looked up once
	storeError    prometheus.Observer
	fallbacks     *prometheus.CounterVec
	breakerState  *prometheus.GaugeVec // shard
	breakersOpen  prometheus.Gauge
	breakerOpens  prometheus.Counter
	refunds       prometheus.Counter
	replayed      prometheus.Counter
	// unknown: exact checks the fallback gave no share (limiter.go,
	// unknownInWindow).
	unknown      prometheus.Counter
	refundErrors prometheus.Counter
	// releaseRetries and releasesDropped: ReleaseAsync's tries after a
	// failure, and releases past its bound.
	releaseRetries, releasesDropped prometheus.Counter
	// releasesResent: acknowledged releases sent again after their
	// master was failed over (release.go).
	releasesResent prometheus.Counter
	storeErrors    *prometheus.CounterVec // class
	refreshes      prometheus.Counter
	// lateCalls and lateGivenBack: store calls answered after their
	// caller gave up, and the leases they took that were given back.
	lateCalls, lateGivenBack prometheus.Counter
	// lifeWaits: store calls whose caller waited past the deadline on the
	// store's evidence of life (Limiter.keepWaiting).
	lifeWaits        prometheus.Counter
	restores, unsure prometheus.Counter
	// leaseCarves, leaseCarved, leaseReturned: leased checks' carving
	// calls, the units they carved, the units given back unspent.
	leaseCarves, leaseCarved, leaseReturned prometheus.Counter
	degraded                                []prometheus.Collector // one gauge per reason
}

// sender is a store that sends script commands to a server and counts them
// (RedisStore).
type sender interface {
	Sent() (commands, calls int64)
}

// newMetrics builds the Limiter's metrics; evicted counts the live keys the
// fallback store dropped to stay under its size cap.
// health is read at scrape time for edgeguard_limiter_degraded; sent, when
// not nil, for the store's command counts.
func newMetrics(reg prometheus.Registerer, storeName string, evicted func() int64, health func() Health, sent sender) (*metrics, error) {
	checks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgeguard_limiter_checks_total",
		Help: "Rate-limit checks decided, by where they were decided (reason).",
	}, []string{"reason"})
	m := &metrics{
		prefilterHits: counter("edgeguard_limiter_prefilter_hits_total", "Requests denied by the local over-limit cache without a store call."),
		coalesced:     counter("edgeguard_limiter_coalesced_checks_total", "Checks that joined another request's call for the same key."),
		storeDecided:  counter("edgeguard_limiter_store_decisions_total", "Decisions asked of the store: one per key of a check sent to it, units replayed from the fallback included (however they were batched into commands: see edgeguard_limiter_store_calls_total)."),
		storeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "edgeguard_limiter_store_call_duration_seconds",
			Help:    "Duration of one store round trip (all keys of a request), by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 12),
		}, []string{"outcome"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_limiter_fallback_total",
			Help: "Checks the store could not decide, by reason: error, breaker_open, lane_full (this edge already had 16,384 calls waiting for the Redis master: back-pressure, never counted against the store).",
		}, []string{"reason"}),
		breakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edgeguard_limiter_breaker_state",
			Help: "Store circuit breaker state per shard (Cluster master address, or \"store\" for a single-master store): 0 closed, 1 open, 2 half-open.",
		}, []string{"shard"}),
		breakersOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_limiter_breakers_open",
			Help: "Store shards (Cluster masters) whose breaker is not closed: their keys are decided locally.",
		}),
		breakerOpens:    counter("edgeguard_limiter_breaker_opens_total", "Times a shard's breaker opened (its keys went to the fallback): a slow store must not flap it."),
		replayed:        counter("edgeguard_limiter_replayed_units_total", "Units the local fallback admitted that were replayed into the store once it answered again."),
		unknown:         counter("edgeguard_limiter_fallback_unknown_total", "Exact checks shared by several edges that the local fallback denied because the store had answered this edge within the check's window (other edges may have counted since this edge's last answer), or had not failed it through that window and within the store deadline (the store may be back for the other edges)."),
		refunds:         counter("edgeguard_limiter_refunds_total", "Leases given back: other limit denied, unused coalesced units, released concurrency slots."),
		refundErrors:    counter("edgeguard_limiter_refund_errors_total", "Refund calls that failed (units stay counted until their window passes)."),
		releaseRetries:  counter("edgeguard_limiter_release_retries_total", "Concurrency-slot releases tried again after a failure (in the background, for up to 10 s; the response never waits)."),
		releasesDropped: counter("edgeguard_limiter_releases_dropped_total", "Concurrency-slot releases not sent because 4,096 were already under way; those slots expire with their TTL."),
		releasesResent:  counter("edgeguard_limiter_releases_resent_total", "Concurrency-slot releases a Cluster master acknowledged, sent again once a failover moved their key to another master (the acknowledged write may not have reached the promoted replica)."),
		refreshes:       counter("edgeguard_limiter_store_refreshes_total", "Breaker probes that first had the store find its nodes again (a Cluster's slot map), so a failed master's keys re-home to the promoted replica without waiting for the periodic reload."),
		restores:        counter("edgeguard_limiter_restores_total", "Keys whose store answer before an outage was restored once the store answered again (a store that kept its state takes nothing)."),
		leaseCarves:     counter("edgeguard_limiter_lease_carves_total", "Store calls that carved allowance for leased checks (one per batch; the checks decided from the batch make no call)."),
		leaseCarved:     counter("edgeguard_limiter_lease_carved_units_total", "Units carved from the store for leased checks."),
		leaseReturned:   counter("edgeguard_limiter_lease_returned_units_total", "Units of leased allowance given back unspent (an idle key, a closing limiter)."),
		unsure:          counter("edgeguard_limiter_unsure_takes_total", "Sliding-log and concurrency takes whose reply was lost after they were sent (a connection cut): the members they may have added are removed by id in the background, as releases are."),
		lifeWaits:       counter("edgeguard_limiter_life_waits_total", "Store calls past the store deadline whose caller waited on (at most 4 deadlines) because the store kept answering this edge's other calls: slow, not dead."),
		lateCalls:       counter("edgeguard_limiter_late_calls_total", "Store calls answered after their caller stopped waiting at the store deadline (the fallback decided those checks): settled in the background."),
		lateGivenBack:   counter("edgeguard_limiter_late_given_back_total", "Leases taken by late store calls and given back, so the store counts only what clients were admitted."),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_limiter_store_errors_total",
			Help: "Failed store calls and probes by class: timeout, unreachable, credentials (WRONGPASS/NOAUTH/NOPERM: a misconfiguration, alerted on), error.",
		}, []string{"class"}),
	}
	m.seed(checks, storeName, health)
	if reg == nil {
		return m, nil
	}
	return m, m.register(reg, checks, evicted, sent)
}

// counter is a counter without labels.
func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

// seed makes the degraded gauges and every label value the limiter
// reports, so each series is there from the start (at 0).
func (m *metrics) seed(checks *prometheus.CounterVec, storeName string, health func() Health) {
	for _, r := range reasons {
		m.storeErrors.WithLabelValues(r)
		m.degraded = append(m.degraded, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "edgeguard_limiter_degraded",
			Help:        "1 while the store fails for this reason (timeout, unreachable, credentials, error) and checks are decided by the fail mode; what /readyz reports as degraded.",
			ConstLabels: prometheus.Labels{"reason": r},
		}, func() float64 {
			if h := health(); h.State != Healthy && h.Reason == r {
				return 1
			}
			return 0
		}))
	}
	for s := range m.checks {
		name := Source(s).String()
		if Source(s) == SourceStore {
			name = storeName
		}
		m.checks[s] = checks.WithLabelValues(name)
	}
	m.storeOK, m.storeError = m.storeSeconds.WithLabelValues("ok"), m.storeSeconds.WithLabelValues("error")
	m.fallbacks.WithLabelValues("error")
	m.fallbacks.WithLabelValues("breaker_open")
	m.fallbacks.WithLabelValues("lane_full")
}

// register registers every metric with reg.
func (m *metrics) register(reg prometheus.Registerer, checks *prometheus.CounterVec, evicted func() int64, sent sender) error {
	evictions := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "edgeguard_limiter_fallback_evictions_total",
		Help: "Live keys the fallback store evicted to stay under its size cap (an evicted key forgets its count and errs towards admitting).",
	}, func() float64 { return float64(evicted()) })
	var errs []error
	if sent != nil {
		errs = append(errs,
			reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "edgeguard_limiter_store_calls_total",
				Help: "Script commands sent to Redis to take or refund units: a batch of decisions is one command, a pipeline of n is n. Decisions per call: the rate of edgeguard_limiter_store_call_decisions_total over this one.",
			}, func() float64 { c, _ := sent.Sent(); return float64(c) })),
			reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "edgeguard_limiter_store_call_decisions_total",
				Help: "Script calls (one per key taken or refunded) carried by the commands of edgeguard_limiter_store_calls_total; many per command when batched.",
			}, func() float64 { _, d := sent.Sent(); return float64(d) })))
	}
	for _, c := range []prometheus.Collector{evictions, checks, m.prefilterHits, m.coalesced, m.storeDecided, m.storeSeconds, m.fallbacks, m.breakerState, m.breakersOpen, m.breakerOpens, m.replayed, m.unknown, m.refunds, m.refundErrors, m.releaseRetries, m.releasesDropped, m.releasesResent, m.storeErrors, m.refreshes, m.lifeWaits, m.lateCalls, m.lateGivenBack, m.restores, m.unsure, m.leaseCarves, m.leaseCarved, m.leaseReturned} {
		errs = append(errs, reg.Register(c))
	}
	for _, c := range m.degraded {
		errs = append(errs, reg.Register(c))
	}
	return errors.Join(errs...)
}

func (m *metrics) record(s Source, n int) { m.checks[s].Add(float64(n)) }

// shardLabel names a breaker's shard: a Cluster master's address, or
// "store" for the one breaker of a store that is not sharded (or whose
// slot map is not known yet). Bounded by the number of masters.
func shardLabel(shard string) string {
	if shard == "" {
		return "store"
	}
	return shard
}
