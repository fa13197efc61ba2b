package origin

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

const namespace = "edgeguard_origin_"

// reason is why an origin attempt failed; it is both the errors_total label
// and what decides the status the client sees.
type reason int

const (
	reasonNone reason = iota
	reasonConnect
	reasonTimeout
	reasonBodyTooLarge
	reasonOther
	// reasonNoFreeConns: every connection of the edge's pool to the origin
	// is busy; says nothing about the origin's health.
	reasonNoFreeConns
	// reasonRequestTooLarge and reasonClientBody: the client's streamed
	// body grew past the limit or broke off; not the origin's fault either.
	reasonRequestTooLarge
	reasonClientBody
	// reasonTLS: the TLS handshake failed (an unverifiable certificate,
	// say); like reasonConnect, nothing of the request was sent.
	reasonTLS
	numReasons
)

var reasonNames = [numReasons]string{"", "connect", "timeout", "body_too_large", "other", "no_free_conns", "request_body_too_large", "client_body", "tls"}

func (r reason) String() string { return reasonNames[r] }

// phase is the part of an exchange whose timeout fired (the timeouts_total
// label).
type phase int

const (
	phaseConnect     phase = iota // DialTimeout
	phaseHeader                   // HeaderTimeout: 504
	phaseReadIdle                 // ReadIdleTimeout: the body stopped
	phaseTotal                    // Timeout
	phaseClientWrite              // the client took no bytes for the write timeout
	numPhases
)

var phaseNames = [numPhases]string{"connect", "header", "read_idle", "total", "client_write"}

// statusClasses index responses_total by code/100; index 0 catches codes
// outside 1xx-5xx so a broken origin cannot mint new label values.
var statusClasses = [6]string{"_other", "1xx", "2xx", "3xx", "4xx", "5xx"}

// Metrics are the origin collectors, shared by every pool built on them
// (NewPool): each series carries the pool's name as its pool label. The
// edge builds one Metrics per registry and one Proxy per pool.
type Metrics struct {
	dur       *prometheus.HistogramVec
	errors    *prometheus.CounterVec
	responses *prometheus.CounterVec
	timeouts  *prometheus.CounterVec
	streams   *prometheus.CounterVec
	ejections *prometheus.CounterVec
	late      *prometheus.CounterVec
	healthy   *prometheus.Desc
	// The pools' concurrency limits (Config.Concurrency).
	limitRefused *prometheus.CounterVec
	limit        *prometheus.Desc
	limitFlight  *prometheus.Desc
	limitQueued  *prometheus.Desc

	// pools are the proxies open on these metrics by pool label: the
	// healthy gauge is read from them at scrape time (counting then is
	// never stale, where setting a gauge from racing transitions could
	// be), and a label's series go when its last proxy closes.
	mu    sync.Mutex
	pools map[string]map[*Proxy]struct{}
}

// maxPools bounds the pool label: a pool named after maxPools others are
// open is counted as "_other".
const maxPools = 256

// otherPool is the label of the pools past maxPools.
const otherPool = "_other"

// metrics are one pool's children of Metrics, resolved once at NewPool so
// the request path does no label lookups.
type metrics struct {
	durOK      prometheus.Observer
	durError   prometheus.Observer
	durTimeout prometheus.Observer

	errors    [numReasons]prometheus.Counter
	responses [len(statusClasses)]prometheus.Counter
	timeouts  [numPhases]prometheus.Counter
	streams   [numStreamEnds]prometheus.Counter
	ejections prometheus.Counter
	late      prometheus.Counter
	refused   [numLimitRefusals]prometheus.Counter
}

// limitRefusal is why a pool's concurrency limit refused a request (the
// concurrency_refused_total label).
type limitRefusal int

const (
	limitQueueFull    limitRefusal = iota // at the limit with the queue full (or none)
	limitQueueTimeout                     // waited queue_timeout
	limitGone                             // the client left while it waited
	numLimitRefusals
)

var limitRefusalNames = [numLimitRefusals]string{"queue_full", "queue_timeout", "gone"}

