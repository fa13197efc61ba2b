package origin

import (
	"errors"
	"fmt"
	"sync/atomic"

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
	numReasons
)

var reasonNames = [numReasons]string{"", "connect", "timeout", "body_too_large", "other", "no_free_conns", "request_body_too_large", "client_body"}

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

// metrics holds every collector the package exports. Label children are
// resolved once here so the request path does no map lookups.
type metrics struct {
	durOK      prometheus.Observer
	durError   prometheus.Observer
	durTimeout prometheus.Observer

	errors    [numReasons]prometheus.Counter
	responses [len(statusClasses)]prometheus.Counter
	timeouts  [numPhases]prometheus.Counter
	streams   [numStreamEnds]prometheus.Counter

	// proxy is read at scrape time for the healthy gauge: counting then is
	// never stale, where setting a gauge from racing transitions could be.
	proxy atomic.Pointer[Proxy]

	collectors []prometheus.Collector
}

// newMetrics builds the collectors and registers them on reg; a nil reg
// leaves them unregistered but working, which tests and tools rely on.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{}

	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    namespace + "request_duration_seconds",
		Help:    "Time Serve spent on one client request, retries included, by outcome (ok: origin answered; timeout: 504; error: other 502): until the origin's response header is in (and a body of up to 64 KiB with it); a larger body streams afterwards, not counted here.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"outcome"})
	m.durOK = dur.WithLabelValues("ok")
	m.durError = dur.WithLabelValues("error")
	m.durTimeout = dur.WithLabelValues("timeout")

	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "errors_total",
		Help: "Failed origin attempts by reason (connect, timeout: the response header, or a body of up to 64 KiB read with it; body_too_large: no longer counted, responses stream without a size cap; other; no_free_conns: the edge's own pool was full, answered 503; request_body_too_large, client_body: the client's streamed body); a connect failure retried on another origin is counted too.",
	}, []string{"reason"})
	for r := reasonConnect; r < numReasons; r++ {
		m.errors[r] = errs.WithLabelValues(r.String())
	}

	resp := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "responses_total",
		Help: "Responses received from origins by status class; the edge's own 502/504 are not included.",
	}, []string{"code"})
	for i, class := range statusClasses {
		m.responses[i] = resp.WithLabelValues(class)
	}

	timeouts := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "timeouts_total",
		Help: "Origin exchanges ended by a timeout, by the phase that fired (connect: the dial; header: the response header was late, 504; read_idle: the origin sent nothing for --origin-read-idle-timeout mid-body; total: --origin-timeout; client_write: the client took nothing for --write-timeout while a body streamed).",
	}, []string{"phase"})
	for ph := range numPhases {
		m.timeouts[ph] = timeouts.WithLabelValues(phaseNames[ph])
	}

	streams := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "streamed_responses_total",
		Help: "Origin response bodies streamed to the client (larger than 64 KiB or of unknown length), by how they ended (complete; origin_error; client_error; read_idle_timeout; total_timeout; client_write_timeout; shutdown: cut at the end of a drain; unsent: the response was dropped before its body was copied).",
	}, []string{"end"})
	for e := range numStreamEnds {
		m.streams[e] = streams.WithLabelValues(e.String())
	}

	healthy := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: namespace + "healthy",
		Help: "Origins currently in rotation.",
	}, func() float64 {
		if p := m.proxy.Load(); p != nil {
			return float64(p.Healthy())
		}
		return 0
	})

	m.collectors = []prometheus.Collector{dur, errs, resp, timeouts, streams, healthy}
	if reg == nil {
		return m, nil
	}
	var regErrs []error
	var done []prometheus.Collector
	for _, c := range m.collectors {
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

func (m *metrics) response(code int) {
	class := code / 100
	if class < 1 || class > 5 {
		class = 0
	}
	m.responses[class].Inc()
}