// NewMetrics builds the origin collectors and registers them on reg once,
// for every pool built on them; a nil reg leaves them unregistered but
// working, which tests and tools rely on.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{pools: map[string]map[*Proxy]struct{}{}}
	m.dur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    namespace + "request_duration_seconds",
		Help:    "Time Serve spent on one client request, retries included, by pool and outcome (ok: origin answered; timeout: 504; error: other 502): until the origin's response header is in (and a body of up to 64 KiB with it); a larger body streams afterwards, not counted here.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"pool", "outcome"})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "errors_total",
		Help: "Failed origin attempts by pool and reason (connect; tls: the TLS handshake failed, e.g. an unverifiable certificate; timeout: the response header, or a body of up to 64 KiB read with it; body_too_large: no longer counted, responses stream without a size cap; other; no_free_conns: the edge's own pool was full, answered 503; request_body_too_large, client_body: the client's streamed body); a connect or tls failure retried on another origin is counted too.",
	}, []string{"pool", "reason"})
	m.responses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "responses_total",
		Help: "Responses received from origins by pool and status class; the edge's own 502/504 are not included.",
	}, []string{"pool", "code"})
	m.timeouts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "timeouts_total",
		Help: "Origin exchanges ended by a timeout, by pool and the phase that fired (connect: the dial or TLS handshake; header: the response header was late, 504; read_idle: the origin sent nothing for --origin-read-idle-timeout mid-body; total: --origin-timeout; client_write: the client took nothing for --write-timeout while a body streamed).",
	}, []string{"pool", "phase"})
	m.streams = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "streamed_responses_total",
		Help: "Origin response bodies streamed to the client (larger than 64 KiB or of unknown length), by pool and how they ended (complete; origin_error; client_error; read_idle_timeout; total_timeout; client_write_timeout; shutdown: cut at the end of a drain; unsent: the response was dropped before its body was copied).",
	}, []string{"pool", "end"})
	m.ejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "ejections_total",
		Help: "Origins taken out of rotation by failing real requests (unhealthy_after in a row, or a failed request on probation), by pool; each stays out for its ejection time before a request tries it again.",
	}, []string{"pool"})
	m.late = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "late_connects_total",
		Help: "Origin connections the dial timeout found established although the dial had not yet returned, by pool: used, not counted as connect timeouts. A rising count says the edge's own goroutines run late (CPU starvation, long GC assists), not that origins are slow.",
	}, []string{"pool"})
	m.healthy = prometheus.NewDesc(namespace+"healthy", "Origins currently in rotation, by pool.", []string{"pool"}, nil)
	m.limitRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "concurrency_refused_total",
		Help: "Requests a pool's concurrency limit refused with 503 before they took a worker, by pool and reason (queue_full: at the limit with its queue full or none; queue_timeout: waited the pool's queue_timeout; gone: the client left while it waited).",
	}, []string{"pool", "reason"})
	m.limit = prometheus.NewDesc(namespace+"concurrency_limit", "A pool's concurrency limit in force (the learned one when adaptive), by pool; only pools with a limit.", []string{"pool"}, nil)
	m.limitFlight = prometheus.NewDesc(namespace+"concurrency_in_flight", "A pool's requests in flight under its concurrency limit (critical ones included), by pool; only pools with a limit.", []string{"pool"}, nil)
	m.limitQueued = prometheus.NewDesc(namespace+"concurrency_queued", "Requests waiting in a pool's queue for its concurrency limit (holding no worker), by pool; only pools with a limit.", []string{"pool"}, nil)

	if reg == nil {
		return m, nil
	}
	var regErrs []error
	var done []prometheus.Collector
	for _, c := range []prometheus.Collector{m.dur, m.errors, m.responses, m.timeouts, m.streams, m.ejections, m.late, m.limitRefused, healthyCollector{m}} {
		if err := reg.Register(c); err != nil {
			regErrs = append(regErrs, err)
			continue
		}
		done = append(done, c)
	}
	if err := errors.Join(regErrs...); err != nil {
		// Undo only our own registrations: unregistering a clashing
		// collector would remove the one already there.
		for _, c := range done {
			reg.Unregister(c)
		}
		return nil, fmt.Errorf("registering origin metrics: %w", err)
	}
	return m, nil
}

// open adds p under its pool's label (otherPool past maxPools) and
// returns its label and children.
func (m *Metrics) open(p *Proxy, name string) (string, *metrics) {
	m.mu.Lock()
	label := name
	named := len(m.pools)
	if _, ok := m.pools[otherPool]; ok {
		named--
	}
	if _, ok := m.pools[label]; !ok && named >= maxPools {
		label = otherPool
	}
	if m.pools[label] == nil {
		m.pools[label] = map[*Proxy]struct{}{}
	}
	m.pools[label][p] = struct{}{}
	m.mu.Unlock()

	pm := &metrics{
		durOK:      m.dur.WithLabelValues(label, "ok"),
		durError:   m.dur.WithLabelValues(label, "error"),
		durTimeout: m.dur.WithLabelValues(label, "timeout"),
		ejections:  m.ejections.WithLabelValues(label),
		late:       m.late.WithLabelValues(label),
	}
	for r := reasonConnect; r < numReasons; r++ {
		pm.errors[r] = m.errors.WithLabelValues(label, r.String())
	}
	for i, class := range statusClasses {
		pm.responses[i] = m.responses.WithLabelValues(label, class)
	}
	for ph := range numPhases {
		pm.timeouts[ph] = m.timeouts.WithLabelValues(label, phaseNames[ph])
	}
	for e := range numStreamEnds {
		pm.streams[e] = m.streams.WithLabelValues(label, e.String())
	}
	if p.limit != nil {
		for r := range numLimitRefusals {
			pm.refused[r] = m.limitRefused.WithLabelValues(label, limitRefusalNames[r])
		}
	}
	return label, pm
}

// close removes p; the last proxy of a label takes the label's series
// with it, so pools that come and go leave no series behind. (A stream of
// p still running counts into children no longer exported.)
func (m *Metrics) close(p *Proxy, label string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	set := m.pools[label]
	if _, ok := set[p]; !ok {
		return
	}
	delete(set, p)
	if len(set) > 0 {
		return
	}
	delete(m.pools, label)
	match := prometheus.Labels{"pool": label}
	m.dur.DeletePartialMatch(match)
	m.errors.DeletePartialMatch(match)
	m.responses.DeletePartialMatch(match)
	m.timeouts.DeletePartialMatch(match)
	m.streams.DeletePartialMatch(match)
	m.ejections.DeletePartialMatch(match)
	m.late.DeletePartialMatch(match)
	m.limitRefused.DeletePartialMatch(match)
}

// healthyCollector exports the healthy gauge of every open pool.
type healthyCollector struct{ m *Metrics }

func (c healthyCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.m.healthy
	ch <- c.m.limit
	ch <- c.m.limitFlight
	ch <- c.m.limitQueued
}

// Collect exports the healthy origins and, for pools with a concurrency
// limit, the limit and the requests in flight under it.
func (c healthyCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	for label, set := range c.m.pools {
		n, limit, flight, queued, limited := 0, 0, 0, 0, false
		for p := range set {
			n += p.Healthy()
			if p.limit != nil {
				limited = true
				limit += p.limit.Limit()
				flight += p.limit.InFlight()
				queued += p.limit.Queued()
			}
		}
		ch <- prometheus.MustNewConstMetric(c.m.healthy, prometheus.GaugeValue, float64(n), label)
		if limited {
			ch <- prometheus.MustNewConstMetric(c.m.limit, prometheus.GaugeValue, float64(limit), label)
			ch <- prometheus.MustNewConstMetric(c.m.limitFlight, prometheus.GaugeValue, float64(flight), label)
			ch <- prometheus.MustNewConstMetric(c.m.limitQueued, prometheus.GaugeValue, float64(queued), label)
		}
	}
}

func (m *metrics) response(code int) {
	class := code / 100
	if class < 1 || class > 5 {
		class = 0
	}
	m.responses[class].Inc()
}
